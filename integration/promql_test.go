package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// A PromQL parser for the dashboard test, enough for what dashboards
// write: vector selectors with matchers, ranges and subqueries, offset and
// @, function calls, aggregations with by/without before or after their
// arguments, binary operators with bool, on/ignoring and
// group_left/group_right, numbers, strings, and Grafana's variables ($x,
// ${x}) where a duration or a value goes. It checks the syntax and returns
// every vector selector, so the test can check each names a metric the
// daemons export, with labels it has. (The Prometheus module's own parser
// would pull the whole server into go.mod.)

// selector is a vector selector of a query: its metric name and the label
// names its matchers use.
type selector struct {
	name   string
	labels []string
}

// parsePromQL parses expr and returns its selectors, in order.
func parsePromQL(expr string) ([]selector, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return nil, err
	}
	p := &promParser{toks: toks}
	if err := p.expr(); err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tEOF {
		return nil, fmt.Errorf("unexpected %q at %d after a complete expression", t.text, t.pos)
	}
	return p.sels, nil
}

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tNumber
	tDuration
	tString
	tVar // a Grafana variable: $name, ${name}
	tOp  // an operator or punctuation
)

type promToken struct {
	kind tokKind
	text string
	pos  int
}

// promOps are the operators and punctuation, longest first.
var promOps = []string{"==", "!=", "<=", ">=", "=~", "!~", "+", "-", "*", "/", "%", "^", "<", ">", "=",
	"(", ")", "{", "}", "[", "]", ",", ":", "@"}

func lexPromQL(s string) ([]promToken, error) {
	var toks []promToken
	// A name may hold colons (recording rules: job:rate5m), but not start
	// with one: that is a subquery's.
	isIdent := func(r byte, first bool) bool {
		return r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || !first && (r == ':' || r >= '0' && r <= '9')
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case unicode.IsSpace(rune(c)):
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, promToken{tString, s[i : j+1], i})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(s) && s[j] == '{' {
				k := strings.IndexByte(s[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(s) && isIdent(s[j], false) {
					j++
				}
			}
			if j == i+1 {
				return nil, fmt.Errorf("a lone $ at %d", i)
			}
			toks = append(toks, promToken{tVar, s[i:j], i})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			j := i
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == 'e' || s[j] == 'E') {
				j++
			}
			kind := tNumber
			if j < len(s) && strings.ContainsRune("smhdwy", rune(s[j])) { // a duration: 5m, 1h30m, 250ms
				for j < len(s) && (s[j] >= '0' && s[j] <= '9' || strings.ContainsRune("smhdwy", rune(s[j]))) {
					j++
				}
				kind = tDuration
			}
			toks = append(toks, promToken{kind, s[i:j], i})
			i = j
		case isIdent(c, true):
			j := i
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			toks = append(toks, promToken{tIdent, s[i:j], i})
			i = j
		default:
			op := ""
			for _, o := range promOps {
				if strings.HasPrefix(s[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, promToken{tOp, op, i})
			i += len(op)
		}
	}
	return append(toks, promToken{tEOF, "", len(s)}), nil
}

type promParser struct {
	toks []promToken
	i    int
	sels []selector
}

var (
	promAggregators = []string{"sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk",
		"quantile", "count_values", "limitk", "limit_ratio"}
	promKeywordOps = []string{"and", "or", "unless", "atan2"}
	promBinaryOps  = []string{"+", "-", "*", "/", "%", "^", "==", "!=", "<=", ">=", "<", ">"}
	promReserved   = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "atan2"}
)

func (p *promParser) peek() promToken { return p.toks[p.i] }
func (p *promParser) next() promToken { t := p.toks[p.i]; p.i++; return t }

func (p *promParser) is(kind tokKind, text string) bool {
	t := p.peek()
	return t.kind == kind && t.text == text
}

func (p *promParser) expect(kind tokKind, text string) error {
	if t := p.next(); t.kind != kind || t.text != text {
		return fmt.Errorf("want %q at %d, got %q", text, t.pos, t.text)
	}
	return nil
}

