package ollamaapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/iop-dev/iop/internal/edge/frontend"
	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// TestLineWatchJudgesTheLastLine (R3, issue 10 item 8): the watcher keeps
// the stream's last line however the reads cut it, and judges only the
// top-level "done" and "error": a stream ends well with its done line or
// the provider's error line, and in every other way it just stopped.
func TestLineWatchJudgesTheLastLine(t *testing.T) {
	const (
		token = `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n"
		done  = `{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":3}` + "\n"
	)
	long := `{"model":"m","response":"","done":true,"context":[` + strings.Repeat("1,", maxJudgedLine) + `1]}` + "\n"
	tests := []struct {
		name  string
		reads []string
		want  ending
	}{
		{"done line", []string{token, token, done}, endDone},
		{"done line in one read with the rest", []string{token + token + done}, endDone},
		{"done line split across reads", []string{token + done[:10], done[10:40], done[40:]}, endDone},
		{"done line, then blank lines", []string{token, done + "\n", "  \n"}, endDone},
		{"done line without its newline", []string{token, strings.TrimSuffix(done, "\n")}, endDone},
		{"long done line", []string{token, long[:100], long[100:]}, endDone},
		{"provider's error line", []string{token, `{"error":"out of memory"}` + "\n"}, endError},
		{"stops after a token", []string{token, token}, endMissing},
		{"stops mid-line", []string{token, done[:30]}, endMissing},
		{"stops mid-line, a done line before", []string{done, token[:30]}, endMissing},
		{"long line cut off mid-way", []string{token, long[:len(long)-5]}, endMissing},
		{"nothing", nil, endMissing},
		{"done false", []string{`{"done":false}` + "\n"}, endMissing},
		{"done only inside a tool call", []string{`{"message":{"tool_calls":[{"function":{"arguments":{"done":true}}}]},"done":false}` + "\n"}, endMissing},
		{"done nested only", []string{`{"message":{"done":true}}` + "\n"}, endMissing},
		{"not JSON", []string{"done\n"}, endMissing},
		{"error null", []string{`{"error":null}` + "\n"}, endMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w lineWatch
			for _, r := range tt.reads {
				w.see([]byte(r))
			}
			if got := w.ending(); got != tt.want {
				t.Errorf("ending %d, want %d", got, tt.want)
			}
			if len(w.last) > maxJudgedLine || len(w.cur) > maxJudgedLine {
				t.Errorf("kept %d and %d bytes, more than %d", len(w.last), len(w.cur), maxJudgedLine)
			}
		})
	}
}

// TestOnlySuccessfulChatAndGenerateStreamsAreWatched: the final line is
// Ollama's contract for a 2xx NDJSON chat or generate answer; a single
// JSON answer, an error status and the other endpoints have none.
func TestOnlySuccessfulChatAndGenerateStreamsAreWatched(t *testing.T) {
	head := func(status int32, ct string) *wirepb.TunnelResponseHead {
		return &wirepb.TunnelResponseHead{Status: status, Headers: []*wirepb.Header{{Name: "content-type", Value: ct}}}
	}
	tests := []struct {
		route string
		head  *wirepb.TunnelResponseHead
		want  bool
	}{
		{routeChat, head(200, "application/x-ndjson"), true},
		{routeGenerate, head(200, "application/x-ndjson; charset=utf-8"), true},
		{routeChat, head(200, "application/json; charset=utf-8"), false},
		{routeChat, head(500, "application/x-ndjson"), false},
		{routeEmbed, head(200, "application/x-ndjson"), false},
		{routeShow, head(200, "application/x-ndjson"), false},
		{routeChat, &wirepb.TunnelResponseHead{Status: 200}, false},
	}
	for _, tt := range tests {
		if got := watchesEnding(tt.route, tt.head); got != tt.want {
			t.Errorf("%s %v: %v, want %v", tt.route, tt.head, got, tt.want)
		}
	}
}

