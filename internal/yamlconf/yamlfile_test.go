package yamlconf_test

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// sample exercises every kind of field Decode supports.
type sample struct {
	Name     string            `yaml:"name"`
	Enabled  bool              `yaml:"enabled"`
	Count    int               `yaml:"count"`
	Small    int8              `yaml:"small"`
	Size     uint              `yaml:"size"`
	Ratio    float64           `yaml:"ratio"`
	Timeout  yamlconf.Duration `yaml:"timeout"`
	Inner    inner             `yaml:"inner"`
	Ptr      *inner            `yaml:"ptr"`
	Items    []item            `yaml:"items"`
	Tags     map[string]string `yaml:"tags"`
	Extra    map[string]any    `yaml:"extra"`
	Addr     netip.Addr        `yaml:"addr"` // an encoding.TextUnmarshaler
	Embedded `yaml:",inline"`
	Skipped  string `yaml:"-"`
}

type inner struct {
	Value string `yaml:"value"`
}

type item struct {
	Name     string `yaml:"name"`
	Capacity int    `yaml:"capacity"`
}

func (i *item) SetDefaults() {
	if i.Capacity == 0 {
		i.Capacity = 4
	}
}

// Embedded is inlined into sample.
type Embedded struct {
	Mode string `yaml:"mode"`
}

func (s *sample) SetDefaults() {
	if s.Name == "" {
		s.Name = "default-name"
	}
	if s.Timeout == 0 {
		s.Timeout = yamlconf.Duration(30 * time.Second)
	}
}

// decodeErrors decodes src into a sample and returns the problems, failing if there are none.
func decodeErrors(t *testing.T, src string) yamlconf.Errors {
	t.Helper()
	var s sample
	err := yamlconf.Decode([]byte(src), &s)
	if err == nil {
		t.Fatalf("Decode(%q) succeeded, want an error", src)
	}
	var es yamlconf.Errors
	if !errors.As(err, &es) {
		t.Fatalf("Decode error is %T, want yamlconf.Errors: %v", err, err)
	}
	return es
}

