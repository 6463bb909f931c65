// Package yamlconf is the strict YAML loader both daemons read their configuration files with
// (the examples are in configs/), and the sections their configurations share.
//
// Decode reads a file into a config struct and refuses anything it does not understand: unknown
// fields, duplicate keys, wrong types, several documents. Every problem is an *Error that names
// the field path (`providers[1].capacity`) and the line, so a user can fix a file from the message
// alone. The daemons' Validate methods report through the same type, so a decoding mistake and a
// semantic one read alike.
package yamlconf

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Limits on what Decode accepts. A configuration file is small and shallow; anything beyond these
// is a mistake or an attack, and is refused before it can cost much memory or time.
const (
	// MaxSize is the largest configuration Decode and Load accept, in bytes.
	MaxSize = 1 << 20
	// MaxDepth is the deepest nesting of mappings and lists Decode accepts.
	MaxDepth = 32
	// maxValues bounds the values Decode visits, counting every alias expansion, so a small file
	// of nested aliases (a "billion laughs") cannot make it loop for long.
	maxValues = 100_000
	// maxErrors is how many problems Decode reports before it gives up on a file.
	maxErrors = 50
)

// Error is one problem with one field of a configuration file.
type Error struct {
	File   string // the file, when the configuration came from one (set by Load)
	Path   string // the field, such as `identity.ca_file` or `providers[2].capacity`; empty for the whole file
	Line   int    // 1-based line in the file, or 0 when unknown (validation works on decoded values)
	Reason string // what is wrong, phrased to follow "field: "
}

