package ollamaapi

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// An alias route maps the name a client asks for to a target of another
// name ("fast" served by "llama3.2:latest"). Ollama serves the model its
// body names, so the name goes to the provider rewritten, per candidate
// (a failover may pick one with another target), and the answer comes back
// with the client's name: the client does not see that it was an alias.
// A target that is the client's name, or its ":latest" twin, is the same
// model to Ollama and goes as sent.

// bodyFor makes the body for each candidate the dispatcher tries: the
// client's body, or for a target that is another model, the body with that
// target's name. r.target is left with the name the last body carries in
// place of the client's ("" when it carries the client's): the last call
// is for the candidate whose tunnel the dispatcher keeps.
func (r *relay) bodyFor(body []byte) dispatch.TunnelBody {
	var made []byte // the last rewrite, for madeFor
	var madeFor string
	return func(target string) ([]byte, error) {
		if sameModel(target, r.model) {
			r.target = ""
			return body, nil
		}
		r.target = target
		if made != nil && madeFor == target {
			return made, nil
		}
		b, err := withModel(body, target)
		if err != nil {
			return nil, err
		}
		made, madeFor = b, target
		return b, nil
	}
}

// sameModel reports whether Ollama takes target and model for one model:
// the same name, or one with the implicit ":latest" the other leaves out.
func sameModel(target, model string) bool {
	return sched.SameModel(target, model) || sched.SameModel(model, target)
}

// withModel returns body (a JSON object, as peekModel checked) with the
// model's name replaced by target: in "model", or in Ollama's deprecated
// "name" when "model" is empty (how peekModel chose it for /api/show).
// Every other member is kept as the client sent it, unknown ones included;
// members come out in sorted order, with insignificant whitespace gone.
func withModel(body []byte, target string) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, fmt.Errorf("ollamaapi: rewriting the model name: %w", err)
	}
	field := "model"
	var model string
	if raw, ok := members["model"]; !ok || json.Unmarshal(raw, &model) != nil || model == "" {
		field = "name"
	}
	name, err := json.Marshal(target)
	if err != nil {
		return nil, fmt.Errorf("ollamaapi: rewriting the model name: %w", err)
	}
	members[field] = name
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // the client's text goes as it was written
	if err := enc.Encode(members); err != nil {
		return nil, fmt.Errorf("ollamaapi: rewriting the model name: %w", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// renamer gives an aliased answer back the client's name: each line (or
// the one JSON object) that starts with {"model":"<target>" starts with
// {"model":"<client's name>" instead. It relies on Ollama's encoder, which
// writes "model" first in ChatResponse, GenerateResponse and EmbedResponse
// and does not indent; a line that does not start that way (an error, a
// show answer, a line of another shape) passes untouched. Lines may span
// reads, so the start of a line that could still be the prefix is held
// back until the read that settles it: at most len(from) bytes.
type renamer struct {
	from, to  []byte // {"model":"<target>" and {"model":"<client's name>"
	lineStart bool   // the next byte starts a line
	held      int    // bytes of from matched at the start of this line, not yet passed on
	out       []byte
}

func newRenamer(target, client string) *renamer {
	prefix := func(name string) []byte {
		b, _ := json.Marshal(name) // a string always marshals
		return append([]byte(`{"model":`), b...)
	}
	return &renamer{from: prefix(target), to: prefix(client), lineStart: true}
}

// rename returns p as the client gets it; the result is valid until the
// next call.
func (r *renamer) rename(p []byte) []byte {
	out := r.out[:0]
	for len(p) > 0 {
		if r.lineStart {
			n := min(len(r.from)-r.held, len(p))
			if bytes.Equal(p[:n], r.from[r.held:r.held+n]) {
				r.held += n
				p = p[n:]
				if r.held == len(r.from) {
					out = append(out, r.to...)
					r.held, r.lineStart = 0, false
				}
				continue
			}
			out = append(out, r.from[:r.held]...) // not the prefix after all
			r.held, r.lineStart = 0, false
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			out = append(out, p...)
			break
		}
		out = append(out, p[:i+1]...)
		p = p[i+1:]
		r.lineStart = true
	}
	r.out = out
	return out
}

// flush returns what is held back, at the end of the body.
func (r *renamer) flush() []byte {
	held := r.from[:r.held]
	r.held = 0
	return held
}