func TestDecodeReadsEveryFieldKind(t *testing.T) {
	src := `
name: svc
enabled: true
count: -3
small: 12
size: 0x10
ratio: 1.5
timeout: 1m30s
inner: {value: a}
ptr: {value: b}
items:
  - name: first
  - name: second
    capacity: 9
tags: {zone: eu, a.b: c}
extra:
  base_url: http://x
  nested: {list: [1, 2.5, true, null, "s"]}
  when: 2001-12-14
addr: "::1"
mode: inline-works
`
	var got sample
	if err := yamlconf.Decode([]byte(src), &got); err != nil {
		t.Fatal(err)
	}
	want := sample{
		Name: "svc", Enabled: true, Count: -3, Small: 12, Size: 16, Ratio: 1.5,
		Timeout: yamlconf.Duration(90 * time.Second),
		Inner:   inner{Value: "a"},
		Ptr:     &inner{Value: "b"},
		Items:   []item{{Name: "first", Capacity: 4}, {Name: "second", Capacity: 9}},
		Tags:    map[string]string{"zone": "eu", "a.b": "c"},
		Extra: map[string]any{
			"base_url": "http://x",
			"nested":   map[string]any{"list": []any{1, 2.5, true, nil, "s"}},
			"when":     "2001-12-14",
		},
		Addr:     netip.IPv6Loopback(),
		Embedded: Embedded{Mode: "inline-works"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Decode:\n got %+v\nwant %+v", got, want)
	}
}

func TestDecodeKeepsDefaultsForMissingAndNullFields(t *testing.T) {
	var got sample
	if err := yamlconf.Decode([]byte("name:\ncount: 2\n"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "default-name" || got.Timeout != yamlconf.Duration(30*time.Second) || got.Count != 2 {
		t.Errorf("got %+v, want defaults for name and timeout", got)
	}
}

func TestDecodeLetsAnExplicitZeroOverrideADefault(t *testing.T) {
	var got sample
	if err := yamlconf.Decode([]byte("timeout: 0s\nitems: [{name: a, capacity: 0}]\n"), &got); err != nil {
		t.Fatal(err)
	}
	if got.Timeout != 0 || got.Items[0].Capacity != 0 {
		t.Errorf("got timeout %v capacity %d, want both 0", got.Timeout, got.Items[0].Capacity)
	}
}

func TestDecodeFollowsAliases(t *testing.T) {
	src := "inner: &in {value: shared}\nptr: *in\nname: &n svc\ntags: {owner: *n}\n"
	var got sample
	if err := yamlconf.Decode([]byte(src), &got); err != nil {
		t.Fatal(err)
	}
	if got.Ptr == nil || got.Ptr.Value != "shared" || got.Tags["owner"] != "svc" {
		t.Errorf("aliases not followed: %+v", got)
	}
}

func TestDecodeReportsPathLineAndReason(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		path   string
		line   int
		reason string
	}{
		{"unknown top-level field", "name: a\nnmae: b\n", "nmae", 2, `unknown field; did you mean "name"?`},
		{"unknown field at depth", "items:\n  - name: a\n  - name: b\n    capcity: 3\n", "items[1].capcity", 4, `unknown field; did you mean "capacity"?`},
		{"unknown field without a near name", "zzzzzz: 1\n", "zzzzzz", 1, "unknown field"},
		{"unknown field in a pointer struct", "ptr:\n  valeu: x\n", "ptr.valeu", 2, `did you mean "value"?`},
		{"field with yaml:\"-\" is unknown", "skipped: x\n", "skipped", 1, "unknown field"},
		{"duplicate key", "name: a\ncount: 1\nname: b\n", "name", 3, "duplicate key (first set on line 1)"},
		{"duplicate key at depth", "items:\n  - name: a\n    name: b\n", "items[0].name", 3, "duplicate key (first set on line 2)"},
		{"duplicate map key", "tags:\n  a: 1\n  a: 2\n", "tags.a", 3, "duplicate key"},
		{"duplicate key in free-form data", "extra: {x: {y: 1, y: 2}}\n", "extra.x.y", 1, "duplicate key"},
		{"string given a mapping", "name: {a: 1}\n", "name", 1, "must be a string, got a mapping"},
		{"int given text", "count: many\n", "count", 1, `must be an integer, got "many"`},
		{"int given a fraction", "count: 1.5\n", "count", 1, `must be an integer, got "1.5"`},
		{"int given a quoted number", "count: \"5\"\n", "count", 1, `must be an integer, got "5"`},
		{"int8 overflow", "small: 300\n", "small", 1, `must be an integer that fits in int8, got "300"`},
		{"uint given a negative", "size: -1\n", "size", 1, "must be a non-negative integer that fits in uint"},
		{"float given text", "ratio: half\n", "ratio", 1, `must be a number, got "half"`},
		{"bool given yes", "enabled: yes\n", "enabled", 1, `must be true or false, got "yes"`},
		{"struct given a scalar", "inner: x\n", "inner", 1, `must be a mapping of fields, got "x"`},
		{"list given a mapping", "items: {name: a}\n", "items", 1, "must be a list, got a mapping"},
		{"list item given a scalar", "items: [a]\n", "items[0]", 1, `must be a mapping of fields, got "a"`},
		{"text unmarshaler given a bad value", "addr: 1.2.3\n", "addr", 1, `ParseAddr("1.2.3")`},
		{"text unmarshaler given a list", "addr: [1]\n", "addr", 1, "must be a string, got a list"},
		{"map given a list", "tags: [a]\n", "tags", 1, "must be a mapping, got a list"},
		{"map value given a list", "tags: {a: [1]}\n", "tags.a", 1, "must be a string, got a list"},
		{"map key that is not one segment", "tags: {\"a b\": [1]}\n", `tags["a b"]`, 1, "must be a string"},
		{"bare number duration", "timeout: 30\n", "timeout", 1, `must be a duration with a unit, such as "30s" or "1m30s"; got the bare number 30`},
		{"bare zero duration", "timeout: 0\n", "timeout", 1, "bare number 0"},
		{"unparsable duration", "timeout: soon\n", "timeout", 1, `must be a duration such as "30s" or "1m30s", got "soon"`},
		{"duration given a list", "timeout: [1s]\n", "timeout", 1, `must be a duration such as "30s", got a list`},
		{"merge key", "inner:\n  <<: {value: x}\n", "inner", 2, "merge keys (<<) are not supported"},
		{"mapping as key", "? {a: 1}\n: x\n", "", 1, "a key must be a plain value, got a mapping"},
		{"null key", "~: x\n", "", 1, "a key must not be null"},
		{"top level is a list", "- a\n", "", 1, "must be a mapping of fields, got a list"},
		{"top level is a scalar", "hello\n", "", 1, `must be a mapping of fields, got "hello"`},
		{"cyclic alias", "extra: &x {a: *x}\n", "extra.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a", 1, "nested more than 32 levels deep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es := decodeErrors(t, tt.src)
			e := es[0]
			if e.Path != tt.path || e.Line != tt.line || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("got path %q line %d reason %q\nwant path %q line %d reason containing %q", e.Path, e.Line, e.Reason, tt.path, tt.line, tt.reason)
			}
		})
	}
}

