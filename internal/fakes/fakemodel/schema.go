package fakemodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// ErrSchema is the error of a schema Generate cannot satisfy or read.
var ErrSchema = errors.New("fakemodel: unusable JSON schema")

// Fill says how Generate fills the values a schema leaves open.
type Fill struct {
	// Words are the strings drawn, in turn, for string values (default:
	// the NATO alphabet), so that an answer is deterministic and reads as
	// the model's own.
	Words []string
	// Optional includes properties the schema does not require (up to a
	// few levels deep, so a recursive schema stays finite). Structured
	// outputs fill them, as a model asked for a document would; tool-call
	// arguments leave them out, as a model calling a tool does.
	Optional bool
	// Command, when set, is the value of a property named "command" or
	// "cmd" (included even when optional): the string itself, or, for an
	// array of strings, Shell followed by it.
	Command string
	Shell   []string
}

// maxDepth bounds how deep Generate follows a schema: past it only a
// recursive schema that requires itself can be, and it has no finite
// instance.
const maxDepth = 32

// optionalDepth is how deep Fill.Optional fills optional properties.
const optionalDepth = 4

var defaultWords = []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"}

// Generate returns a JSON value that conforms to schema: object properties
// in the schema's order (the required ones, and the others when
// fill.Optional), a string (a word, or a value of its format), a number or
// integer within its bounds, true, the first of an enum, a const, the first
// branch of anyOf/oneOf, allOf merged, $ref resolved within the schema, an
// array of minItems (at least one) items. Keywords it does not read
// (pattern, not, if/then/else, dependent schemas) are not honoured: the
// fakes need answers of the right shape, not a validator.
//
// The value comes back as a Value, which writes itself compact (tool-call
// arguments) or spaced as a model writes JSON (Ollama's content).
func Generate(schema json.RawMessage, fill Fill) (Value, error) {
	if len(fill.Words) == 0 {
		fill.Words = defaultWords
	}
	g := &generator{root: schema, fill: fill}
	v, err := g.value(schema, 0, "")
	if err != nil {
		return Value{}, err
	}
	return Value{v: v}, nil
}

type generator struct {
	root  json.RawMessage
	fill  Fill
	words int // next word to draw
}

// schemaObject is a schema's keywords, each still raw.
type schemaObject map[string]json.RawMessage

func (g *generator) value(raw json.RawMessage, depth int, name string) (node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d (a schema that requires itself?)", ErrSchema, maxDepth)
	}
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "", "true": // any value
		return g.word(), nil
	case "false":
		return nil, fmt.Errorf("%w: schema false admits no value", ErrSchema)
	}
	var s schemaObject
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%w: %s is not a schema object", ErrSchema, clip(raw))
	}
	if ref, ok := s.str("$ref"); ok {
		target, err := g.resolve(ref)
		if err != nil {
			return nil, err
		}
		return g.value(target, depth+1, name)
	}
	if c, ok := s["const"]; ok {
		return compactRaw(c)
	}
	if e, ok := s["enum"]; ok {
		var list []json.RawMessage
		if json.Unmarshal(e, &list) != nil || len(list) == 0 {
			return nil, fmt.Errorf("%w: enum must be a non-empty array", ErrSchema)
		}
		return compactRaw(list[0])
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches, ok := s[k]; ok {
			var list []json.RawMessage
			if json.Unmarshal(branches, &list) != nil || len(list) == 0 {
				return nil, fmt.Errorf("%w: %s must be a non-empty array", ErrSchema, k)
			}
			return g.value(list[0], depth+1, name)
		}
	}
	if all, ok := s["allOf"]; ok {
		merged, err := g.mergeAllOf(s, all)
		if err != nil {
			return nil, err
		}
		s = merged
	}
	if g.fill.Command != "" && (name == "command" || name == "cmd") {
		if n, ok := g.command(s); ok {
			return n, nil
		}
	}
	switch typ := s.typ(); typ {
	case "object":
		return g.object(s, depth)
	case "array":
		return g.array(s, depth)
	case "string":
		return g.str(s), nil
	case "integer", "number":
		return number(s, typ == "integer")
	case "boolean":
		return boolNode(true), nil
	case "null":
		return nullNode{}, nil
	default:
		return nil, fmt.Errorf("%w: unknown type %q", ErrSchema, typ)
	}
}

// typ is the schema's type: the first that is not "null" when it lists
// several, else what its keywords imply, else "string".
func (s schemaObject) typ() string {
	if t, ok := s.str("type"); ok {
		return t
	}
	var list []string
	if json.Unmarshal(s["type"], &list) == nil && len(list) > 0 {
		for _, t := range list {
			if t != "null" {
				return t
			}
		}
		return "null"
	}
	switch {
	case s.has("properties", "required", "additionalProperties", "minProperties"):
		return "object"
	case s.has("items", "prefixItems", "minItems", "maxItems"):
		return "array"
	case s.has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
		return "number"
	}
	return "string"
}