// expr is unary (binary-operator unary)*.
func (p *promParser) expr() error {
	if err := p.unary(); err != nil {
		return err
	}
	for {
		t := p.peek()
		if !(t.kind == tOp && slices.Contains(promBinaryOps, t.text) || t.kind == tIdent && slices.Contains(promKeywordOps, t.text)) {
			return nil
		}
		p.next()
		if p.is(tIdent, "bool") {
			p.next()
		}
		if p.is(tIdent, "on") || p.is(tIdent, "ignoring") {
			p.next()
			if err := p.labelList(); err != nil {
				return err
			}
			if p.is(tIdent, "group_left") || p.is(tIdent, "group_right") {
				p.next()
				if p.is(tOp, "(") {
					if err := p.labelList(); err != nil {
						return err
					}
				}
			}
		}
		if err := p.unary(); err != nil {
			return err
		}
	}
}

// unary is [+-] primary, then any ranges, subqueries, offsets and @.
func (p *promParser) unary() error {
	if p.is(tOp, "-") || p.is(tOp, "+") {
		p.next()
		return p.unary()
	}
	if err := p.primary(); err != nil {
		return err
	}
	for {
		switch {
		case p.is(tOp, "["):
			p.next()
			if err := p.duration(); err != nil {
				return err
			}
			if p.is(tOp, ":") {
				p.next()
				if !p.is(tOp, "]") {
					if err := p.duration(); err != nil {
						return err
					}
				}
			}
			if err := p.expect(tOp, "]"); err != nil {
				return err
			}
		case p.is(tIdent, "offset"):
			p.next()
			if p.is(tOp, "-") {
				p.next()
			}
			if err := p.duration(); err != nil {
				return err
			}
		case p.is(tOp, "@"):
			p.next()
			if t := p.next(); t.kind != tNumber && !(t.kind == tIdent && (t.text == "start" || t.text == "end")) {
				return fmt.Errorf("want a time after @ at %d, got %q", t.pos, t.text)
			}
			if p.is(tOp, "(") {
				p.next()
				if err := p.expect(tOp, ")"); err != nil {
					return err
				}
			}
		default:
			return nil
		}
	}
}

func (p *promParser) duration() error {
	if t := p.next(); t.kind != tDuration && t.kind != tVar {
		return fmt.Errorf("want a duration at %d, got %q", t.pos, t.text)
	}
	return nil
}

func (p *promParser) primary() error {
	t := p.next()
	switch t.kind {
	case tNumber, tString, tVar:
		return nil
	case tOp:
		switch t.text {
		case "(":
			if err := p.expr(); err != nil {
				return err
			}
			return p.expect(tOp, ")")
		case "{":
			return p.matchers(&selector{})
		}
		return fmt.Errorf("unexpected %q at %d", t.text, t.pos)
	case tIdent:
		switch {
		case slices.Contains(promAggregators, t.text) && (p.is(tIdent, "by") || p.is(tIdent, "without") || p.is(tOp, "(")):
			return p.aggregation()
		case slices.Contains(promReserved, t.text):
			return fmt.Errorf("keyword %q at %d where an expression goes", t.text, t.pos)
		case p.is(tOp, "("):
			return p.call()
		}
		s := selector{name: t.text}
		if p.is(tOp, "{") {
			p.next()
			return p.matchers(&s)
		}
		p.sels = append(p.sels, s)
		return nil
	}
	return fmt.Errorf("unexpected end of the expression")
}

// aggregation is [by|without (labels)] (args) [by|without (labels)]; the
// aggregator's name is read.
func (p *promParser) aggregation() error {
	grouped := false
	if p.is(tIdent, "by") || p.is(tIdent, "without") {
		p.next()
		if err := p.labelList(); err != nil {
			return err
		}
		grouped = true
	}
	if err := p.call(); err != nil {
		return err
	}
	if !grouped && (p.is(tIdent, "by") || p.is(tIdent, "without")) {
		p.next()
		return p.labelList()
	}
	return nil
}