// TestStreamWithoutDoneLineEndsWithAnErrorLine (R3: exactly one terminal
// outcome the client can see; issue 10 item 8): a chat or generate stream
// whose tunnel completes without the done line gets one more line, the
// error, on a line of its own, and is counted as incomplete_stream, never
// ok. A stream with its done line, or with the provider's own error line,
// is relayed as it is.
func TestStreamWithoutDoneLineEndsWithAnErrorLine(t *testing.T) {
	const tok = `{"model":"m1","response":"Hel","done":false}`
	ndjson := &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{{Name: "Content-Type", Value: "application/x-ndjson"}}}
	tests := []struct {
		name    string
		path    string
		pieces  []ft.Step
		want    string // the body; an error line at its end is checked apart
		err     bool   // the body ends with the incomplete_stream line
		outcome string
	}{
		{"chat stops after a token", "/api/chat", []ft.Step{ft.Line(tok), ft.Line(tok)}, tok + "\n" + tok + "\n", true, "incomplete_stream"},
		{"generate stops after a token", "/api/generate", []ft.Step{ft.Line(tok)}, tok + "\n", true, "incomplete_stream"},
		{"chat stops mid-line", "/api/chat", []ft.Step{ft.Line(tok), {Data: tok[:12]}}, tok + "\n" + tok[:12] + "\n", true, "incomplete_stream"},
		{"done line", "/api/chat", []ft.Step{ft.Line(tok), ft.Line(`{"model":"m1","done":true}`)}, tok + "\n" + `{"model":"m1","done":true}` + "\n", false, "ok"},
		{"provider's error line", "/api/generate", []ft.Step{ft.Line(tok), ft.Line(`{"error":"out of memory"}`)},
			tok + "\n" + `{"error":"out of memory"}` + "\n", false, "provider_error"},
		{"embed has no done line", "/api/embed", []ft.Step{ft.Line(`{"model":"m1","embeddings":[]}`)}, `{"model":"m1","embeddings":[]}` + "\n", false, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, &ft.Dispatcher{Head: ndjson, Pieces: tt.pieces})
			w := e.do(req(http.MethodPost, tt.path, `{"model":"m1","prompt":"hi","input":"a"}`))
			if w.Code != 200 {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			body, ok := strings.CutPrefix(w.Body.String(), tt.want)
			if !ok {
				t.Fatalf("body %q does not start with %q", w.Body, tt.want)
			}
			switch {
			case tt.err && errorTextOf(t, strings.TrimSuffix(body, "\n")) != frontend.IncompleteStream(missingDone).Message:
				t.Errorf("after the output %q, want the incomplete_stream error line", body)
			case tt.err && !strings.HasSuffix(body, "\n"):
				t.Errorf("the error line %q is not a whole line", body)
			case !tt.err && body != "":
				t.Errorf("%q added after the output", body)
			}
			route := map[string]string{"/api/chat": routeChat, "/api/generate": routeGenerate, "/api/embed": routeEmbed}[tt.path]
			if e.requests(t, route, tt.outcome) != 1 {
				t.Errorf("outcome %q not counted", tt.outcome)
			}
			if tt.outcome != "ok" && e.requests(t, route, "ok") != 0 {
				t.Error("counted ok")
			}
		})
	}
}

// TestEmptyStreamIsAnHTTPError: a stream that completes before its first
// byte had no output to follow, so its error is the HTTP answer.
func TestEmptyStreamIsAnHTTPError(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{})
	w := e.do(req(http.MethodPost, "/api/chat", chatBody))
	if w.Code != http.StatusBadGateway || errorTextOf(t, w.Body.String()) != frontend.IncompleteStream(missingDone).Message {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if e.requests(t, routeChat, "incomplete_stream") != 1 {
		t.Error("not counted as incomplete_stream")
	}
}