// Error formats e as `file: path (line N): reason`, leaving out the parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File + ": ")
	}
	switch {
	case e.Path != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s (line %d): ", e.Path, e.Line)
	case e.Path != "":
		b.WriteString(e.Path + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Errorf returns an *Error for the field at path, its reason formatted as by fmt.Sprintf.
func Errorf(path string, format string, args ...any) *Error {
	return &Error{Path: path, Reason: fmt.Sprintf(format, args...)}
}

// Errors is every problem found in one configuration, one per line when printed. Decode and the
// daemons' Validate methods return it, through Err, so a user sees all mistakes at once;
// errors.As with an **Error target finds the first.
type Errors []*Error

// Error joins the problems, one per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns each problem, for errors.As and errors.Is.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// Append adds the non-nil problems in errs, so checks that return nil when a field is fine can
// be appended without an if.
func (es *Errors) Append(errs ...*Error) {
	for _, e := range errs {
		if e != nil {
			*es = append(*es, e)
		}
	}
}

// Add appends a problem with the field at path.
func (es *Errors) Add(path, format string, args ...any) {
	*es = append(*es, Errorf(path, format, args...))
}

// Err returns es as an error, or nil when there are no problems. Return es.Err() rather than es:
// an empty Errors stored in an error interface is not nil.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// Load reads the configuration file at path and parses it with parse (a daemon's Parse). Every
// *Error in the result names the file, so messages read `edge.yaml: identity.ca_file: ...`.
func Load[T any](path string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, err // *fs.PathError already names the file
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return zero, err // also a *fs.PathError
	}
	cfg, err := parse(data)
	if err != nil {
		return zero, inFile(path, err)
	}
	return cfg, nil
}

// inFile sets File on every *Error in err, copying them so the caller's values are untouched.
func inFile(name string, err error) error {
	switch err := err.(type) {
	case Errors:
		out := make(Errors, len(err))
		for i, e := range err {
			c := *e
			c.File = name
			out[i] = &c
		}
		return out
	case *Error:
		c := *err
		c.File = name
		return &c
	default:
		return fmt.Errorf("%s: %w", name, err)
	}
}

// Defaulter is implemented by configuration structs whose defaults are not their zero value.
// Decode calls SetDefaults on each such struct before it reads the struct's fields, so a key the
// file leaves out keeps its default while a key the file sets, even to a zero value, overrides
// it (and Validate can then refuse a zero that makes no sense). SetDefaults must only fill
// fields that are zero, so calling it again changes nothing.
type Defaulter interface {
	SetDefaults()
}

// Decode parses YAML into out (a pointer to struct) strictly: unknown fields, duplicate keys,
// wrong types, multiple documents and trailing garbage are errors; every error names the field
// path (e.g. `identity.ca_file`, `providers[2].capacity`) and the line. Empty input is an error.
//
// Fields are matched by their `yaml:"name"` tags (`,inline` embeds a struct's fields; other
// options are ignored). Anchors and aliases work; merge keys (`<<`) do not. A null value, such
// as `key:` with nothing after it, leaves the field as it was, which is its default. The error,
// when not nil, is an Errors. DecodeWithLines also reports the line of every field it read.
func Decode(data []byte, out any) error {
	return decode(data, out, nil)
}

// decode is Decode, recording in lines, when not nil, the line of every field it reads.
func decode(data []byte, out any, lines Lines) error {
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return Errors{Errorf("", "cannot decode into %T: need a non-nil pointer to a struct", out)}
	}
	if len(data) > MaxSize {
		return Errors{Errorf("", "configuration is larger than %d bytes", MaxSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Errors{Errorf("", "configuration is empty")}
		}
		return Errors{syntaxError(err)}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return Errors{syntaxError(err)}
	case len(extra.Content) == 0 || extra.Content[0].ShortTag() == "!!null":
		return Errors{Errorf("", "found an empty second YAML document; a configuration file holds exactly one (remove the trailing '---')")}
	default:
		e := Errorf("", "found a second YAML document; a configuration file holds exactly one")
		e.Line = extra.Content[0].Line
		return Errors{e}
	}
	d := &decoder{lines: lines}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if root.ShortTag() == "!!null" {
		return Errors{&Error{Line: root.Line, Reason: "configuration is empty"}}
	}
	d.value(root, v.Elem(), "", 0)
	return d.errs.Err()
}

var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError turns a parser error ("yaml: line 3: did not find expected key") into an *Error.
func syntaxError(err error) *Error {
	msg := err.Error()
	if m := syntaxLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Reason: "invalid YAML: " + m[2]}
	}
	return &Error{Reason: "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// decoder walks a yaml.Node tree alongside a Go value, collecting every problem.
type decoder struct {
	errs   Errors
	values int   // values visited, counting alias expansions
	stop   bool  // a limit was hit: report nothing more
	lines  Lines // when not nil, where each field read was written (see record)
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) {
	if d.stop {
		return
	}
	if len(d.errs) == maxErrors {
		d.errs = append(d.errs, &Error{Reason: "too many problems; stopped reading"})
		d.stop = true
		return
	}
	e := Errorf(path, format, args...)
	e.Line = n.Line
	d.errs = append(d.errs, e)
}

// enter counts n against the limits and follows aliases. It returns nil when decoding must not
// descend into n.
func (d *decoder) enter(n *yaml.Node, path string, depth int) *yaml.Node {
	if d.stop {
		return nil
	}
	if depth > MaxDepth {
		d.fail(n, path, "nested more than %d levels deep", MaxDepth)
		d.stop = true
		return nil
	}
	if d.values++; d.values > maxValues {
		d.fail(n, path, "more than %d values (counting alias expansions)", maxValues)
		d.stop = true
		return nil
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || n.Alias.Kind == yaml.AliasNode {
			d.fail(n, path, "alias %q does not name a value", n.Value)
			return nil
		}
		return n.Alias // a cycle through aliases ends at MaxDepth
	}
	return n
}

var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// value decodes n into v, the field at path.
func (d *decoder) value(n *yaml.Node, v reflect.Value, path string, depth int) {
	if n = d.enter(n, path, depth); n == nil || n.ShortTag() == "!!null" {
		return
	}
	t := v.Type()
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType):
		if err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			d.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return
	case reflect.PointerTo(t).Implements(textUnmarshalerType):
		if n.Kind != yaml.ScalarNode {
			d.fail(n, path, "must be a string, got %s", describe(n))
		} else if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			d.fail(n, path, "%v", err)
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		d.value(n, v.Elem(), path, depth)
	case reflect.Struct:
		d.structure(n, v, path, depth)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "must be a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			d.record(p, item.Line)
			d.value(item, s.Index(i), p, depth+1)
		}
		v.Set(s)
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			d.fail(n, path, "cannot decode into %s: map keys must be strings", t)
			return
		}
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "must be a mapping, got %s", describe(n))
			return
		}
		m := reflect.MakeMapWithSize(t, len(n.Content)/2)
		d.pairs(n, path, depth, func(key string, line int, val *yaml.Node) {
			elem, p := reflect.New(t.Elem()).Elem(), keyPath(path, key)
			d.record(p, line)
			d.value(val, elem, p, depth+1)
			m.SetMapIndex(reflect.ValueOf(key).Convert(t.Key()), elem)
		})
		v.Set(m)
	case reflect.Interface:
		if t.NumMethod() != 0 {
			d.fail(n, path, "cannot decode into %s", t)
			return
		}
		if x := d.generic(n, path, depth); x != nil {
			v.Set(reflect.ValueOf(x))
		}
	default:
		d.scalar(n, v, path)
	}
}

