package cluster

import "testing"

// The majority is the hash most alive Edges have; without one (a tie)
// every alive Edge differs while they do not all agree; dead Edges do not
// vote.
func TestMajorityHash(t *testing.T) {
	m := func(hash string, alive bool) Member { return Member{ConfigHash: hash, Alive: alive} }
	for _, tc := range []struct {
		name     string
		members  []Member
		majority string
		agreed   bool
	}{
		{"alone", []Member{m("x", true)}, "", true},
		{"all agree", []Member{m("x", true), m("x", true), m("x", true)}, "", true},
		{"one differs", []Member{m("x", true), m("y", true), m("x", true)}, "x", false},
		{"a tie", []Member{m("x", true), m("y", true)}, "", false},
		{"the dead do not vote", []Member{m("x", true), m("y", false), m("y", false)}, "", true},
	} {
		majority, agreed := majorityHash(tc.members)
		if majority != tc.majority || agreed != tc.agreed {
			t.Errorf("%s: majority %q agreed %v, want %q %v", tc.name, majority, agreed, tc.majority, tc.agreed)
		}
	}
}
