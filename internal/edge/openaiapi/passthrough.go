package openaiapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/jsonobj"
)

// Pass-through (SPEC P2): the top-level fields of a chat request that the
// Edge does not interpret travel with the run, in RunOptions.extra_json,
// for the Node's adapter to give the model server. Their number is bounded
// (MaxExtraFields) as the body is scanned; their size only by the frame
// the run must fit.

// interpreted are the top-level fields of a chat request that the Edge
// reads (chatRequest's) or that belong to its own contract with the
// client; every other field passes through to the provider. encoding/json
// matches field names without regard to case, so these are matched the
// same way: "Temperature" is read as temperature and is not passed on.
var interpreted = [...]string{
	"model", "messages", "tools", "stream", "stream_options", "temperature", "top_p", "max_tokens",
	"max_completion_tokens", "stop", "seed", "n", "response_format", "reasoning_effort", "tool_choice",
	"web_search_options",
}

// extraFields returns the top-level fields of the chat request body that
// the Edge does not interpret, as one compact JSON object with sorted keys
// and the client's values, or nil when there are none (SPEC P2). A field
// whose value is null is left out: null asks for the default, which not
// sending it gives. A repeated field keeps its last value, as decoding
// does. body must be a JSON object that json.Unmarshal has accepted.
//
// The body is scanned in place: values are sliced from it, not decoded,
// so that the fields the Edge decoded (messages) cost nothing more here.
func extraFields(body []byte) ([]byte, *frontend.Failure) {
	return extraFieldsExcept(body, interpreted[:])
}

// extraFieldsExcept is extraFields for a request of another API, whose
// top-level fields the Edge interprets are interpreted (matched without
// regard to case, as encoding/json matches them).
func extraFieldsExcept(body []byte, interpreted []string) ([]byte, *frontend.Failure) {
	return extraFieldsWith(body, interpreted, nil)
}

// extraFieldsWith is extraFieldsExcept with the fields of mapped added: a
// field the Edge read elsewhere in the request and passes on under the
// name an OpenAI-compatible server knows it by (the Responses API's
// text.verbosity as verbosity). A top-level field of the same name that
// the client sent wins.
func extraFieldsWith(body []byte, interpreted []string, mapped map[string][]byte) ([]byte, *frontend.Failure) {
	fields := map[string][]byte{}
	err := jsonobj.Members(body, func(key, value []byte) error {
		name, ok := unquote(key)
		if !ok {
			return jsonobj.ErrNotObject
		}
		for _, known := range interpreted {
			if strings.EqualFold(name, known) {
				return nil
			}
		}
		if bytes.Equal(value, []byte("null")) {
			delete(fields, name)
			return nil
		}
		if _, seen := fields[name]; !seen && len(fields) == MaxExtraFields {
			return &frontdoor.ListTooLong{Param: "fields", Max: MaxExtraFields}
		}
		fields[name] = value
		return nil
	})
	var le *frontdoor.ListTooLong
	switch {
	case errors.As(err, &le):
		return nil, invalid("", "Too many request fields that the Edge passes to the model server: at most %d are accepted.", le.Max)
	case err != nil:
		return nil, jsonError(err)
	}
	for name, value := range mapped {
		if _, sent := fields[name]; !sent {
			fields[name] = value
		}
	}
	if len(fields) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	var out bytes.Buffer
	out.WriteByte('{')
	for i, name := range names {
		if i > 0 {
			out.WriteByte(',')
		}
		k, _ := json.Marshal(name) // a string always marshals
		out.Write(k)
		out.WriteByte(':')
		if err := json.Compact(&out, fields[name]); err != nil {
			return nil, jsonError(err)
		}
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}

// unquote returns the string of the JSON string literal lit, as
// encoding/json reads it (invalid UTF-8 becomes U+FFFD).
func unquote(lit []byte) (string, bool) {
	if len(lit) >= 2 && bytes.IndexByte(lit, '\\') < 0 && utf8.Valid(lit) {
		return string(lit[1 : len(lit)-1]), true
	}
	var s string
	return s, json.Unmarshal(lit, &s) == nil
}
