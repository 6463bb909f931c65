package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// MaxLineBytes bounds one NDJSON line of Ollama's answer. A longer line
// fails the run with a clear error instead of growing without bound.
const MaxLineBytes = 16 << 20

// drainGrace bounds how long a finished answer's trailing bytes are read so
// that its connection can be reused.
const drainGrace = 100 * time.Millisecond

// Execute runs req through Ollama's streaming /api/chat. It sends the
// answer's thinking, text and tool calls as they arrive, then the final
// usage, and returns the done line's reason and usage. An {"error"} line,
// an HTTP error or a stream that ends without its done line fails the run;
// a stream that just stops is never taken for success. A forced tool call
// comes whole at the end instead of the text (forced.go).
func (a *Adapter) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	s := a.cfg.Load()
	c, err := buildChat(req, s)
	if err != nil {
		return nil, err
	}
	body, err := c.encode()
	if err != nil {
		return nil, err
	}
	res, err := a.stream(ctx, s, "chat", body, req.Credential, out, c.forced)
	for c.relaxThink {
		think, again := relaxedThink(c.req.Think, err)
		if !again {
			break
		}
		c.req.Think = think
		if body, err = c.encode(); err != nil {
			return nil, err
		}
		res, err = a.stream(ctx, s, "chat", body, req.Credential, out, c.forced)
	}
	return res, err
}

// relaxedThink returns the think to send the run again with after Ollama
// refused think (err), and whether to: a level refused by a model that
// takes none (400 "think value \"high\" is not supported for this model",
// Ollama 0.11 to 0.17.6, for models other than gpt-oss) goes again as
// true; thinking refused by a model that cannot think (400 "<model> does
// not support thinking") goes again without think.
//
// Such a refusal of a think the adapter mapped from the run's reasoning
// options is not the run's failure: the model answers as near to the
// level asked as it can, as Ollama's own Anthropic API does for clients
// (coding agents) that ask every model to think. The refusal comes before
// any answer, so nothing was sent to the host; it costs a round trip per
// step down (at most two), not a model load. A think the client set
// itself in Ollama's vocabulary (Extra's) is Ollama's to refuse.
func relaxedThink(think json.RawMessage, err error) (json.RawMessage, bool) {
	var e *sdk.Error
	if len(think) == 0 || !errors.As(err, &e) || e.UpstreamStatus != http.StatusBadRequest {
		return nil, false
	}
	switch {
	case strings.Contains(e.Message, "does not support thinking"):
		return nil, true
	case strings.Contains(e.Message, "is not supported for this model") && think[0] == '"':
		return json.RawMessage("true"), true
	}
	return nil, false
}

