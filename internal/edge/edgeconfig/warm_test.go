package edgeconfig

import "testing"

// Issue 23: warm-first routing is on unless scheduling.warm_first says
// false.
func TestWarmFirstIsOnByDefault(t *testing.T) {
	for _, tc := range []struct {
		file string
		want bool
	}{
		{loopbackFile, true},
		{loopbackFile + "scheduling:\n  warm_first: true\n", true},
		{loopbackFile + "scheduling:\n  warm_first: false\n", false},
	} {
		c, err := Parse([]byte(tc.file))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.WarmFirst(); got != tc.want {
			t.Errorf("%q: WarmFirst %v, want %v", tc.file, got, tc.want)
		}
	}
}
