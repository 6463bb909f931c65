package ollamaapi

// Running a management call on the providers it chose: a delete or copy
// answered whole once every Node has (runWhole), a pull or create
// streamed line by line with each Node's progress (runProgress).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// open starts the call on pt; a part refused while choosing is not
// started.
func (c *manageCall) open(ctx context.Context, pt *part, body []byte) (dispatch.TunnelStream, bool) {
	if pt.err != "" {
		return nil, false
	}
	req := &wirepb.TunnelRequest{Method: c.op.method, Path: c.op.path,
		Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/json"}}}
	ts, err := c.h.manager.Manager.Manage(ctx, pt.node, pt.provider, req, body)
	if err != nil {
		pt.err = err.Error()
		return nil, false
	}
	head, err := ts.Head()
	if err != nil {
		ts.Close()
		pt.err = err.Error()
		return nil, false
	}
	pt.status = int(head.GetStatus())
	if pt.status != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(ts, maxManageLine))
		ts.Close()
		pt.err = serverError(b, pt.status)
		return nil, false
	}
	return ts, true
}

// serverError is the message of a server's error answer: Ollama's
// {"error"}, else its text, else its status.
func serverError(b []byte, status int) string {
	var e errorBody
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	if s := strings.TrimSpace(string(b)); s != "" {
		return s
	}
	return fmt.Sprintf("status %d", status)
}

// runWhole runs a delete or copy on every part at once, and answers when
// all have.
func (c *manageCall) runWhole(body []byte) {
	var wg sync.WaitGroup
	for _, pt := range c.parts {
		wg.Go(func() {
			ts, ok := c.open(c.r.Context(), pt, body)
			if !ok {
				return
			}
			defer ts.Close()
			if _, err := io.Copy(io.Discard, io.LimitReader(ts, maxManageLine)); err != nil {
				pt.err = err.Error()
				return
			}
			pt.ok = true
		})
	}
	wg.Wait()
	c.conclude()
}

// event is one thing a part tells the writer: a line to pass on, or its
// end.
type event struct {
	line []byte
	end  bool
}

// runProgress runs a pull or create on every part at once: each part's
// lines are rewritten to name its Node and passed on as they come (with
// stream), then the one last line says how the whole call ended.
func (c *manageCall) runProgress(body []byte, stream bool) {
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	events := make(chan event, 4*len(c.parts))
	var wg sync.WaitGroup
	for _, pt := range c.parts {
		wg.Go(func() {
			defer func() {
				select {
				case events <- event{end: true}:
				case <-ctx.Done():
				}
			}()
			// A part that fails before its progress (a Node refused or
			// not reached, a server's error status) sends no line: should
			// every part fail so, the answer is an HTTP error, as Ollama
			// answers an error before output; otherwise the last line
			// names it.
			ts, ok := c.open(ctx, pt, body)
			if !ok {
				return
			}
			defer ts.Close()
			c.follow(ctx, pt, ts, events)
		})
	}
	// Until every part has ended, or the call has: a client gone, or one
	// that stopped reading (every Node's call is cancelled then, and the
	// parts end without sending).
wait:
	for ended := 0; ended < len(c.parts); {
		select {
		case ev := <-events:
			switch {
			case ev.end:
				ended++
			case stream:
				if !c.writeLine(ev.line) {
					cancel()
				}
			}
		case <-ctx.Done():
			break wait
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		c.outcome = "cancelled"
		return
	}
	c.conclude()
}

// pass sends a line to the writer, unless the call has ended.
func (c *manageCall) pass(ctx context.Context, events chan<- event, line []byte) bool {
	select {
	case events <- event{line: line}:
		return true
	case <-ctx.Done():
		return false
	}
}

// follow reads pt's progress to its end: each line rewritten to name its
// Node (rename); the server's error line fails the part, its success line
// makes it succeed.
func (c *manageCall) follow(ctx context.Context, pt *part, ts dispatch.TunnelStream, events chan<- event) {
	sc := bufio.NewScanner(ts)
	sc.Buffer(make([]byte, 0, 4<<10), maxManageLine)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		line, errMsg, success := rename(sc.Bytes(), pt.label)
		switch {
		case errMsg != "":
			pt.err = errMsg
		case success:
			pt.ok = true
		}
		if !c.pass(ctx, events, line) || errMsg != "" {
			return
		}
	}
	switch err := sc.Err(); {
	case pt.ok:
	case errors.Is(err, bufio.ErrTooLong):
		pt.err = fmt.Sprintf("a progress line longer than %d bytes", maxManageLine)
	case err != nil:
		pt.err = err.Error()
	default:
		pt.err = `the server's progress ended without "success"`
	}
	if ctx.Err() == nil && pt.err != "" {
		c.pass(ctx, events, statusLine(pt.label+": failed: "+pt.err))
	}
}