// call is (expr, ...), possibly empty.
func (p *promParser) call() error {
	if err := p.expect(tOp, "("); err != nil {
		return err
	}
	if p.is(tOp, ")") {
		p.next()
		return nil
	}
	for {
		if err := p.expr(); err != nil {
			return err
		}
		if p.is(tOp, ",") {
			p.next()
			continue
		}
		return p.expect(tOp, ")")
	}
}

// labelList is (label, ...), possibly empty.
func (p *promParser) labelList() error {
	if err := p.expect(tOp, "("); err != nil {
		return err
	}
	for !p.is(tOp, ")") {
		if t := p.next(); t.kind != tIdent {
			return fmt.Errorf("want a label name at %d, got %q", t.pos, t.text)
		}
		if !p.is(tOp, ",") {
			break
		}
		p.next()
	}
	return p.expect(tOp, ")")
}

// matchers reads label="value", ... } into s, and records s.
func (p *promParser) matchers(s *selector) error {
	for !p.is(tOp, "}") {
		l := p.next()
		if l.kind != tIdent {
			return fmt.Errorf("want a label name at %d, got %q", l.pos, l.text)
		}
		if op := p.next(); op.kind != tOp || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) {
			return fmt.Errorf("want a matcher operator at %d, got %q", op.pos, op.text)
		}
		if v := p.next(); v.kind != tString {
			return fmt.Errorf("want a quoted value at %d, got %q", v.pos, v.text)
		}
		if l.text == "__name__" {
			return fmt.Errorf("a selector by __name__ at %d: name the metric instead", l.pos)
		}
		s.labels = append(s.labels, l.text)
		if !p.is(tOp, ",") {
			break
		}
		p.next()
	}
	if err := p.expect(tOp, "}"); err != nil {
		return err
	}
	p.sels = append(p.sels, *s)
	return nil
}

// The parser accepts what dashboards write and refuses broken queries:
// the dashboard test depends on it for both.
func TestPromQLParser(t *testing.T) {
	good := []struct {
		expr string
		sels []string // name:label,label
	}{
		{`up`, []string{"up:"}},
		{`sum by (route, outcome) (rate(iop_edge_requests_total{model=~"$model", principal!="x"}[$__rate_interval]))`,
			[]string{"iop_edge_requests_total:model,principal"}},
		{`histogram_quantile(0.95, sum by (le, model) (rate(a_bucket{m="1"}[5m])))`, []string{"a_bucket:m"}},
		{`sum(rate(a[5m])) without (x) / on (y) group_left (z) b offset 1h`, []string{"a:", "b:"}},
		{`max_over_time(a[1h:5m]) > bool 3 and -b @ start()`, []string{"a:", "b:"}},
		{`topk(3, a) or vector(0)`, []string{"a:"}},
		{`job:rate5m{x="y"} * 2`, []string{"job:rate5m:x"}},
		{`increase(a[1h]) == 1 unless b{c=~"d|e",}`, []string{"a:", "b:c"}},
	}
	for _, g := range good {
		sels, err := parsePromQL(g.expr)
		if err != nil {
			t.Errorf("%s: %v", g.expr, err)
			continue
		}
		var got []string
		for _, s := range sels {
			got = append(got, s.name+":"+strings.Join(s.labels, ","))
		}
		if !slices.Equal(got, g.sels) {
			t.Errorf("%s: selectors %q, want %q", g.expr, got, g.sels)
		}
	}
	for _, bad := range []string{
		``, `sum(`, `rate(a[5m]`, `a{b="c"`, `a{b=c}`, `a{b="c" d="e"}`, `a[5]`, `a +`, `sum by (x y) (a)`,
		`a b`, `by (x) (a)`, `{__name__="a"}`, `a{b="c}`, `rate(a[5m])) `, `a{b=~}`, `$`,
	} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%q parsed; want an error", bad)
		}
	}
}
