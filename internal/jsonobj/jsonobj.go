// Package jsonobj reads the members of a JSON object where they lie, in
// order, without decoding the object or allocating: what a relay needs to
// pass a body's other members through untouched (openaiapi), or to find
// one member in a provider's line once per answer (ollamaapi), where
// encoding/json would decode everything, or, read a token at a time,
// allocate an error for every value.
package jsonobj

import "errors"

// ErrNotObject is Members' error for data that is not a JSON object, or
// one cut off before its end.
var ErrNotObject = errors.New("not a JSON object")

// Members calls f with the key (a JSON string literal, quotes included)
// and the value of each member of the JSON object data, in order, slicing
// both from data; it stops at f's first error and returns it. Data that is
// not a JSON object, or an object cut off, ends it with ErrNotObject, after
// f has seen the members whole before that point (the head of a long line
// can be read up to where it was cut); never a panic. Values are delimited,
// not checked: a caller compares or parses the ones it reads, and data
// json.Unmarshal accepts is read exactly as it reads it (FuzzMembers).
func Members(data []byte, f func(key, value []byte) error) error {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return ErrNotObject
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return nil
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return ErrNotObject
		}
		start := i
		if i = skipString(data, i); i < 0 {
			return ErrNotObject
		}
		key := data[start:i]
		if i = skipSpace(data, i); i >= len(data) || data[i] != ':' {
			return ErrNotObject
		}
		start = skipSpace(data, i+1)
		if i = skipValue(data, start); i < 0 {
			return ErrNotObject
		}
		if err := f(key, data[start:i]); err != nil {
			return err
		}
		if i = skipSpace(data, i); i >= len(data) {
			return ErrNotObject
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return nil
		default:
			return ErrNotObject
		}
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipString returns the index after the string literal at data[i], or -1.
func skipString(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the JSON value at data[i], or -1 when
// data ends first. A number, true, false or null runs up to the next
// delimiter, which must be there: a number at the very end of data may
// have been cut.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				if i = skipString(data, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	j := i
	for j < len(data) && !isDelimiter(data[j]) {
		j++
	}
	if j == i || j == len(data) {
		return -1
	}
	return j
}

func isDelimiter(c byte) bool { return c == ',' || c == '}' || c == ']' || isSpace(c) }
