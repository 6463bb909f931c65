package integration

import (
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The documents in docs/ keep the ids the code cites resolvable: every
// requirement id (R5, S3, P4) cited in a comment or string of the Go and
// protobuf sources has a heading in docs/requirements.md, and every
// "decision N" a numbered decision in docs/architecture.md. The repository
// paths the documents and the README name exist.

// reqID is a requirement id as the code cites it: "R5", "(R5)", "R5,",
// "S5:", "R4–R7", "R5/R6", "SPEC R11". The letter must start a word and
// not follow a '.' (a Go selector written in a comment), and the number has
// one or two digits without a leading zero (the source document's "S01"
// is not an id). Go identifiers that look like ids (an elliptic curve, a
// percentile field) never reach the pattern: only comments and string
// literals are searched.
var reqID = regexp.MustCompile(`(?:^|[^\w.])([RSP][1-9][0-9]?)\b`)

// notCitation lists phrases that look like an id but are not one.
var notCitation = regexp.MustCompile(`^S3 (?:bucket|object|storage|API)`)

// decisionRef is "decision 5", "Decision 2", "decisions 2 and 3",
// "decisions 2, 3, 7".
var (
	decisionRef = regexp.MustCompile(`(?i)\bdecisions?\s+([0-9]+(?:\s*(?:,|and|&|–|-)\s*[0-9]+)*)`)
	number      = regexp.MustCompile(`[0-9]+`)
)

// Headings that define ids in the documents: "## R5 Stall watchdog",
// "### R5 — ...", and "### 5. Exactly one terminal" (or "Decision 5").
var (
	reqHeading      = regexp.MustCompile(`(?m)^#{2,4}\s+([RSP][1-9][0-9]?)\b`)
	decisionHeading = regexp.MustCompile(`(?m)^#{2,4}\s+(?:Decision\s+)?([1-9][0-9]?)[.:)]?\s`)
)

// citation is one id cited at file:line.
type citation struct {
	id  string
	pos string
}

func TestDocsDefineEveryCitedID(t *testing.T) {
	root := ".."
	reqs := headings(t, filepath.Join(root, "docs", "requirements.md"), reqHeading)
	decisions := headings(t, filepath.Join(root, "docs", "architecture.md"), decisionHeading)
	checkUnbroken(t, "docs/requirements.md", reqs, map[string]int{"R": 11, "S": 6, "P": 6})
	checkUnbroken(t, "docs/architecture.md", prefixed("decision ", decisions), map[string]int{"decision ": 10})

	ids, decs := citations(t, root)
	if len(ids) == 0 || len(decs) == 0 {
		t.Fatalf("found %d requirement citations and %d decision citations: the scan is broken", len(ids), len(decs))
	}
	for _, c := range ids {
		if !reqs[c.id] {
			t.Errorf("%s: cites %s, which has no heading in docs/requirements.md", c.pos, c.id)
		}
	}
	for _, c := range decs {
		if !decisions[c.id] {
			t.Errorf("%s: cites decision %s, which is not a numbered decision in docs/architecture.md", c.pos, c.id)
		}
	}
}

// headings returns the ids that pattern's first group finds in file.
func headings(t *testing.T, file string, pattern *regexp.Regexp) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	found := make(map[string]bool)
	for _, m := range pattern.FindAllStringSubmatch(string(b), -1) {
		found[m[1]] = true
	}
	if len(found) == 0 {
		t.Fatalf("%s: no headings found", file)
	}
	return found
}

func prefixed(prefix string, set map[string]bool) map[string]bool {
	out := make(map[string]bool, len(set))
	for k := range set {
		out[prefix+k] = true
	}
	return out
}

// checkUnbroken fails when a series of ids (R, S, P, "decision ") skips
// a number or stops short of its known length (least: R11, S6, P6 and
// decision 10 exist), so that a deleted heading is noticed even when no
// code cites it.
func checkUnbroken(t *testing.T, file string, ids map[string]bool, least map[string]int) {
	t.Helper()
	last := maps.Clone(least) // series -> highest number
	for id := range ids {
		i := strings.IndexAny(id, "0123456789")
		n, _ := strconv.Atoi(id[i:])
		last[id[:i]] = max(last[id[:i]], n)
	}
	for series, n := range last {
		for i := 1; i <= n; i++ {
			if id := series + strconv.Itoa(i); !ids[id] {
				t.Errorf("%s: %s is missing (the series goes up to %s%d)", file, id, series, n)
			}
		}
	}
}