// TestSingleAnswerIsNotWatched: stream:false answers one JSON object with
// Content-Type application/json, done line or not; it passes as it is.
func TestSingleAnswerIsNotWatched(t *testing.T) {
	e := newEnv(t, &ft.Dispatcher{Head: &wirepb.TunnelResponseHead{Status: 200, Headers: []*wirepb.Header{
		{Name: "Content-Type", Value: "application/json; charset=utf-8"}}}, Pieces: []ft.Step{{Data: `{"model":"m1"}`}}})
	w := e.do(req(http.MethodPost, "/api/chat", chatBody))
	if w.Code != 200 || w.Body.String() != `{"model":"m1"}` || e.requests(t, routeChat, "ok") != 1 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// TestLineWatchReadsTheFinalLinesTokenCounts: the token counts of a
// streamed answer are its final line's prompt_eval_count and eval_count,
// read once at the end, however the reads cut the line; a line without
// them, or whose counts lie past the head kept of it, has none.
func TestLineWatchReadsTheFinalLinesTokenCounts(t *testing.T) {
	const (
		token = `{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n"
		done  = `{"model":"m","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,` +
			`"total_duration":5000,"prompt_eval_count":26,"prompt_eval_duration":100,"eval_count":298,"eval_duration":4000}` + "\n"
	)
	long := `{"model":"m","response":"","done":true,"context":[` + strings.Repeat("1,", maxJudgedLine) + `1],"prompt_eval_count":5,"eval_count":6}` + "\n"
	tests := []struct {
		name               string
		reads              []string
		prompt, completion int64
		ok                 bool
	}{
		{"done line", []string{token, token, done}, 26, 298, true},
		{"done line split across reads", []string{token + done[:50], done[50:120], done[120:]}, 26, 298, true},
		{"done line without its newline", []string{token, strings.TrimSuffix(done, "\n")}, 26, 298, true},
		{"cached prompt: no prompt_eval_count", []string{`{"done":true,"eval_count":4}` + "\n"}, 0, 4, true},
		{"no counts", []string{token, `{"done":true,"done_reason":"stop"}` + "\n"}, 0, 0, false},
		{"counts past the kept head", []string{token, long}, 0, 0, false},
		{"counts only nested", []string{`{"done":true,"message":{"eval_count":9}}` + "\n"}, 0, 0, false},
		{"not JSON", []string{"eval_count\n"}, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w lineWatch
			for _, r := range tt.reads {
				w.see([]byte(r))
			}
			p, c, ok := w.usage()
			if p != tt.prompt || c != tt.completion || ok != tt.ok {
				t.Errorf("usage %d, %d, %v; want %d, %d, %v", p, c, ok, tt.prompt, tt.completion, tt.ok)
			}
		})
	}
}

// Reading the final line allocates nothing: it runs once for every
// streamed answer, all of them at once when ten thousand answers end
// together (issue 25), where encoding/json's Decoder allocated an error per
// member read.
func TestTheFinalLineIsReadWithoutAllocating(t *testing.T) {
	var w lineWatch
	w.see([]byte(`{"model":"m","created_at":"2026-12-02T05:00:00Z","message":{"role":"assistant","content":""},"done":true,` +
		`"done_reason":"stop","total_duration":5000,"prompt_eval_count":26,"prompt_eval_duration":100,"eval_count":298,"eval_duration":4000}` + "\n"))
	if n := testing.AllocsPerRun(100, func() {
		if w.ending() != endDone {
			t.Fatal("not judged done")
		}
		if p, c, ok := w.usage(); p != 26 || c != 298 || !ok {
			t.Fatalf("usage %d, %d, %v", p, c, ok)
		}
	}); n != 0 {
		t.Errorf("%v allocations to read the final line, want 0", n)
	}
}

// FuzzMembersReadLikeEncodingJSON: on any line, judge and usage agree with
// reading the line's members a token at a time with encoding/json (how they
// read it before): the same ending, the same counts. Lines with escapes are
// left out (a key written with escapes is no member they read).
func FuzzMembersReadLikeEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{"done":true,"eval_count":3}`,
		`{"model":"m","message":{"role":"assistant","content":"Hi","tool_calls":[{"function":{"arguments":{"done":true}}}]},"done":false}`,
		`{"error":"out of memory"}`, `{"error":null,"done":true}`, `{"done":tru`, `{"prompt_eval_count":5.5,"eval_count":2}`,
		`{"a":[1,{"b":"}"}],"done" : true , "prompt_eval_count": -4}`, `[]`, `{}`, ``, `{"done"`, `{"eval_count":12`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		if strings.Contains(line, `\`) {
			t.Skip()
		}
		b := []byte(line)
		if got, want := judge(b), judgeByDecoder(b); got != want && json.Valid(b) {
			t.Errorf("judge(%q) = %d, encoding/json reads %d", line, got, want)
		}
		w := lineWatch{last: b}
		p, c, ok := w.usage()
		wp, wc, wok := usageByDecoder(b)
		if json.Valid(b) && (p != wp || c != wc || ok != wok) {
			t.Errorf("usage(%q) = %d, %d, %v; encoding/json reads %d, %d, %v", line, p, c, ok, wp, wc, wok)
		}
	})
}

// judgeByDecoder is judge as it was written with encoding/json's Decoder.
func judgeByDecoder(line []byte) ending {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return endMissing
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return endMissing
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return endMissing
		}
		switch key {
		case "done":
			if string(v) == "true" {
				return endDone
			}
			return endMissing
		case "error":
			if string(v) != "null" {
				return endError
			}
		}
	}
	return endMissing
}

// usageByDecoder is usage as it was written with encoding/json's Decoder.
func usageByDecoder(line []byte) (prompt, completion int64, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, 0, false
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			break
		}
		var dst any = new(json.RawMessage)
		switch key {
		case "prompt_eval_count":
			dst = &prompt
		case "eval_count":
			dst = &completion
		}
		if err := dec.Decode(dst); err != nil {
			break
		}
		ok = ok || key == "prompt_eval_count" || key == "eval_count"
	}
	return prompt, completion, ok
}
