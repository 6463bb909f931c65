package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// apiSpec is one of the Edge's client APIs the bench measures.
type apiSpec struct {
	Key   string // "ollama" or "openai": the -apis flag, file names, JSON
	Label string // how the report names it
	Path  string // the streaming chat endpoint
	Way   string // how the Edge serves it, for the report
	SSE   bool   // server-sent events (OpenAI) rather than NDJSON lines (Ollama)
	// Floor: not an Edge API but quicfloor, the transport's floor (floor.go).
	Floor bool
}

var (
	// apiOllama is Ollama's /api/chat, which the Edge relays through the
	// raw provider tunnel: the plugin forwards the body to the provider
	// and its NDJSON answer back, byte for byte.
	apiOllama = apiSpec{Key: "ollama", Label: "ollama (tunnel)", Path: "/api/chat",
		Way: "relayed as is through the ollama provider's raw tunnel"}
	// apiOpenAI is OpenAI's /v1/chat/completions with "stream": true: a
	// normalized run, which the Node's ollama adapter turns into an Ollama
	// /api/chat call, and whose events the Edge writes as SSE chunks.
	apiOpenAI = apiSpec{Key: "openai", Label: "openai (normalized)", Path: "/v1/chat/completions", SSE: true,
		Way: `"stream": true, a normalized run: Edge → QUIC → Node → ollama plugin → fake's /api/chat`}
	// apiFloor is not IOP: the fake's /api/chat through quicfloor, a bare
	// TCP-over-QUIC relay of two processes with IOP's QUIC configuration
	// and no IOP code (issue 25). What it adds is what quic-go itself costs
	// here, beside which the tunnel's figures show IOP's own part.
	apiFloor = apiSpec{Key: "floor", Label: "floor (bare quic-go relay)", Path: "/api/chat", Floor: true,
		Way: "TCP bytes over one quic-go connection between two processes (quicfloor), no IOP code: the transport's floor"}
	allAPIs = []apiSpec{apiOllama, apiOpenAI, apiFloor}
)

// apiByKey returns the API named key.
func apiByKey(key string) (apiSpec, bool) {
	for _, a := range allAPIs {
		if a.Key == key {
			return a, true
		}
	}
	return apiSpec{}, false
}

// side is one way a workload's requests go: straight to the fake Ollama
// ("direct", always Ollama's API) or through the Edge with one of its APIs.
type side struct {
	name string // "direct", or the API's label
	api  apiSpec
	base string // POST base+api.Path
}

// streamResult is what the client saw of one streamed answer.
type streamResult struct {
	ttfb   time.Duration // request sent → first token
	total  time.Duration // request sent → terminal
	tokens int
	maxGap time.Duration // the largest gap between two consecutive token (or terminal) lines
	done   bool          // the answer ended with its normal terminal
	text   []byte        // the answer's text, when asked for
}

// open sends a streaming chat request for model; prompt marks it in the
// fake's records. Both APIs take the same body.
func open(ctx context.Context, c *http.Client, s side, model, prompt string) (*http.Response, error) {
	body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+s.api.Path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s %s", s.name, resp.Status, bytes.TrimSpace(b.Bytes()))
	}
	return resp, nil
}