// citations scans the comments and string literals of every .go and
// .proto file of the repository, except generated *.pb.go files (their
// comments are the .proto files', which are scanned), this file, and
// directories that hold no source of ours.
func citations(t *testing.T, root string) (ids, decisions []citation) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "vendor" || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".pb.go") || !(strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".proto")) {
			return nil
		}
		if rel, _ := filepath.Rel(root, path); filepath.ToSlash(rel) == "integration/docs_test.go" {
			return nil // this checker: its comments show the forms, they cite nothing
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, tx := range texts(rel, src) {
			for _, m := range reqID.FindAllStringSubmatchIndex(tx.text, -1) {
				id := tx.text[m[2]:m[3]]
				if notCitation.MatchString(tx.text[m[2]:]) {
					continue
				}
				ids = append(ids, citation{id, fmt.Sprintf("%s:%d", rel, tx.line+strings.Count(tx.text[:m[2]], "\n"))})
			}
			for _, m := range decisionRef.FindAllStringSubmatchIndex(tx.text, -1) {
				pos := fmt.Sprintf("%s:%d", rel, tx.line+strings.Count(tx.text[:m[2]], "\n"))
				for _, n := range number.FindAllString(tx.text[m[2]:m[3]], -1) {
					decisions = append(decisions, citation{n, pos})
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids, decisions
}

// text is a comment or string literal and the line it starts on.
type text struct {
	text string
	line int
}

// texts returns the comments and string literals of a source file. Go
// files are tokenized, so identifiers never count; a .proto file has only
// // comments that cite anything, so its lines after "//" are taken.
func texts(name string, src []byte) []text {
	var out []text
	if strings.HasSuffix(name, ".proto") {
		for i, l := range strings.Split(string(src), "\n") {
			if j := strings.Index(l, "//"); j >= 0 {
				out = append(out, text{l[j+2:], i + 1})
			}
		}
		return out
	}
	fset := token.NewFileSet()
	var s scanner.Scanner
	s.Init(fset.AddFile(name, -1, len(src)), src, nil, scanner.ScanComments)
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok == token.COMMENT || tok == token.STRING {
			out = append(out, text{lit, fset.Position(pos).Line})
		}
	}
}

// A repository path named in the documents: a Markdown link's target
// ([text](path), relative to the document), or a code span (`path`, from
// the repository root) whose first element is a top-level entry of the
// repository (`internal/edge/gateway`, `configs/edge-dev.yaml`,
// `quicwire/wirepb/wire.proto`). A span may end in "/..." (a tree) or hold a
// glob (`internal/edge/nodeserver/*_test.go`); spans with spaces, braces or
// URLs are not paths.
var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan = regexp.MustCompile("`([^`\\s]+)`")
	pathLike = regexp.MustCompile(`^[A-Za-z0-9_.*/-]+$`)
)

func TestDocsLinksExist(t *testing.T) {
	root := ".."
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no documents in docs/: %v", err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	top := topLevel(t, root)
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				checked++
				if !exists(filepath.Join(filepath.Dir(doc), target)) {
					t.Errorf("%s:%d: link to %s, which does not exist", rel, i+1, m[1])
				}
			}
			for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
				p := strings.TrimPrefix(m[1], "./")
				first, _, _ := strings.Cut(p, "/")
				if !pathLike.MatchString(p) || !top[first] || first == p {
					continue
				}
				checked++
				if !exists(filepath.Join(root, strings.TrimSuffix(p, "/..."))) {
					t.Errorf("%s:%d: names %s, which does not exist", rel, i+1, m[1])
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no repository paths found in the documents: the scan is broken")
	}
}

// topLevel is the set of names at the repository's top level.
func topLevel(t *testing.T, root string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	top := make(map[string]bool)
	for _, e := range entries {
		if e.Name() != ".git" {
			top[e.Name()] = true
		}
	}
	return top
}

// exists reports whether path, or at least one match of it as a glob,
// exists.
func exists(path string) bool {
	if strings.ContainsAny(path, "*?[") {
		m, err := filepath.Glob(path)
		return err == nil && len(m) > 0
	}
	_, err := os.Stat(path)
	return err == nil
}