// rename is one progress line of a Node's server as the client gets it:
// its status prefixed with label, its digest made label's. An error line
// becomes a status line (the call's own last line tells the error); it is
// returned as errMsg. success reports the server's success line.
func rename(line []byte, label string) (out []byte, errMsg string, success bool) {
	var f map[string]json.RawMessage
	if json.Unmarshal(line, &f) != nil {
		return statusLine(label + ": " + string(line)), "", false
	}
	if msg := nameField(f, "error"); msg != "" {
		return statusLine(label + ": failed: " + msg), msg, false
	}
	status := nameField(f, "status")
	success = status == "success"
	f["status"] = mustJSON(label + ": " + status)
	if d := nameField(f, "digest"); d != "" {
		short, ok := strings.CutPrefix(d, "sha256:")
		if !ok {
			short = d
		}
		f["digest"] = mustJSON(label + " " + short[:min(12, len(short))])
	}
	return append(mustJSON(f), '\n'), "", success
}

// statusLine is a progress line of status alone.
func statusLine(status string) []byte {
	return append(mustJSON(map[string]string{"status": status}), '\n')
}

// conclude answers the call's outcome once every part has ended: success,
// or the failure naming each Node that failed and those that succeeded.
func (c *manageCall) conclude() {
	var failed, done []string
	statuses := map[int]bool{}
	for _, pt := range c.parts {
		if pt.ok && pt.err == "" {
			done = append(done, pt.label)
			continue
		}
		failed = append(failed, pt.label+": "+pt.err)
		statuses[pt.status] = true
	}
	if len(failed) == 0 {
		c.outcome = "ok"
		if c.op.progress {
			c.end(http.StatusOK, statusLine("success"))
			return
		}
		c.end(http.StatusOK, append(mustJSON(struct {
			Status string   `json:"status"`
			Nodes  []string `json:"nodes"`
		}{"success", done}), '\n'))
		return
	}
	c.outcome = "upstream"
	c.errMsg = fmt.Sprintf("%s %s failed on %s", c.op.verb, c.model, strings.Join(failed, "; "))
	if len(done) > 0 {
		c.errMsg += "; succeeded on " + strings.Join(done, ", ")
	}
	status := http.StatusBadGateway
	if len(statuses) == 1 {
		for s := range statuses {
			if s >= 400 {
				status = s
			}
		}
	}
	c.end(status, append(mustJSON(errorBody{Error: c.errMsg}), '\n'))
}

// refuse answers the call with status and Ollama's error body, before
// anything else was written; code is its outcome in metrics and the log.
func (c *manageCall) refuse(status int, code, msg string) {
	c.outcome, c.errMsg = code, msg
	c.end(status, append(mustJSON(errorBody{Error: msg}), '\n'))
}

// end writes the answer's last line: after a stream as one more line,
// else as the whole answer with status.
func (c *manageCall) end(status int, line []byte) {
	if c.committed {
		c.writeLine(line)
		return
	}
	c.committed = true
	c.w.Header().Set("Content-Type", shape.ContentType)
	c.w.WriteHeader(status)
	c.wd.Extend()
	_, _ = c.w.Write(line)
}

// writeLine writes one line of a progress stream, committing it (200,
// NDJSON) first; false when the client could not be written to.
func (c *manageCall) writeLine(line []byte) bool {
	if !c.committed {
		c.committed = true
		c.w.Header().Set("Content-Type", "application/x-ndjson")
		c.w.Header().Set("Cache-Control", "no-cache")
		c.w.Header().Set("X-Accel-Buffering", "no")
		c.w.WriteHeader(http.StatusOK)
	}
	c.wd.Extend()
	if _, err := c.w.Write(line); err != nil {
		return false
	}
	err := http.NewResponseController(c.w).Flush()
	return err == nil || errors.Is(err, http.ErrNotSupported)
}