func TestDecodeRefusesWholeFileProblems(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		line   int // 0: not checked (yaml.v3 reports a parse error on the line its block started)
		reason string
	}{
		{"empty input", "", 0, "configuration is empty"},
		{"only whitespace", "\n \n", 0, "configuration is empty"},
		{"only comments", "# nothing here\n", 0, "configuration is empty"},
		{"null document", "~\n", 1, "configuration is empty"},
		{"second document", "name: a\n---\nname: b\n", 3, "found a second YAML document"},
		{"trailing document separator", "name: a\n---\n", 0, "remove the trailing '---'"},
		{"trailing garbage", "name: a\n]]]\n", 0, "invalid YAML: did not find expected key"},
		{"bad indentation", "inner:\n  value: a\n bad: b\n", 0, "invalid YAML"},
		{"tab indentation", "inner:\n\tvalue: a\n", 2, "invalid YAML"},
		{"unclosed quote", "name: \"abc\n", 0, "invalid YAML"},
		{"too large", "name: " + strings.Repeat("a", yamlconf.MaxSize) + "\n", 0, "larger than 1048576 bytes"},
		{"too deep", "extra: {a: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "}\n", 1, "nested more than 32 levels deep"},
		{"alias bomb", aliasBomb(), 0, "more than 100000 values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es := decodeErrors(t, tt.src)
			e := es[len(es)-1]
			if (tt.line != 0 && e.Line != tt.line) || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("got %v, want line %d reason containing %q", es, tt.line, tt.reason)
			}
		})
	}
}

// aliasBomb is a "billion laughs": ten levels of ten aliases to the level below.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("extra:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		prev := "*l" + string(rune('0'+i-1))
		b.WriteString("  l" + string(rune('0'+i)) + ": &l" + string(rune('0'+i)) + " [" + strings.Repeat(prev+", ", 9) + prev + "]\n")
	}
	return b.String()
}

func TestDecodeReportsEveryProblem(t *testing.T) {
	es := decodeErrors(t, "nmae: a\ncount: x\nitems: [{capcity: 1}]\n")
	var paths []string
	for _, e := range es {
		paths = append(paths, e.Path)
	}
	if want := []string{"nmae", "count", "items[0].capcity"}; !reflect.DeepEqual(paths, want) {
		t.Errorf("paths %q, want %q", paths, want)
	}
}