// scalar decodes a string, bool or number. It is stricter than yaml.v3: a bool must be written
// true or false, and an integer field refuses 1.5 instead of truncating it.
func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	var want string
	var tags []string // accepted resolved tags; none means any scalar
	switch t.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want, tags = "true or false", []string{"!!bool"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want, tags = "an integer", []string{"!!int"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want, tags = "a non-negative integer", []string{"!!int"}
	case reflect.Float32, reflect.Float64:
		want, tags = "a number", []string{"!!int", "!!float"}
	default:
		d.fail(n, path, "cannot decode into %s", t)
		return
	}
	if n.Kind != yaml.ScalarNode || (len(tags) > 0 && !contains(tags, n.ShortTag())) {
		d.fail(n, path, "must be %s, got %s", want, describe(n))
		return
	}
	if t.Kind() == reflect.String && n.ShortTag() != "!!binary" {
		v.SetString(n.Value) // numbers and booleans are taken as written
		return
	}
	tmp := reflect.New(t)
	if err := n.Decode(tmp.Interface()); err != nil {
		if len(tags) > 0 {
			d.fail(n, path, "must be %s that fits in %s, got %s", want, t, describe(n))
		} else {
			d.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return
	}
	v.Set(tmp.Elem())
}

// structure decodes a mapping into the struct v, matching keys to `yaml` tags.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, path string, depth int) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "must be a mapping of fields, got %s", describe(n))
		return
	}
	if v.CanAddr() {
		if def, ok := v.Addr().Interface().(Defaulter); ok {
			def.SetDefaults()
		}
	}
	fields := fieldsOf(v.Type(), nil)
	d.pairs(n, path, depth, func(key string, line int, val *yaml.Node) {
		for _, f := range fields {
			if f.name == key {
				p := keyPath(path, key)
				d.record(p, line)
				d.value(val, v.FieldByIndex(f.index), p, depth+1)
				return
			}
		}
		reason := "unknown field"
		if s := suggest(key, fields); s != "" {
			reason += fmt.Sprintf("; did you mean %q?", s)
		}
		d.fail(keyNode(n, key), keyPath(path, key), "%s", reason)
	})
}