// read reads the stream of resp, sent at start, until its terminal, or
// until limit tokens when limit > 0; keepText keeps the answer's text.
// Lines are classified by substring, not decoded, so that the client's own
// CPU stays small beside the relay's.
func read(resp *http.Response, s side, start time.Time, limit int, keepText bool) (streamResult, error) {
	var r streamResult
	var p parser = &ndjsonParser{}
	if s.api.SSE {
		p = &sseParser{}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	last := start
	for sc.Scan() {
		now := time.Now()
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		ev, err := p.line(line)
		if err != nil {
			return r, fmt.Errorf("%s: %w", s.name, err)
		}
		if ev.tokens == 0 && !ev.terminal {
			continue // an SSE comment (keep-alive) or a role-only chunk
		}
		if r.tokens > 0 {
			r.maxGap = max(r.maxGap, now.Sub(last))
		}
		last = now
		if ev.tokens > 0 {
			if r.tokens == 0 {
				r.ttfb = now.Sub(start)
			}
			r.tokens += ev.tokens
			if keepText {
				r.text = append(r.text, ev.content...)
			}
			if limit > 0 && r.tokens >= limit {
				return r, nil
			}
		}
		if ev.terminal {
			r.total, r.done = now.Sub(start), true
			return r, nil
		}
	}
	if err := sc.Err(); err != nil {
		return r, fmt.Errorf("%s: reading the stream: %w", s.name, err)
	}
	return r, fmt.Errorf("%s: the stream ended after %d tokens without its terminal", s.name, r.tokens)
}

// stream runs one whole streamed answer.
func stream(ctx context.Context, c *http.Client, s side, model, prompt string, keepText bool) (streamResult, error) {
	start := time.Now()
	resp, err := open(ctx, c, s, model, prompt)
	if err != nil {
		return streamResult{}, err
	}
	defer resp.Body.Close()
	r, err := read(resp, s, start, 0, keepText)
	if err == nil {
		// Read to EOF: the Edge ends the response when the run's terminal
		// is in, and only then is the capacity slot free.
		_, err = io.Copy(io.Discard, resp.Body)
	}
	return r, err
}

// lineEvent is what one line of an answer carries.
type lineEvent struct {
	tokens   int
	content  []byte // the tokens' text (aliases the line)
	terminal bool   // the answer's normal end
}

// parser classifies the lines of one answer.
type parser interface {
	line(b []byte) (lineEvent, error)
}

var (
	doneFalse    = []byte(`"done":false`)
	doneTrue     = []byte(`"done":true`)
	errorKey     = []byte(`"error"`)
	contentKey   = []byte(`"content":"`)
	finishKey    = []byte(`"finish_reason":"`)
	sseData      = []byte("data: ")
	sseDone      = []byte("[DONE]")
	sseErrorData = []byte(`{"error"`)
)

// ndjsonParser reads Ollama's /api/chat: one line per token, ending with a
// "done":true line; an {"error"} line is an error.
type ndjsonParser struct{}

func (ndjsonParser) line(b []byte) (lineEvent, error) {
	switch {
	case bytes.Contains(b, doneFalse):
		return lineEvent{tokens: 1, content: content(b)}, nil
	case bytes.Contains(b, doneTrue):
		return lineEvent{terminal: true}, nil
	case bytes.Contains(b, errorKey):
		return lineEvent{}, fmt.Errorf("error line %s", b)
	}
	return lineEvent{}, nil
}

// sseParser reads OpenAI's streamed chat completion: "data: {chunk}"
// events, a chunk with a finish_reason, then "data: [DONE]"; comment lines
// (": keep-alive") are ignored and an error event is an error. Tokens are
// counted by the words of the content deltas: the fake's tokens are one
// word each (with the space before it), so this is one per delta as the
// Edge writes them today, and still right should a relay ever carry
// several tokens in one chunk.
type sseParser struct {
	words    int  // tokens seen so far
	finished bool // a chunk with a finish_reason was seen
}

func (p *sseParser) line(b []byte) (lineEvent, error) {
	data, ok := bytes.CutPrefix(b, sseData)
	if !ok {
		return lineEvent{}, nil // a comment or a field the bench does not use
	}
	switch {
	case bytes.Equal(data, sseDone):
		if !p.finished {
			return lineEvent{}, fmt.Errorf("[DONE] without a chunk carrying a finish_reason")
		}
		return lineEvent{terminal: true}, nil
	case bytes.HasPrefix(data, sseErrorData):
		return lineEvent{}, fmt.Errorf("error event %s", data)
	}
	if bytes.Contains(data, finishKey) {
		p.finished = true
	}
	c := content(data)
	if len(c) == 0 {
		return lineEvent{}, nil
	}
	n := bytes.Count(c, []byte{' '})
	if p.words == 0 && c[0] != ' ' {
		n++
	}
	p.words += n
	return lineEvent{tokens: n, content: c}, nil
}

// content is the string value of the first "content" key of a line, as
// written (the fake's words need no escapes); nil when absent or empty.
func content(b []byte) []byte {
	i := bytes.Index(b, contentKey)
	if i < 0 {
		return nil
	}
	rest := b[i+len(contentKey):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return nil
	}
	return rest[:j]
}
