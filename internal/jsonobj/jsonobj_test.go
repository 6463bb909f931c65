package jsonobj

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"
)

// FuzzMembers checks the in-place scanner against encoding/json: for
// every object json.Unmarshal accepts, Members yields the same names with
// the same values (the last of a repeated name), and it never panics.
func FuzzMembers(f *testing.F) {
	for _, seed := range []string{
		`{}`, ` { "a" : 1 , "b":[1,{"c":"]"}] ,"d":"\"}"} `, `{"a":true,"a":false,"e":null,"f":-1.5e3}`,
		`{"\u0061":"\\"}`, `[]`, `"x"`, `{"a":}`, `{"a":1`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var keys, values [][]byte
		err := Members(data, func(key, value []byte) error {
			keys, values = append(keys, key), append(values, value)
			return nil
		})
		var want map[string]json.RawMessage
		if json.Unmarshal(data, &want) != nil || want == nil {
			return // not an object: any answer but a panic will do
		}
		if err != nil {
			t.Fatalf("Members(%s): %v", data, err)
		}
		got := map[string]string{}
		for i, key := range keys {
			var name string
			if json.Unmarshal(key, &name) != nil {
				t.Fatalf("key %s is not a string literal", key)
			}
			got[name] = string(values[i])
		}
		wantS := map[string]string{}
		for k, v := range want {
			wantS[k] = string(v)
		}
		if !maps.Equal(got, wantS) {
			t.Fatalf("Members(%s) = %v, want %v", data, got, wantS)
		}
	})
}

// An object cut off is read up to the cut: the members whole before it,
// then ErrNotObject. A number at the very end is not taken, as the cut may
// have shortened it.
func TestAnObjectCutOffIsReadUpToTheCut(t *testing.T) {
	for _, c := range []struct {
		data string
		want []string // key=value of each member passed
	}{
		{`{"a":1,"b":"x","c":29`, []string{`"a"=1`, `"b"="x"`}},
		{`{"a":1,"b":"x`, []string{`"a"=1`}},
		{`{"a":[1,2`, nil},
		{`{"a":true,`, []string{`"a"=true`}},
	} {
		var got []string
		err := Members([]byte(c.data), func(key, value []byte) error {
			got = append(got, string(key)+"="+string(value))
			return nil
		})
		if !errors.Is(err, ErrNotObject) || !slices.Equal(got, c.want) {
			t.Errorf("Members(%s): %q, %v; want %q, ErrNotObject", c.data, got, err, c.want)
		}
	}
}