// generic decodes n as plain data (map[string]any, []any, string, int, float64, bool) for fields
// whose content belongs to someone else, such as an adapter's own configuration.
func (d *decoder) generic(n *yaml.Node, path string, depth int) any {
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		d.pairs(n, path, depth, func(key string, _ int, val *yaml.Node) {
			if val = d.enter(val, keyPath(path, key), depth+1); val != nil {
				m[key] = d.generic(val, keyPath(path, key), depth+1)
			}
		})
		return m
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			if item = d.enter(item, p, depth+1); item != nil {
				s = append(s, d.generic(item, p, depth+1))
			}
		}
		return s
	case yaml.ScalarNode:
		if n.ShortTag() == "!!timestamp" {
			return n.Value // keep the text; the adapter decides what a date means
		}
		var x any
		if err := n.Decode(&x); err != nil {
			d.fail(n, path, "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return x
	}
	d.fail(n, path, "unsupported YAML node")
	return nil
}

// pairs calls fn for each key, the line it is written on, and value of the mapping n, after
// refusing keys that are not plain scalars, merge keys and duplicates.
// maxKeyLen bounds one mapping key.
const maxKeyLen = 1024

func (d *decoder) pairs(n *yaml.Node, path string, depth int, fn func(key string, line int, val *yaml.Node)) {
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content) && !d.stop; i += 2 {
		k := d.enter(n.Content[i], path, depth+1)
		if k == nil {
			continue
		}
		switch {
		case k.Kind != yaml.ScalarNode:
			d.fail(k, path, "a key must be a plain value, got %s", describe(k))
			continue
		case k.ShortTag() == "!!merge":
			d.fail(k, path, "merge keys (<<) are not supported; repeat the fields instead")
			continue
		case k.ShortTag() == "!!null":
			d.fail(k, path, "a key must not be null")
			continue
		case len(k.Value) > maxKeyLen:
			// Plain keys are capped by the YAML parser; explicit "? key"
			// ones are not, and a long key repeated through aliases would
			// make every path built under it long too.
			d.fail(k, path, "a key longer than %d bytes", maxKeyLen)
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.fail(k, keyPath(path, k.Value), "duplicate key (first set on line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, n.Content[i].Line, n.Content[i+1])
	}
}

// keyNode returns the key node named key in the mapping n, for its line.
func keyNode(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return n
}

type field struct {
	name  string
	index []int
}

// fieldsOf lists the YAML fields of the struct type t, expanding `,inline` structs.
func fieldsOf(t reflect.Type, index []int) []field {
	var fields []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		idx := append(append([]int(nil), index...), i)
		if f.Type.Kind() == reflect.Struct && contains(strings.Split(opts, ","), "inline") {
			fields = append(fields, fieldsOf(f.Type, idx)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields = append(fields, field{name: name, index: idx})
	}
	return fields
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// keyPath appends a mapping key to path: `labels.zone`, or `labels["a.b"]` when the key would
// not read as one segment.
func keyPath(path, key string) string {
	if !plainKey.MatchString(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names what a node holds, for "must be X, got Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return strconv.Quote(v)
	}
	return "an alias"
}

// suggest returns the field name closest to a misspelt key, or "" when none is close.
func suggest(key string, fields []field) string {
	best, bestDist := "", 3 // at most two edits away
	for _, f := range fields {
		if dist := editDistance(key, f.name); dist < bestDist {
			best, bestDist = f.name, dist
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes. Keys longer than any field
// name are not worth comparing, which also keeps a hostile key from costing quadratic time.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return len(a) + len(b)
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Duration is a time.Duration written in YAML the way time.ParseDuration reads it: "30s",
// "1m30s", "500ms". A bare number is refused, since nobody can tell whether 30 meant seconds.
type Duration time.Duration

// String formats d as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes d as a duration string, so a marshalled config decodes back.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a duration such as \"30s\", got %s", describe(n))
	}
	if tag := n.ShortTag(); tag == "!!int" || tag == "!!float" {
		return fmt.Errorf("must be a duration with a unit, such as \"30s\" or \"1m30s\"; got the bare number %s", n.Value)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("must be a duration such as \"30s\" or \"1m30s\", got %s", describe(n))
	}
	*d = Duration(v)
	return nil
}
