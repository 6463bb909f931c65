package fakemodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestGenerateWritesTheSchemasShape(t *testing.T) {
	cases := []struct {
		name, schema string
		fill         Fill
		want         string
	}{
		{"string", `{"type":"string"}`, Fill{}, `"alpha"`},
		{"words are the model's", `{"type":"string"}`, Fill{Words: []string{"river"}}, `"river"`},
		{"integer", `{"type":"integer"}`, Fill{}, `1`},
		{"number", `{"type":"number"}`, Fill{}, `1.5`},
		{"boolean", `{"type":"boolean"}`, Fill{}, `true`},
		{"null", `{"type":"null"}`, Fill{}, `null`},
		{"nullable picks the type", `{"type":["null","integer"]}`, Fill{}, `1`},
		{"enum", `{"enum":["celsius","fahrenheit"]}`, Fill{}, `"celsius"`},
		{"const", `{"const":{"a": [1, 2]}}`, Fill{}, `{"a":[1,2]}`},
		{"anyOf takes the first", `{"anyOf":[{"type":"integer"},{"type":"string"}]}`, Fill{}, `1`},
		{"oneOf takes the first", `{"oneOf":[{"type":"boolean"},{"type":"string"}]}`, Fill{}, `true`},
		{"minimum", `{"type":"integer","minimum":10}`, Fill{}, `10`},
		{"exclusive bounds", `{"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":5}`, Fill{}, `2`},
		{"draft 4 exclusive", `{"type":"number","minimum":2,"exclusiveMinimum":true,"maximum":4}`, Fill{}, `3`},
		{"maximum", `{"type":"number","maximum":-3}`, Fill{}, `-3`},
		{"multipleOf", `{"type":"integer","minimum":3,"multipleOf":5}`, Fill{}, `5`},
		{"format", `{"type":"string","format":"date-time"}`, Fill{}, `"2025-01-01T00:00:00Z"`},
		{"minLength", `{"type":"string","minLength":8}`, Fill{}, `"alphaxxx"`},
		{"maxLength", `{"type":"string","maxLength":3}`, Fill{}, `"alp"`},
		{"array", `{"type":"array","items":{"type":"integer"},"minItems":2}`, Fill{}, `[1,1]`},
		{"empty array allowed", `{"type":"array","maxItems":0}`, Fill{}, `[]`},
		{"prefixItems", `{"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}]}`, Fill{}, `["alpha",true]`},
		{"required only", `{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}},"required":["a"]}`, Fill{}, `{"a":1}`},
		{"optional in order", `{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}},"required":["a"]}`,
			Fill{Optional: true}, `{"b":"alpha","a":1}`},
		{"required but undescribed", `{"type":"object","required":["x"]}`, Fill{}, `{"x":"alpha"}`},
		{"no type, properties", `{"properties":{"k":{"type":"boolean"}},"required":["k"]}`, Fill{}, `{"k":true}`},
		{"$ref to $defs", `{"$defs":{"P":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}},"$ref":"#/$defs/P"}`,
			Fill{}, `{"n":1}`},
		{"allOf merged", `{"allOf":[{"properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"boolean"}},"required":["b"]}]}`,
			Fill{}, `{"a":1,"b":true}`},
		{"command string", `{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number"}},"required":["command"]}`,
			Fill{Command: "echo hi", Shell: []string{"bash", "-lc"}}, `{"command":"echo hi"}`},
		{"command argv", `{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}}}`,
			Fill{Command: "echo hi", Shell: []string{"bash", "-lc"}}, `{"command":["bash","-lc","echo hi"]}`},
		{"cmd optional still given", `{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"}}}`,
			Fill{Command: "ls"}, `{"cmd":"ls"}`},
		{"any value", `true`, Fill{}, `"alpha"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Generate(json.RawMessage(tc.schema), tc.fill)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(v.Compact()); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
			if err := conforms(json.RawMessage(tc.schema), json.RawMessage(tc.schema), v.Compact()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A structured-output schema as Pydantic writes it (what Instructor and
// LangChain send): $defs, Optional as anyOf with null, enums, nested
// arrays of objects, formats and bounds. The value conforms, written as a
// model writes JSON.
func TestGenerateConformsToAPydanticSchema(t *testing.T) {
	schema := json.RawMessage(`{
		"$defs": {
			"Unit": {"enum": ["celsius", "fahrenheit"], "type": "string"},
			"Reading": {"type": "object", "properties": {
				"at": {"type": "string", "format": "date-time"},
				"value": {"type": "number", "minimum": -90, "maximum": 60},
				"unit": {"$ref": "#/$defs/Unit"}
			}, "required": ["at", "value", "unit"]}
		},
		"type": "object",
		"properties": {
			"city": {"type": "string", "minLength": 2},
			"country": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
			"readings": {"type": "array", "items": {"$ref": "#/$defs/Reading"}, "minItems": 2},
			"stations": {"type": "integer", "exclusiveMinimum": 0},
			"ok": {"type": "boolean"}
		},
		"required": ["city", "readings", "stations"]
	}`)
	for _, optional := range []bool{false, true} {
		v, err := Generate(schema, Fill{Optional: optional, Words: []string{"Paris", "France"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := conforms(schema, schema, v.Compact()); err != nil {
			t.Fatalf("optional=%v: %s: %v", optional, v.Compact(), err)
		}
		var back any
		if err := json.Unmarshal([]byte(v.Spaced()), &back); err != nil || !strings.Contains(v.Spaced(), `"city": "Paris", `) {
			t.Fatalf("spaced %s: %v", v.Spaced(), err)
		}
		if has := strings.Contains(v.Spaced(), `"ok"`); has != optional {
			t.Errorf("optional=%v: %s", optional, v.Spaced())
		}
	}
}

func TestGenerateRecursiveSchemaStaysFinite(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},
		"children":{"type":"array","items":{"$ref":"#"}}},"required":["name"]}`)
	v, err := Generate(schema, Fill{Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := conforms(schema, schema, v.Compact()); err != nil {
		t.Fatal(err)
	}
}

func TestGenerateRefusesUnusableSchemas(t *testing.T) {
	for _, schema := range []string{
		`false`,
		`"json"`,
		`{"$ref":"#/$defs/Missing"}`,
		`{"$ref":"https://example.com/schema"}`,
		`{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}`,
		`{"type":"integer","minimum":3,"maximum":2}`,
		`{"type":"date"}`,
		`{"enum":[]}`,
		`{"type":"object","properties":[1]}`,
	} {
		if _, err := Generate(json.RawMessage(schema), Fill{}); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: %v, want ErrSchema", schema, err)
		}
	}
}

// conforms checks value against the keywords Generate reads: the test's
// own small validator, written independently of the generator.
func conforms(root, schema, value json.RawMessage) error {
	if s := strings.TrimSpace(string(schema)); s == "true" || s == "" {
		return nil
	}
	var s map[string]json.RawMessage
	if err := json.Unmarshal(schema, &s); err != nil {
		return err
	}
	if ref, ok := s["$ref"]; ok {
		var r string
		_ = json.Unmarshal(ref, &r)
		target := root
		for _, tok := range strings.Split(strings.TrimPrefix(r, "#"), "/")[1:] {
			var m map[string]json.RawMessage
			_ = json.Unmarshal(target, &m)
			target = m[tok]
		}
		return conforms(root, target, value)
	}
	var v any
	if err := json.Unmarshal(value, &v); err != nil {
		return err
	}
	if c, ok := s["const"]; ok {
		var want any
		_ = json.Unmarshal(c, &want)
		if fmt.Sprint(want) != fmt.Sprint(v) {
			return fmt.Errorf("%s is not the const %s", value, c)
		}
	}
	if e, ok := s["enum"]; ok {
		var list []any
		_ = json.Unmarshal(e, &list)
		if !slices.ContainsFunc(list, func(x any) bool { return fmt.Sprint(x) == fmt.Sprint(v) }) {
			return fmt.Errorf("%s not in enum %s", value, e)
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if raw, ok := s[k]; ok {
			var list []json.RawMessage
			_ = json.Unmarshal(raw, &list)
			if !slices.ContainsFunc(list, func(b json.RawMessage) bool { return conforms(root, b, value) == nil }) {
				return fmt.Errorf("%s matches no branch of %s", value, k)
			}
		}
	}
	if raw, ok := s["allOf"]; ok {
		var list []json.RawMessage
		_ = json.Unmarshal(raw, &list)
		for _, b := range list {
			if err := conforms(root, b, value); err != nil {
				return err
			}
		}
	}
	var types []string
	if json.Unmarshal(s["type"], &types) != nil {
		var one string
		if json.Unmarshal(s["type"], &one) == nil {
			types = []string{one}
		}
	}
	if len(types) > 0 && !slices.Contains(types, typeOf(v)) && !(typeOf(v) == "integer" && slices.Contains(types, "number")) {
		return fmt.Errorf("%s is %s, want %v", value, typeOf(v), types)
	}
	num := func(k string) (float64, bool) {
		var f float64
		err := json.Unmarshal(s[k], &f)
		return f, s[k] != nil && err == nil
	}
	switch x := v.(type) {
	case float64:
		if m, ok := num("minimum"); ok && x < m {
			return fmt.Errorf("%v < minimum %v", x, m)
		}
		if m, ok := num("maximum"); ok && x > m {
			return fmt.Errorf("%v > maximum %v", x, m)
		}
		if m, ok := num("exclusiveMinimum"); ok && x <= m {
			return fmt.Errorf("%v <= exclusiveMinimum %v", x, m)
		}
		if m, ok := num("exclusiveMaximum"); ok && x >= m {
			return fmt.Errorf("%v >= exclusiveMaximum %v", x, m)
		}
		if m, ok := num("multipleOf"); ok && math.Mod(x, m) != 0 {
			return fmt.Errorf("%v not a multiple of %v", x, m)
		}
	case string:
		if m, ok := num("minLength"); ok && float64(len(x)) < m {
			return fmt.Errorf("%q shorter than %v", x, m)
		}
		if m, ok := num("maxLength"); ok && float64(len(x)) > m {
			return fmt.Errorf("%q longer than %v", x, m)
		}
	case []any:
		if m, ok := num("minItems"); ok && float64(len(x)) < m {
			return fmt.Errorf("%d items < minItems %v", len(x), m)
		}
		if m, ok := num("maxItems"); ok && float64(len(x)) > m {
			return fmt.Errorf("%d items > maxItems %v", len(x), m)
		}
		var items []json.RawMessage
		_ = json.Unmarshal(value, &items)
		var prefix []json.RawMessage
		_ = json.Unmarshal(s["prefixItems"], &prefix)
		for i, it := range items {
			sub := s["items"]
			if i < len(prefix) {
				sub = prefix[i]
			}
			if err := conforms(root, sub, it); err != nil {
				return err
			}
		}
	case map[string]any:
		var required []string
		_ = json.Unmarshal(s["required"], &required)
		for _, r := range required {
			if _, ok := x[r]; !ok {
				return fmt.Errorf("%s lacks required %q", value, r)
			}
		}
		var props, fields map[string]json.RawMessage
		_ = json.Unmarshal(s["properties"], &props)
		_ = json.Unmarshal(value, &fields)
		for k, f := range fields {
			if p, ok := props[k]; ok {
				if err := conforms(root, p, f); err != nil {
					return fmt.Errorf("%s: %w", k, err)
				}
			}
		}
	}
	return nil
}

func typeOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	}
	return "object"
}
