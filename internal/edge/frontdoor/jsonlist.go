package frontdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// ListTooLong is a JSON array with more elements than its bound.
type ListTooLong struct {
	Param string // the array's name, as the client wrote it
	Max   int
}

func (e *ListTooLong) Error() string { return fmt.Sprintf("%s: more than %d elements", e.Param, e.Max) }

// DecodeList decodes the JSON array data into a slice, refusing it with a
// *ListTooLong at the element after the max-th: the slice never grows past
// max, whatever the array holds, so a body of a million empty objects
// costs no more than max of them (P3). null is an empty list. A type error
// names the element ("messages[3].role"), as a decode of the whole body
// would.
func DecodeList[T any](data []byte, max int, param string) ([]T, error) {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		var zero []T
		return nil, &json.UnmarshalTypeError{Value: "non-array", Type: reflect.TypeOf(zero), Field: param}
	}
	var out []T
	for dec.More() {
		if len(out) == max {
			return nil, &ListTooLong{Param: param, Max: max}
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				te.Field = strings.TrimSuffix(fmt.Sprintf("%s[%d].%s", param, len(out), te.Field), ".")
			}
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// FieldPath is the path of the field a type error names, as the client
// wrote it ("messages[3].role"). encoding/json prefixes the name of the
// struct field that holds a list to the path the list's own decoder
// (DecodeList) already gave ("messages.messages[3].role"); the repeat is
// dropped.
func FieldPath(te *json.UnmarshalTypeError) string {
	f := te.Field
	if i := strings.IndexByte(f, '.'); i > 0 && strings.HasPrefix(f[i+1:], f[:i]+"[") {
		return f[i+1:]
	}
	return f
}