func (s schemaObject) has(keys ...string) bool {
	for _, k := range keys {
		if _, ok := s[k]; ok {
			return true
		}
	}
	return false
}

func (s schemaObject) str(key string) (string, bool) {
	var v string
	if raw, ok := s[key]; ok && json.Unmarshal(raw, &v) == nil {
		return v, true
	}
	return "", false
}

func (s schemaObject) num(key string) (float64, bool) {
	var v float64
	if raw, ok := s[key]; ok && json.Unmarshal(raw, &v) == nil {
		return v, true
	}
	return 0, false
}

func (s schemaObject) integer(key string) (int, bool) {
	v, ok := s.num(key)
	return int(v), ok && v >= 0
}

func (g *generator) object(s schemaObject, depth int) (node, error) {
	keys, err := orderedKeys(s["properties"])
	if err != nil {
		return nil, err
	}
	var props map[string]json.RawMessage
	_ = json.Unmarshal(s["properties"], &props)
	var required []string
	_ = json.Unmarshal(s["required"], &required)
	// Required properties the schema does not describe come after the
	// described ones: any value will do.
	for _, r := range required {
		if !slices.Contains(keys, r) {
			keys = append(keys, r)
		}
	}
	out := objectNode{}
	for _, k := range keys {
		isCommand := g.fill.Command != "" && (k == "command" || k == "cmd")
		if !slices.Contains(required, k) && !isCommand && (!g.fill.Optional || depth >= optionalDepth) {
			continue
		}
		v, err := g.value(props[k], depth+1, k)
		if err != nil {
			return nil, err
		}
		out = append(out, member{k, v})
	}
	return out, nil
}

