package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Value is a generated JSON value (see Generate), kept as a tree so that
// it writes itself in the schema's property order.
type Value struct{ v node }

// Compact is the value as compact JSON.
func (v Value) Compact() json.RawMessage {
	var b bytes.Buffer
	v.v.write(&b, false)
	return b.Bytes()
}

// Spaced is the value as JSON with a space after every ':' and ',', as
// models (and Python's json.dumps) write it.
func (v Value) Spaced() string {
	var b bytes.Buffer
	v.v.write(&b, true)
	return b.String()
}

// node is one generated JSON value.
type node interface {
	write(b *bytes.Buffer, spaced bool)
}

type (
	rawNode    json.RawMessage // const, enum: compact JSON
	stringNode string
	numberNode string // already formatted
	boolNode   bool
	nullNode   struct{}
	arrayNode  []node
	objectNode []member
	member     struct {
		key string
		val node
	}
)

func (n rawNode) write(b *bytes.Buffer, _ bool) { b.Write(n) }
func (n stringNode) write(b *bytes.Buffer, _ bool) {
	s, _ := json.Marshal(string(n))
	b.Write(s)
}
func (n numberNode) write(b *bytes.Buffer, _ bool) { b.WriteString(string(n)) }
func (n boolNode) write(b *bytes.Buffer, _ bool)   { b.WriteString(strconv.FormatBool(bool(n))) }
func (nullNode) write(b *bytes.Buffer, _ bool)     { b.WriteString("null") }

func (n arrayNode) write(b *bytes.Buffer, spaced bool) {
	b.WriteByte('[')
	for i, v := range n {
		if i > 0 {
			sep(b, ',', spaced)
		}
		v.write(b, spaced)
	}
	b.WriteByte(']')
}

func (n objectNode) write(b *bytes.Buffer, spaced bool) {
	b.WriteByte('{')
	for i, m := range n {
		if i > 0 {
			sep(b, ',', spaced)
		}
		stringNode(m.key).write(b, spaced)
		sep(b, ':', spaced)
		m.val.write(b, spaced)
	}
	b.WriteByte('}')
}

func sep(b *bytes.Buffer, c byte, spaced bool) {
	b.WriteByte(c)
	if spaced {
		b.WriteByte(' ')
	}
}

// orderedKeys returns the keys of a JSON object in the order written (nil
// for an absent or null one): a model writes properties in the schema's
// order, which a Go map forgets.
func orderedKeys(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("%w: properties must be an object, not %s", ErrSchema, clip(raw))
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: properties: %v", ErrSchema, err)
		}
		keys = append(keys, t.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, fmt.Errorf("%w: properties: %v", ErrSchema, err)
		}
	}
	return keys, nil
}

func compactRaw(raw json.RawMessage) (node, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	return rawNode(b.Bytes()), nil
}

// clip shortens raw for an error message.
func clip(raw []byte) string {
	const n = 60
	if len(raw) > n {
		return string(raw[:n]) + "…"
	}
	return string(raw)
}