// stream posts body (JSON) to op's streaming endpoint, /api/<op>, and
// relays the NDJSON answer (readLines); forced, when set, is the tool call
// the answer is read as.
func (a *Adapter) stream(ctx context.Context, s *settings, op string, body []byte, cred *sdk.Credential, out sdk.EventSink,
	forced *forcedCall) (*sdk.Result, error) {
	// reqCtx ends the upstream request with the run, or once the answer is
	// complete and its trailing bytes have had drainGrace to arrive.
	reqCtx, cancelReq := context.WithCancel(ctx)
	defer cancelReq()
	hreq, err := a.newRequest(reqCtx, s, http.MethodPost, "/api/"+op, body, cred)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := a.client.Do(hreq)
	if err != nil {
		return nil, sendError(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, statusError(op, resp)
	}

	res, err := readLines(ctx, op, resp.Body, out, forced)
	if err == nil {
		t := time.AfterFunc(drainGrace, cancelReq)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		t.Stop()
	}
	return res, err
}

// readLines reads op's NDJSON answer (/api/chat's message pieces, or
// /api/generate's response pieces) line by line as it arrives, sending one
// event per piece, and returns at the done line. With forced, the text is
// kept, not sent, and read as the forced call at the done line.
func readLines(ctx context.Context, op string, body io.Reader, out sdk.EventSink, forced *forcedCall) (*sdk.Result, error) {
	sc := bufio.NewScanner(body)
	// Every run in flight holds its scanner, also through a silent
	// prefill: start at a few lines' size and grow (doubling) only for a
	// long one, such as /api/generate's final line with its context.
	sc.Buffer(make([]byte, 0, 4<<10), MaxLineBytes)
	calls := 0
	var kept strings.Builder // a forced call's text
	send := func(ev sdk.Event) error {
		if err := out.Send(ctx, ev); err != nil {
			return fmt.Errorf("ollama %s: %w", op, err)
		}
		return nil
	}
	for sc.Scan() {
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var line chatLine
		if err := json.Unmarshal(raw, &line); err != nil {
			return nil, sdk.Errorf(sdk.KindUpstream, "ollama %s: malformed answer line: %v", op, err)
		}
		if line.Error != "" {
			return nil, sdk.Errorf(sdk.KindUpstream, "ollama %s: %s", op, line.Error)
		}
		if t := line.Message.Thinking + line.Thinking; t != "" {
			if err := send(sdk.Event{Kind: sdk.ReasoningDelta, Text: t}); err != nil {
				return nil, err
			}
		}
		if t := line.Message.Content + line.Response; t != "" {
			if forced != nil {
				if kept.Len()+len(t) > MaxLineBytes {
					return nil, sdk.Errorf(sdk.KindUpstream, "ollama %s: a forced tool call's answer exceeds %d MiB", op, MaxLineBytes>>20)
				}
				kept.WriteString(t)
			} else if err := send(sdk.Event{Kind: sdk.TextDelta, Text: t}); err != nil {
				return nil, err
			}
		}
		for _, tc := range line.Message.ToolCalls {
			call, err := completeCall(calls, tc)
			if err != nil {
				return nil, err
			}
			calls++
			if err := send(sdk.Event{Kind: sdk.ToolCallDelta, ToolCall: call}); err != nil {
				return nil, err
			}
		}
		if line.Done {
			if forced != nil {
				ev, err := forcedEvent(forced, calls, kept.String(), line.DoneReason)
				if err != nil {
					return nil, err
				}
				if ev != nil && ev.Kind == sdk.ToolCallDelta {
					calls++
				}
				if ev != nil {
					if err := send(*ev); err != nil {
						return nil, err
					}
				}
			}
			usage := line.usage()
			if err := send(sdk.Event{Kind: sdk.UsageReport, Usage: usage}); err != nil {
				return nil, err
			}
			return &sdk.Result{DoneReason: doneReason(line.DoneReason, calls), Usage: usage}, nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, sdk.Errorf(sdk.KindUpstream, "ollama %s: an answer line exceeds %d MiB", op, MaxLineBytes>>20)
		}
		return nil, readError(ctx, op, err)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("ollama %s: %w", op, ctx.Err())
	}
	return nil, sdk.Errorf(sdk.KindUpstream, "ollama %s: the answer ended without its done line", op)
}

// forcedEvent is the event that ends a forced call's answer, whose text is
// text: the call read from it; or, when Ollama recognised the call itself
// (calls > 0, already sent), the text as it is (nil when blank).
func forcedEvent(f *forcedCall, calls int, text, doneReason string) (*sdk.Event, error) {
	if calls > 0 {
		if strings.TrimSpace(text) == "" {
			return nil, nil
		}
		return &sdk.Event{Kind: sdk.TextDelta, Text: text}, nil
	}
	call, err := f.call(calls, text, doneReason)
	if err != nil {
		return nil, err
	}
	return &sdk.Event{Kind: sdk.ToolCallDelta, ToolCall: call}, nil
}

// completeCall turns one of Ollama's tool calls, which always arrive whole,
// into a ToolCallDelta's call: the n-th of the run, with Ollama's id or
// "call_<n>" when Ollama gives none, and the arguments as JSON text.
func completeCall(n int, tc toolCall) (*sdk.ToolCall, error) {
	args := "{}"
	if a := bytes.TrimSpace(tc.Function.Arguments); len(a) > 0 && string(a) != "null" {
		var buf bytes.Buffer
		if err := json.Compact(&buf, a); err != nil {
			return nil, sdk.Errorf(sdk.KindUpstream, "ollama chat: tool call %d has malformed arguments", n)
		}
		args = buf.String()
	}
	id := tc.ID
	if id == "" {
		id = "call_" + strconv.Itoa(n)
	}
	return &sdk.ToolCall{Index: n, ID: id, Name: tc.Function.Name, Arguments: args}, nil
}

// doneReason normalizes Ollama's done_reason: an answer that called tools
// and then stopped ended for "tool_calls" (Ollama says "stop"); anything
// else is Ollama's own word ("stop", "length", ...).
func doneReason(reason string, calls int) string {
	if calls > 0 && (reason == "stop" || reason == "") {
		return "tool_calls"
	}
	if reason == "" {
		return "stop"
	}
	return reason
}
