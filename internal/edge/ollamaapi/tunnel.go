package ollamaapi

import (
	"log/slog"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// tunnelJob relays the request to an Ollama server as the client sent it
// (R3), with the body made for each candidate's target (alias.go), and the
// answer back read by read as the provider flushed it.
func tunnelJob(t *frontend.Turn, route string) *frontend.TunnelJob {
	r := &relay{route: route, model: t.Plan.Model}
	return &frontend.TunnelJob{Tunnel: frontend.TunnelRequest(t.Exchange().Request()), Adapter: Adapter,
		Body: r.bodyFor(t.Body), Out: r}
}

// relay is what this API does to an Ollama server's answer it relays: the
// client's model name given back for an alias route, and the judgement of
// a chat or generate stream's last line.
type relay struct {
	route string
	model string // the name the client asked for
	// target is the name the provider got in place of the client's, for
	// an alias route (see bodyFor); "" when it got the client's.
	target string
	rename *renamer   // gives the answer the client's name back; nil unless target is set
	lines  *lineWatch // the stream's last line, when it must be final; else nil
	last   byte       // the last byte passed on: an error line must start a line
	// refusedType is the provider's content type that Head replaced
	// (headers.go), for the log; "" when it passed.
	refusedType string
}

var _ frontend.TunnelWriter = (*relay)(nil)

// Head filters head's headers to what reaches the client (headers.go) and
// prepares for the answer. It replaces head.Headers in place: the front
// end sets the client's headers from them when the answer is committed,
// at its first byte, which comes after Head.
func (r *relay) Head(head *wirepb.TunnelResponseHead) {
	f := filterHead(head.GetHeaders())
	head.Headers, r.refusedType = f.headers, f.refusedType
	if r.target != "" {
		r.rename = newRenamer(r.target, r.model)
	}
	if watchesEnding(r.route, head) {
		r.lines = &lineWatch{}
	}
}

// Pass notes a read for the final line and renames it for an alias.
func (r *relay) Pass(p []byte) []byte {
	if r.lines != nil {
		r.lines.see(p)
	}
	if r.rename != nil {
		p = r.rename.rename(p)
	}
	if len(p) > 0 {
		r.last = p[len(p)-1]
	}
	return p
}

// Flush passes on what the renamer held back.
func (r *relay) Flush() []byte {
	if r.rename == nil {
		return nil
	}
	p := r.rename.flush()
	if len(p) > 0 {
		r.last = p[len(p)-1]
	}
	return p
}

// Ended judges a completed stream: an incomplete stream if it had to end
// with a final line and did not; the provider's own error line is relayed
// as it wrote it.
func (r *relay) Ended() (*frontend.Failure, bool) {
	if r.lines == nil {
		return nil, false
	}
	switch r.lines.ending() {
	case endDone:
		return nil, false
	case endError:
		return nil, true
	}
	return frontend.IncompleteStream(missingDone), false
}

// missingDone is what a chat or generate stream that ends without its
// final line lacks.
const missingDone = `no line with "done": true`

// Usage is the token counts of the stream's final line.
func (r *relay) Usage() (prompt, completion int64, ok bool) {
	if r.lines == nil {
		return 0, 0, false
	}
	return r.lines.usage()
}

// Fail is f as one more line, on a line of its own, so the client does
// not take the end for success.
func (r *relay) Fail(f *frontend.Failure) []byte {
	line := errorLine(f)
	if r.last != 0 && r.last != '\n' {
		line = append([]byte{'\n'}, line...)
	}
	return line
}

// LogAttrs names the alias's target in the request's log line, and the
// provider's content type when it was not passed on.
func (r *relay) LogAttrs() []slog.Attr {
	var attrs []slog.Attr
	if r.target != "" {
		attrs = append(attrs, slog.String("target", r.target))
	}
	if r.refusedType != "" {
		attrs = append(attrs, slog.String("provider_content_type_refused", r.refusedType))
	}
	return attrs
}