func TestDecodeStopsAfterManyProblems(t *testing.T) {
	src := "items:\n" + strings.Repeat("  - {bad: 1}\n", 200)
	es := decodeErrors(t, src)
	if len(es) != 51 || es[50].Reason != "too many problems; stopped reading" {
		t.Errorf("got %d problems, last %v; want 50 and a stop notice", len(es), es[len(es)-1])
	}
}

func TestDecodeRefusesWhatIsNotAPointerToStruct(t *testing.T) {
	var s sample
	var m map[string]any
	for _, out := range []any{nil, s, &m, (*sample)(nil)} {
		if err := yamlconf.Decode([]byte("name: a\n"), out); err == nil || !strings.Contains(err.Error(), "need a non-nil pointer to a struct") {
			t.Errorf("Decode into %T: err = %v", out, err)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		err  yamlconf.Error
		want string
	}{
		{yamlconf.Error{Path: "identity.mode", Line: 7, Reason: `must be "mtls" or "loopback", got "x"`}, `identity.mode (line 7): must be "mtls" or "loopback", got "x"`},
		{yamlconf.Error{Path: "identity.ca_file", Reason: "required in mtls mode"}, "identity.ca_file: required in mtls mode"},
		{yamlconf.Error{Line: 3, Reason: "invalid YAML: x"}, "line 3: invalid YAML: x"},
		{yamlconf.Error{Reason: "configuration is empty"}, "configuration is empty"},
		{yamlconf.Error{File: "edge.yaml", Path: "log.level", Line: 2, Reason: "r"}, "edge.yaml: log.level (line 2): r"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	if got, want := yamlconf.Errorf("a.b", "got %d", 3).Error(), "a.b: got 3"; got != want {
		t.Errorf("Errorf: %q, want %q", got, want)
	}
}

func TestErrorsJoinAndUnwrap(t *testing.T) {
	var es yamlconf.Errors
	if es.Err() != nil {
		t.Fatal("empty Errors.Err() is not nil")
	}
	es.Append(nil, yamlconf.Errorf("a", "one"), nil)
	es.Add("b", "two")
	err := es.Err()
	if err == nil || err.Error() != "a: one\nb: two" {
		t.Fatalf("Err() = %v", err)
	}
	var first *yamlconf.Error
	if !errors.As(err, &first) || first.Path != "a" {
		t.Errorf("errors.As found %v, want the first problem", first)
	}
}

func TestLoadNamesTheFileInEveryError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(path, []byte("nmae: a\ncount: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(data []byte) (*sample, error) {
		var s sample
		return &s, yamlconf.Decode(data, &s)
	}
	_, err := yamlconf.Load(path, parse)
	want := path + `: nmae (line 1): unknown field; did you mean "name"?` + "\n" + path + `: count (line 2): must be an integer, got "x"`
	if err == nil || err.Error() != want {
		t.Errorf("Load error:\n%v\nwant\n%s", err, want)
	}

	missing := filepath.Join(dir, "missing.yaml")
	if _, err := yamlconf.Load(missing, parse); err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}

	other := func([]byte) (*sample, error) { return nil, errors.New("boom") }
	if _, err := yamlconf.Load(path, other); err == nil || err.Error() != path+": boom" {
		t.Errorf("Load with a plain error: %v", err)
	}
}

func TestDurationMarshalsBackToText(t *testing.T) {
	out, err := yaml.Marshal(struct {
		D yamlconf.Duration `yaml:"d"`
	}{yamlconf.Duration(90 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "d: 1m30s\n" {
		t.Errorf("Marshal = %q", out)
	}
	var back sample
	if err := yamlconf.Decode([]byte("timeout: 1m30s\n"), &back); err != nil || back.Timeout.String() != "1m30s" {
		t.Errorf("Decode back: %v, %v", back.Timeout, err)
	}
}

func TestLogValidateAndSlogLevel(t *testing.T) {
	var l yamlconf.Log
	l.SetDefaults()
	if l.Level != "info" || l.Format != "text" || len(l.Validate("log")) != 0 {
		t.Fatalf("defaults %+v invalid: %v", l, l.Validate("log"))
	}
	bad := yamlconf.Log{Level: "verbose", Format: "xml"}
	es := bad.Validate("log")
	if len(es) != 2 || es[0].Path != "log.level" || es[1].Path != "log.format" {
		t.Errorf("Validate(%+v) = %v", bad, es)
	}
	for level, want := range map[string]string{"debug": "DEBUG", "info": "INFO", "warn": "WARN", "error": "ERROR", "bogus": "INFO"} {
		if got := (yamlconf.Log{Level: level}).SlogLevel().String(); got != want {
			t.Errorf("SlogLevel(%q) = %s, want %s", level, got, want)
		}
	}
}

func TestIdentityValidate(t *testing.T) {
	tests := []struct {
		name  string
		id    yamlconf.Identity
		paths []string
	}{
		{"mtls with every file", yamlconf.Identity{Mode: "mtls", TrustDomain: "iop.local", CAFile: "ca", CertFile: "c", KeyFile: "k"}, nil},
		{"mtls needs the files", yamlconf.Identity{Mode: "mtls", TrustDomain: "iop.local"}, []string{"identity.ca_file", "identity.cert_file", "identity.key_file"}},
		{"loopback refuses files", yamlconf.Identity{Mode: "loopback", TrustDomain: "iop.local", KeyFile: "k"}, []string{"identity.key_file"}},
		{"unknown mode", yamlconf.Identity{Mode: "tls", TrustDomain: "iop.local"}, []string{"identity.mode"}},
		{"uppercase trust domain", yamlconf.Identity{Mode: "loopback", TrustDomain: "IOP.local"}, []string{"identity.trust_domain"}},
		{"empty trust domain", yamlconf.Identity{Mode: "loopback"}, []string{"identity.trust_domain"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var paths []string
			for _, e := range tt.id.Validate("identity") {
				paths = append(paths, e.Path)
			}
			if !reflect.DeepEqual(paths, tt.paths) {
				t.Errorf("paths %q, want %q", paths, tt.paths)
			}
		})
	}
}

func TestCheckHostPort(t *testing.T) {
	tests := []struct {
		addr, host string
		port       int
		reason     string
	}{
		{"127.0.0.1:7443", "127.0.0.1", 7443, ""},
		{"[::1]:0", "::1", 0, ""},
		{":8080", "", 8080, ""},
		{"edge.example.com:65535", "edge.example.com", 65535, ""},
		{"", "", 0, "required, as host:port"},
		{"127.0.0.1", "", 0, `must be host:port, got "127.0.0.1" (missing port in address)`},
		{"h:65536", "", 0, `port must be a number from 0 to 65535, got "65536"`},
		{"h:http", "", 0, `port must be a number from 0 to 65535, got "http"`},
		{"h:+80", "", 0, "port must be a number"},
		{"h:-1", "", 0, "port must be a number"},
	}
	for _, tt := range tests {
		host, port, err := yamlconf.CheckHostPort("listen.quic", tt.addr)
		switch {
		case tt.reason == "" && (err != nil || host != tt.host || port != tt.port):
			t.Errorf("CheckHostPort(%q) = %q, %d, %v; want %q, %d", tt.addr, host, port, err, tt.host, tt.port)
		case tt.reason != "" && (err == nil || err.Path != "listen.quic" || !strings.Contains(err.Reason, tt.reason)):
			t.Errorf("CheckHostPort(%q) error %v, want reason containing %q", tt.addr, err, tt.reason)
		}
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.3.2.1": true, "::1": true, "localhost": true, "LOCALHOST": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "localhost.example.com": false, "edge": false,
	} {
		if got := yamlconf.IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestCheckID(t *testing.T) {
	for s, reason := range map[string]string{
		"node-1": "", "a.b_c-D9": "", strings.Repeat("x", 128): "",
		"": "required", strings.Repeat("x", 129): "must be 1 to 128", "a b": "must be 1 to 128", "né": "must be 1 to 128",
	} {
		err := yamlconf.CheckID("node_id", s)
		if (reason == "") != (err == nil) || (err != nil && !strings.Contains(err.Reason, reason)) {
			t.Errorf("CheckID(%q) = %v, want reason %q", s, err, reason)
		}
	}
}

func TestDecodeWithLinesRecordsWhereEachFieldIsWritten(t *testing.T) {
	src := `name: svc
inner:
  value: a
items:
  - name: first
  -
    name: second
    capacity: 9
tags:
  zone: eu
  "a b": c
  a.b: d
extra:
  base_url: http://x
  nested: {list: [1, 2]}
timeout:
ptr: {value: p}
`
	var s sample
	lines, err := yamlconf.DecodeWithLines([]byte(src), &s)
	if err != nil {
		t.Fatal(err)
	}
	want := yamlconf.Lines{
		"name": 1, "inner": 2, "inner.value": 3,
		"items": 4, "items[0]": 5, "items[0].name": 5,
		"items[1]": 7, "items[1].name": 7, "items[1].capacity": 8, // the item starts with its first field
		"tags": 9, "tags.zone": 10, `tags["a b"]`: 11, `tags["a.b"]`: 12,
		"extra": 13, "extra.base_url": 14, "extra.nested": 15, // but not what is inside a value of type any
		"timeout": 16, // null, but named
		"ptr":     17, "ptr.value": 17,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("DecodeWithLines lines:\n got %v\nwant %v", lines, want)
	}
	var plain sample
	if err := yamlconf.Decode([]byte(src), &plain); err != nil || !reflect.DeepEqual(plain, s) {
		t.Errorf("Decode disagrees with DecodeWithLines: %+v, %v", plain, err)
	}
}

func TestDecodeWithLinesFollowsAliasesToTheAnchor(t *testing.T) {
	src := "inner: &in\n  value: shared\nitems: [{name: a}]\nptr: *in\n"
	var s sample
	lines, err := yamlconf.DecodeWithLines([]byte(src), &s)
	if err != nil {
		t.Fatal(err)
	}
	// ptr is named on line 4; the value it shares is written on line 2.
	for path, want := range map[string]int{"inner": 1, "inner.value": 2, "items[0].name": 3, "ptr": 4, "ptr.value": 2} {
		if got := lines[path]; got != want {
			t.Errorf("line of %s = %d, want %d", path, got, want)
		}
	}
}

func TestDecodeWithLinesOnError(t *testing.T) {
	tests := []struct {
		name, src string
		want      yamlconf.Lines
	}{
		{"syntax error", "name: a\n]]]\n", yamlconf.Lines{}},
		{"empty", "", yamlconf.Lines{}},
		{"lines before and after a bad field", "name: a\ncount: x\nsmall: 1\n", yamlconf.Lines{"name": 1, "count": 2, "small": 3}},
		{"unknown field is not recorded", "nmae: a\n", yamlconf.Lines{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s sample
			lines, err := yamlconf.DecodeWithLines([]byte(tt.src), &s)
			if err == nil {
				t.Fatal("no error")
			}
			if !reflect.DeepEqual(lines, tt.want) {
				t.Errorf("lines %v, want %v", lines, tt.want)
			}
		})
	}
}

func TestLinesLineFallsBackToTheNearestEnclosingField(t *testing.T) {
	lines := yamlconf.Lines{
		"identity": 4, "identity.mode": 5, "providers": 10, "providers[1]": 14, "providers[1].capacity": 16,
		"labels": 20, `labels["a.b[0]"]`: 21, `labels["q\"].x"]`: 22,
	}
	tests := []struct {
		path string
		want int
	}{
		{"identity.mode", 5},
		{"identity.ca_file", 4},         // left out: its section
		{"providers[1].capacity", 16},   // exact
		{"providers[1].adapter", 14},    // left out: its list item
		{"providers[1].targets[3]", 14}, // two levels up
		{"providers[7].name", 10},       // no such item: the list
		{`labels["a.b[0]"]`, 21},        // a quoted key holding '.' and '['
		{`labels["a.b[0]"].x`, 21},      // below a quoted key
		{`labels["q\"].x"].y`, 22},      // an escaped quote inside the key
		{`labels["never closed`, 20},    // malformed: still its parent
		{"log.level", 0},                // a whole section left out
		{"node_id", 0},                  // a top-level field left out
		{"", 0},                         // the whole file
		{"identityx.mode", 0},           // a prefix that is not a segment does not count
	}
	for _, tt := range tests {
		if got := lines.Line(tt.path); got != tt.want {
			t.Errorf("Line(%q) = %d, want %d", tt.path, got, tt.want)
		}
	}
	if got := yamlconf.Lines(nil).Line("identity.mode"); got != 0 {
		t.Errorf("nil Lines: Line = %d, want 0", got)
	}
}

func TestLinesAnnotate(t *testing.T) {
	lines := yamlconf.Lines{"identity": 1, "identity.mode": 2, "log": 7}
	plain := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"field in the file", yamlconf.Errors{yamlconf.Errorf("identity.mode", "bad")}, "identity.mode (line 2): bad"},
		{"field left out of its section", yamlconf.Errors{yamlconf.Errorf("identity.ca_file", "required")}, "identity.ca_file (line 1): required"},
		{"section left out", yamlconf.Errors{yamlconf.Errorf("edge.address", "required")}, "edge.address: required"},
		{"known line kept", yamlconf.Errors{{Path: "identity.mode", Line: 9, Reason: "r"}}, "identity.mode (line 9): r"},
		{"whole-file problem", yamlconf.Errors{yamlconf.Errorf("", "r")}, "r"},
		{"several", yamlconf.Errors{yamlconf.Errorf("log.level", "a"), yamlconf.Errorf("node_id", "b")}, "log.level (line 7): a\nnode_id: b"},
		{"a single *Error", yamlconf.Errorf("identity.mode", "bad"), "identity.mode (line 2): bad"},
		{"another error", plain, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.err.Error()
			got := lines.Annotate(tt.err)
			if got == nil || got.Error() != tt.want {
				t.Errorf("Annotate = %v, want %q", got, tt.want)
			}
			if tt.err.Error() != before {
				t.Errorf("Annotate changed its argument: %q, was %q", tt.err, before)
			}
			if reflect.TypeOf(got) != reflect.TypeOf(tt.err) {
				t.Errorf("Annotate returned a %T for a %T", got, tt.err)
			}
		})
	}
	if got := lines.Annotate(nil); got != nil {
		t.Errorf("Annotate(nil) = %v", got)
	}
	if got := lines.Annotate(yamlconf.Errors{nil}); got.(yamlconf.Errors)[0] != nil {
		t.Errorf("Annotate of a nil *Error = %v", got)
	}
}

func TestResolvePath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(t.TempDir(), "etc")
	tests := []struct {
		name, dir, path, want string
	}{
		{"empty stays empty", abs, "", ""},
		{"absolute is kept", abs, "/etc/iop/ca.pem", "/etc/iop/ca.pem"},
		{"absolute is kept as written", abs, "/etc/iop/../iop/ca.pem", "/etc/iop/../iop/ca.pem"},
		{"relative joins the directory", abs, "ca.pem", filepath.Join(abs, "ca.pem")},
		{"relative with a subdirectory", abs, "tls/ca.pem", filepath.Join(abs, "tls", "ca.pem")},
		{"relative going up", abs, "../ca.pem", filepath.Join(filepath.Dir(abs), "ca.pem")},
		{"dot directory is made absolute", ".", "ca.pem", filepath.Join(wd, "ca.pem")},
		{"relative directory is made absolute", "conf", "ca.pem", filepath.Join(wd, "conf", "ca.pem")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := yamlconf.ResolvePath(tt.dir, tt.path); got != tt.want {
				t.Errorf("ResolvePath(%q, %q) = %q, want %q", tt.dir, tt.path, got, tt.want)
			}
		})
	}
}

func TestIdentityResolvePaths(t *testing.T) {
	dir := t.TempDir()
	id := yamlconf.Identity{Mode: "mtls", TrustDomain: "iop.local", CAFile: "ca.pem", CertFile: "/abs/cert.pem"}
	id.ResolvePaths(dir)
	want := yamlconf.Identity{Mode: "mtls", TrustDomain: "iop.local", CAFile: filepath.Join(dir, "ca.pem"), CertFile: "/abs/cert.pem"}
	if id != want {
		t.Errorf("ResolvePaths: %+v, want %+v", id, want)
	}
}

func FuzzDecode(f *testing.F) {
	examples, _ := filepath.Glob("../../configs/*.yaml")
	if len(examples) == 0 {
		f.Fatal("no example configurations to seed from (configs/ moved?)")
	}
	for _, name := range examples {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"", "~", "name: a\n---\nname: b\n", "items: [{name: a, capacity: 0}]\n", "extra: &x {a: *x}\n",
		"inner:\n  <<: {value: a}\n", "tags: {a: 1, a: 2}\n", "timeout: 30\n", "small: 300\n", aliasBomb(),
		"extra: !!binary aGVsbG8=\n", "name: !!binary '%%%'\n", "count: !!int x\n", "? [a]\n: b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var s sample
		lines, err := yamlconf.DecodeWithLines(data, &s)
		last := lastLine(data)
		for path, line := range lines {
			if path == "" || line < 1 || line > last || lines.Line(path) != line {
				t.Fatalf("recorded %q on line %d of %d (Line gives %d)", path, line, last, lines.Line(path))
			}
		}
		var again sample
		if plainErr := yamlconf.Decode(data, &again); (plainErr == nil) != (err == nil) ||
			(err != nil && plainErr.Error() != err.Error()) || (err == nil && !reflect.DeepEqual(again, s)) {
			t.Fatalf("Decode and DecodeWithLines disagree: %v; %v", plainErr, err)
		}
		if err == nil {
			return
		}
		if annotated := lines.Annotate(err); annotated.Error() != err.Error() {
			t.Fatalf("Annotate changed decode errors, which have lines already:\n%v\n%v", annotated, err)
		}
		for _, e := range err.(yamlconf.Errors) {
			if l := lines.Line(e.Path); l < 0 || l > last {
				t.Fatalf("Line(%q) = %d, outside the file's %d lines", e.Path, l, last)
			}
		}
		var es yamlconf.Errors
		if !errors.As(err, &es) || len(es) == 0 {
			t.Fatalf("error %T %v is not a non-empty yamlconf.Errors", err, err)
		}
		for _, e := range es {
			if e.Reason == "" {
				t.Fatalf("problem without a reason: %#v", e)
			}
		}
	})
}

// lastLine bounds the line numbers in data: one more than its line breaks, counting every byte
// sequence YAML parsers may take for one.
func lastLine(data []byte) int {
	n := 1
	for _, sep := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
		n += bytes.Count(data, []byte(sep))
	}
	return n
}

// An explicit key longer than any real field name is refused, so a hostile
// file cannot make every path built under it expensive.
func TestLongExplicitKeysAreRefused(t *testing.T) {
	type cfg struct {
		Labels map[string]any `yaml:"labels"`
	}
	data := "labels:\n  ? " + strings.Repeat("k", 2000) + "\n  : v\n"
	err := yamlconf.Decode([]byte(data), &cfg{})
	if err == nil || !strings.Contains(err.Error(), "a key longer than 1024 bytes") {
		t.Fatalf("Decode of a 2000-byte key: %v", err)
	}
}