func (g *generator) array(s schemaObject, depth int) (node, error) {
	var prefix []json.RawMessage
	_ = json.Unmarshal(s["prefixItems"], &prefix)
	n := max(1, len(prefix))
	if lo, ok := s.integer("minItems"); ok {
		n = max(n, lo)
	}
	if hi, ok := s.integer("maxItems"); ok {
		n = min(n, hi)
	}
	out := arrayNode{}
	for i := range n {
		item := s["items"]
		if i < len(prefix) {
			item = prefix[i]
		}
		v, err := g.value(item, depth+1, "")
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// command fills a command parameter: the command itself for a string, the
// shell's argv and the command for an array of strings.
func (g *generator) command(s schemaObject) (node, bool) {
	switch s.typ() {
	case "string":
		return stringNode(g.fill.Command), true
	case "array":
		var items schemaObject
		if json.Unmarshal(s["items"], &items) != nil || items.typ() == "string" {
			argv := arrayNode{}
			for _, a := range g.fill.Shell {
				argv = append(argv, stringNode(a))
			}
			return append(argv, stringNode(g.fill.Command)), true
		}
	}
	return nil, false
}

// formats are values for the string formats a schema may name.
var formats = map[string]string{
	"date-time":     "2025-01-01T00:00:00Z",
	"date":          "2025-01-01",
	"time":          "00:00:00Z",
	"duration":      "PT1S",
	"email":         "alpha@example.com",
	"idn-email":     "alpha@example.com",
	"hostname":      "example.com",
	"idn-hostname":  "example.com",
	"ipv4":          "192.0.2.1",
	"ipv6":          "2001:db8::1",
	"uri":           "https://example.com/alpha",
	"iri":           "https://example.com/alpha",
	"uri-reference": "https://example.com/alpha",
	"url":           "https://example.com/alpha",
	"uuid":          "00000000-0000-4000-8000-000000000000",
	"json-pointer":  "/alpha",
}

func (g *generator) str(s schemaObject) node {
	v := string(g.word())
	if f, ok := s.str("format"); ok {
		if fv, ok := formats[f]; ok {
			v = fv
		}
	}
	if lo, ok := s.integer("minLength"); ok && len([]rune(v)) < lo {
		v += strings.Repeat("x", lo-len([]rune(v)))
	}
	if hi, ok := s.integer("maxLength"); ok && len([]rune(v)) > hi {
		v = string([]rune(v)[:hi])
	}
	return stringNode(v)
}

func (g *generator) word() stringNode {
	w := g.fill.Words[g.words%len(g.fill.Words)]
	g.words++
	return stringNode(w)
}

// number picks 1 (an integer) or 1.5 when within the schema's bounds, else
// the bound itself, or a value between the bounds when they are open.
func number(s schemaObject, integer bool) (node, error) {
	lo, loOpen := bound(s, "minimum", "exclusiveMinimum", math.Inf(-1), math.Max)
	hi, hiOpen := bound(s, "maximum", "exclusiveMaximum", math.Inf(1), math.Min)
	if integer {
		// The integers within: [ceil(lo), floor(hi)], one in from an open
		// bound that is itself an integer.
		l, h := math.Ceil(lo), math.Floor(hi)
		if loOpen && l == lo {
			l++
		}
		if hiOpen && h == hi {
			h--
		}
		lo, hi, loOpen, hiOpen = l, h, false, false
	}
	above := func(x float64) bool { return x > lo || (!loOpen && x == lo) }
	below := func(x float64) bool { return x < hi || (!hiOpen && x == hi) }
	v := 1.5
	if integer {
		v = 1
	}
	switch {
	case above(v) && below(v):
	case !above(v) && !loOpen:
		v = lo
	case !below(v) && !hiOpen:
		v = hi
	case !math.IsInf(lo, 0) && !math.IsInf(hi, 0):
		v = lo + (hi-lo)/2
	case !above(v):
		v = lo + 1
	default:
		v = hi - 1
	}
	if m, ok := s.num("multipleOf"); ok && m > 0 {
		v = math.Ceil(v/m) * m
	}
	if !above(v) || !below(v) {
		return nil, fmt.Errorf("%w: no number within its bounds", ErrSchema)
	}
	if integer {
		return numberNode(strconv.FormatInt(int64(v), 10)), nil
	}
	return numberNode(strconv.FormatFloat(v, 'f', -1, 64)), nil
}

// bound reads one side of a number's range: the inclusive keyword, and the
// exclusive one either as a number (draft 6 on) or as true beside the
// inclusive one (draft 4). tighter picks the stricter of two.
func bound(s schemaObject, inclusive, exclusive string, none float64, tighter func(a, b float64) float64) (float64, bool) {
	v, open := none, false
	if x, ok := s.num(inclusive); ok {
		v = x
		var draft4 bool
		if json.Unmarshal(s[exclusive], &draft4) == nil && draft4 {
			open = true
		}
	}
	if x, ok := s.num(exclusive); ok && tighter(x, v) == x {
		v, open = x, true
	}
	return v, open
}

// mergeAllOf folds allOf's schemas into s: properties and required are
// joined, other keywords taken from the first schema that has them.
func (g *generator) mergeAllOf(s schemaObject, all json.RawMessage) (schemaObject, error) {
	var list []json.RawMessage
	if json.Unmarshal(all, &list) != nil {
		return nil, fmt.Errorf("%w: allOf must be an array", ErrSchema)
	}
	out := schemaObject{}
	for k, v := range s {
		if k != "allOf" {
			out[k] = v
		}
	}
	var props []member // raw property schemas, in order
	var required []string
	addProps := func(sub schemaObject) error {
		keys, err := orderedKeys(sub["properties"])
		if err != nil {
			return err
		}
		var m map[string]json.RawMessage
		_ = json.Unmarshal(sub["properties"], &m)
		for _, k := range keys {
			props = append(props, member{k, rawNode(m[k])})
		}
		var req []string
		_ = json.Unmarshal(sub["required"], &req)
		required = append(required, req...)
		return nil
	}
	if err := addProps(s); err != nil {
		return nil, err
	}
	for _, raw := range list {
		var sub schemaObject
		if json.Unmarshal(raw, &sub) != nil {
			return nil, fmt.Errorf("%w: allOf holds %s", ErrSchema, clip(raw))
		}
		for ref, ok := sub.str("$ref"); ok; ref, ok = sub.str("$ref") {
			target, err := g.resolve(ref)
			if err != nil {
				return nil, err
			}
			sub = nil
			if json.Unmarshal(target, &sub) != nil {
				return nil, fmt.Errorf("%w: %s is not a schema object", ErrSchema, ref)
			}
		}
		if err := addProps(sub); err != nil {
			return nil, err
		}
		for k, v := range sub {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
	}
	if len(props) > 0 {
		var b bytes.Buffer
		objectNode(props).write(&b, false)
		out["properties"] = b.Bytes()
	}
	if len(required) > 0 {
		out["required"], _ = json.Marshal(required)
	}
	return out, nil
}

// resolve finds a local $ref ("#", "#/$defs/Name", any JSON pointer into
// the root schema).
func (g *generator) resolve(ref string) (json.RawMessage, error) {
	pointer, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, fmt.Errorf("%w: $ref %q is not within the schema", ErrSchema, ref)
	}
	cur := g.root
	if pointer == "" {
		return cur, nil
	}
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		tok, err := url.PathUnescape(tok)
		if err != nil {
			return nil, fmt.Errorf("%w: $ref %q: %v", ErrSchema, ref, err)
		}
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		var obj map[string]json.RawMessage
		var arr []json.RawMessage
		switch {
		case json.Unmarshal(cur, &obj) == nil:
			next, ok := obj[tok]
			if !ok {
				return nil, fmt.Errorf("%w: $ref %q: no %q", ErrSchema, ref, tok)
			}
			cur = next
		case json.Unmarshal(cur, &arr) == nil:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(arr) {
				return nil, fmt.Errorf("%w: $ref %q: no item %q", ErrSchema, ref, tok)
			}
			cur = arr[i]
		default:
			return nil, fmt.Errorf("%w: $ref %q: cannot descend into %s", ErrSchema, ref, clip(cur))
		}
	}
	return cur, nil
}
