package ollamaapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"net/textproto"
	"strconv"

	"github.com/iop-dev/iop/internal/jsonobj"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A streamed chat or generate answer ends with a line whose "done" is true
// (or with Ollama's {"error": ...} line). A provider stream that completes
// without one was cut short somewhere the tunnel could not see, and the
// official Ollama client takes a stream that just stops for a success; so
// the relay notes the last line as it passes and, at a completed end
// without that line, adds the error line itself (issue 10).

// maxJudgedLine bounds what is kept of a line to judge it: its head.
// Ollama's encoder writes "done" after "model", "created_at" and the
// message or response, which are empty in the final line, and before the
// long fields ("context", the counts): the head always holds it. A line
// whose head does not is judged not final.
const maxJudgedLine = 32 << 10

// ending is how a stream's last line ends it.
type ending int

const (
	endMissing ending = iota // no final line: the stream just stopped
	endDone                  // {"done": true, ...}
	endError                 // {"error": ...}: the provider's own failure
)

// lineWatch keeps the heads of a stream's last complete line and of the
// line in progress, at most maxJudgedLine bytes each. The hot path only
// looks for newlines and copies the bytes of the lines it keeps; the JSON
// of the last line is read once, at the end.
type lineWatch struct {
	last, cur []byte
	curCut    bool // cur lost bytes to maxJudgedLine
}

// watchesEnding reports whether the stream of head, an answer to route,
// is one that must end with a final line: a successful NDJSON chat or
// generate stream.
func watchesEnding(route string, head *wirepb.TunnelResponseHead) bool {
	if (route != routeChat && route != routeGenerate) || head.GetStatus() < 200 || head.GetStatus() > 299 {
		return false
	}
	for _, h := range head.GetHeaders() {
		if textproto.CanonicalMIMEHeaderKey(h.GetName()) == "Content-Type" {
			mt, _, err := mime.ParseMediaType(h.GetValue())
			return err == nil && mt == "application/x-ndjson"
		}
	}
	return false
}

// see notes the bytes of one read.
func (w *lineWatch) see(p []byte) {
	end := bytes.LastIndexByte(p, '\n')
	if end < 0 {
		w.keep(p)
		return
	}
	rest := p[end+1:]
	// Back over p's complete lines to the last that is not blank.
	for {
		start := bytes.LastIndexByte(p[:end], '\n') + 1
		if start == 0 { // the line began in an earlier read
			w.keep(p[:end])
			if !blank(w.cur) {
				w.last, w.cur = w.cur, w.last
			}
			break
		}
		if !blank(p[start:end]) {
			w.last = appendHead(w.last[:0], p[start:end])
			break
		}
		end = start - 1
	}
	w.cur, w.curCut = w.cur[:0], false
	w.keep(rest)
}

// keep adds p to the line in progress, up to maxJudgedLine.
func (w *lineWatch) keep(p []byte) {
	if len(w.cur)+len(p) > maxJudgedLine {
		w.curCut = true
	}
	w.cur = appendHead(w.cur, p)
}

// appendHead appends to dst what fits of p within maxJudgedLine.
func appendHead(dst, p []byte) []byte {
	return append(dst, p[:min(len(p), max(maxJudgedLine-len(dst), 0))]...)
}

// ending judges the stream's end. A line cut off by the end of the stream
// counts only if it is whole JSON: a final object without its newline.
func (w *lineWatch) ending() ending {
	if !blank(w.cur) {
		if w.curCut || !json.Valid(w.cur) {
			return endMissing
		}
		return judge(w.cur)
	}
	return judge(w.last)
}

// usage reads the token counts of the stream's final line (the line
// ending judges), Ollama's prompt_eval_count and eval_count: it runs once,
// at the end, never per line. ok is false when the line holds neither, or
// holds them past its kept head (a generate answer's "context", which
// comes before the counts, can be longer than maxJudgedLine): that answer
// is counted as a request, not in tokens.
func (w *lineWatch) usage() (prompt, completion int64, ok bool) {
	line := w.last
	if !blank(w.cur) {
		line = w.cur
	}
	_ = jsonobj.Members(line, func(key, value []byte) error {
		var dst *int64
		switch string(key) {
		case `"prompt_eval_count"`:
			dst = &prompt
		case `"eval_count"`:
			dst = &completion
		default:
			return nil
		}
		n, err := strconv.ParseInt(string(value), 10, 64)
		if err != nil {
			return err
		}
		*dst, ok = n, true
		return nil
	})
	return prompt, completion, ok
}

// judge reads the top-level members of a line (or its head) up to the
// first that decides it: "done" (true: final, otherwise not) or "error".
// The line's members are read where they lie (jsonobj): encoding/json's
// Decoder, read a token at a time, allocated an error for every value,
// for every answer. Keys are compared as written: Ollama escapes nothing
// in its own.
func judge(line []byte) ending {
	e := endMissing
	_ = jsonobj.Members(line, func(key, value []byte) error {
		switch string(key) {
		case `"done"`:
			if string(value) == "true" {
				e = endDone
			}
			return errJudged
		case `"error"`:
			if string(value) != "null" {
				e = endError
				return errJudged
			}
		}
		return nil
	})
	return e
}

// errJudged stops judge's reading once a member decided.
var errJudged = errors.New("judged")

// blank reports whether p is only white space.
func blank(p []byte) bool { return len(bytes.TrimSpace(p)) == 0 }
