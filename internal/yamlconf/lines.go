package yamlconf

// maxLinePath is the longest field path whose line DecodeWithLines records. Real paths are a few
// dozen bytes; a longer one comes from a huge map key, and is left to fall back on its parent
// (see Lines.Line) rather than kept in memory once per alias expansion.
const maxLinePath = 1024

// Lines maps the field paths a file sets to the 1-based line each is written on:
// "identity" → 4 (the line of `identity:`), "identity.mode" → 5, "providers[1]" → 11 (the line
// where that list item starts), "providers[1].capacity" → 12, `labels["a b"]` → 20. Paths are
// spelt as in Error.Path.
//
// Only the fields of the Go struct are recorded, with the items of its lists and the entries of
// its maps; what is inside a value of type any (such as the nested settings in a provider's
// free-form config) is not. A key given a null value (`identity:` alone) is recorded, since the
// file does name it. A list item's line is that of its first value.
type Lines map[string]int

// DecodeWithLines is Decode, also returning the line of every field the file sets, so that
// problems found later, such as by a Validate method, can point at the file (see Annotate).
// When decoding fails, Lines holds what was read before the failure, possibly nothing.
func DecodeWithLines(data []byte, out any) (Lines, error) {
	lines := Lines{}
	err := decode(data, out, lines)
	return lines, err
}

// record notes that the field at path is written on line, when lines are being kept. The first
// line wins; Decode refuses a key set twice anyway.
func (d *decoder) record(path string, line int) {
	if d.lines == nil || line <= 0 || len(path) > maxLinePath {
		return
	}
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = line
	}
}

// Line returns the line of the field at path or, when the file leaves that field out, of its
// nearest enclosing field the file does set: for `identity.ca_file` missing from a file that has
// an identity section, the line of `identity:`. It returns 0 when neither the field nor any
// enclosing one is in the file (a whole section left to its defaults).
func (l Lines) Line(path string) int {
	if path == "" || len(l) == 0 {
		return 0
	}
	if line, ok := l[path]; ok {
		return line
	}
	cuts := segmentStarts(path)
	for i := len(cuts) - 1; i >= 0; i-- {
		if line, ok := l[path[:cuts[i]]]; ok {
			return line
		}
	}
	return 0
}

// Annotate returns err with Line filled in, from l.Line, on every *Error whose Line is 0. err may
// be an Errors or an *Error, as Validate methods return; the problems are copied, so the caller's
// values are untouched. Any other error, and nil, is returned as it is.
//
// A daemon's Parse calls it on what Validate reports, so `identity.mode: must be ...` reads
// `identity.mode (line 2): must be ...` as a decoding problem would.
func (l Lines) Annotate(err error) error {
	switch err := err.(type) {
	case Errors:
		out := make(Errors, len(err))
		for i, e := range err {
			out[i] = l.annotate(e)
		}
		return out
	case *Error:
		return l.annotate(err)
	}
	return err
}

func (l Lines) annotate(e *Error) *Error {
	if e == nil || e.Line != 0 {
		return e
	}
	c := *e
	c.Line = l.Line(e.Path)
	return &c
}

// segmentStarts returns the offsets in path where its second and later segments begin, each one
// a '.' or a '[' that starts `[2]` or `["key"]`, so path[:offset] is an enclosing field. Brackets
// and dots inside a quoted key do not count.
func segmentStarts(path string) []int {
	var cuts []int
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '.':
			if i > 0 {
				cuts = append(cuts, i)
			}
		case '[':
			if i > 0 {
				cuts = append(cuts, i)
			}
			if i+1 < len(path) && path[i+1] == '"' {
				i = endOfQuoted(path, i+1)
			}
		}
	}
	return cuts
}

// endOfQuoted returns the offset of the '"' that closes the Go-quoted string starting at
// path[open], or the last offset when it is not closed.
func endOfQuoted(path string, open int) int {
	for i := open + 1; i < len(path); i++ {
		switch path[i] {
		case '\\':
			i++ // skip the escaped byte, which may be a quote
		case '"':
			return i
		}
	}
	return len(path) - 1
}
