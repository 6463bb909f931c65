package fakeollama

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakemodel"
)

// item is one line's worth of output: a thinking token, an answer token, or
// the model's tool calls.
type item struct {
	thinking, content string
	calls             []WireCall
}

// script is what a model will answer to one request.
type script struct {
	items      []item
	doneReason string
	prompt     int           // prompt_eval_count
	prefill    time.Duration // before the first line
}

// scriptFor lays out r as lines: thinking, then the content's tokens, then
// the tool calls in one line. num_predict (limit) cuts the tokens short
// with done_reason "length", as Ollama does; the calls are then not made.
func scriptFor(r reply, limit int, prompt int, prefill time.Duration) script {
	sc := script{doneReason: "stop", prompt: prompt, prefill: prefill}
	for _, t := range r.thinking {
		sc.items = append(sc.items, item{thinking: t})
	}
	for _, t := range r.content {
		sc.items = append(sc.items, item{content: t})
	}
	if limit > 0 && len(sc.items) > limit {
		sc.items = sc.items[:limit]
		sc.doneReason = "length"
		return sc
	}
	if len(r.calls) > 0 {
		sc.items = append(sc.items, item{calls: r.calls})
	}
	return sc
}

// sink receives a script as it plays: one NDJSON line per item when
// streaming, or one object at the end when not.
type sink interface {
	item(it item) error
	// fail ends the answer with an error: an {"error"} line once output
	// has started, an error status before.
	fail(msg string)
	done(reason string, m Metrics) error
}

// play runs sc against out with m's pace and failure knobs. It returns when
// the answer is complete, failed, or the client went away.
func (s *Server) play(ctx context.Context, m Model, sc script, out sink) {
	start := time.Now()
	if !s.sleep(ctx, sc.prefill) {
		return
	}
	prefill := time.Since(start)
	evalStart := time.Now()
	n := len(sc.items)
	for i := 0; i <= n; i++ {
		if m.Stall && i == min(m.StallAfter, n) {
			s.hang(ctx) // the stall: nothing more, connection kept open
			return
		}
		if m.ErrorMessage != "" && i == min(m.ErrorAfter, n) {
			out.fail(m.ErrorMessage)
			return
		}
		if i == n {
			break
		}
		if i > 0 && !s.sleep(ctx, m.TokenDelay) {
			return
		}
		if out.item(sc.items[i]) != nil {
			return
		}
	}
	if m.EndWithoutDone {
		return
	}
	evals := 0
	for _, it := range sc.items {
		evals += max(len(it.calls), 1)
	}
	_ = out.done(sc.doneReason, Metrics{
		TotalDuration:      nonZero(time.Since(start)),
		LoadDuration:       time.Microsecond,
		PromptEvalCount:    sc.prompt,
		PromptEvalDuration: nonZero(prefill),
		EvalCount:          evals,
		EvalDuration:       nonZero(time.Since(evalStart)),
	})
}

// lineWriter writes NDJSON lines, each flushed as soon as it is written.
type lineWriter struct{ w *recorder }

func (lw lineWriter) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if !lw.w.written() {
		lw.w.Header().Set("Content-Type", "application/x-ndjson")
	}
	if _, err := lw.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return lw.w.flush()
}

// fail follows Ollama's streamResponse: an error status and body before any
// output, an {"error"} line after.
func (lw lineWriter) fail(msg string) {
	if !lw.w.written() {
		writeError(lw.w, http.StatusInternalServerError, msg)
		return
	}
	_ = lw.line(errorBody{Error: msg})
}

func (s *Server) chat(ctx context.Context, w *recorder, body []byte) {
	var req ChatRequest
	if !decodeBody(w, body, &req) {
		return
	}
	think, err := parseThink(req.Think)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.rec.annotate(func(r *Request) { r.Think, r.Format = think.String(), nonNull(req.Format) })
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	m, ok := s.model(req.Model)
	if !ok {
		notFound(w, req.Model)
		return
	}
	done, ok := s.admit(ctx, w, m, req.Model, think.on, len(req.Messages) == 0, req.KeepAlive)
	if !ok {
		return
	}
	defer done()
	if len(req.Messages) == 0 {
		reason := "load"
		if keepAlive(req.KeepAlive) == 0 {
			reason = "unload"
		}
		writeJSON(w, http.StatusOK, ChatResponse{
			Model: req.Model, CreatedAt: time.Now().UTC(),
			Message: Message{Role: "assistant"}, Done: true, DoneReason: reason,
		})
		return
	}
	if m.refusesLevel(think) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("think value %q is not supported for this model", think.level))
		return
	}
	f, err := parseFormat(req.Format)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	tokens := chatTokens(req.Messages)
	r, err := m.chatReply(req, think, f, fakemodel.CallID(m.Name, string(body)))
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	var texts []string
	for _, msg := range req.Messages {
		texts = append(texts, msg.Content)
	}
	sc := s.prefill(w, m, r, numPredict(req.Options), countWords(texts...)+4*len(req.Messages), tokens)
	if req.Stream == nil || *req.Stream {
		s.play(ctx, m, sc, &chatStream{lineWriter{w}, req.Model})
		return
	}
	s.play(ctx, m, sc, &chatWhole{w: w, model: req.Model})
}

// prefill lays out r as a script whose prefill costs m's PrefillDelay and
// PrefillPerToken for every prompt token the prompt cache did not hold,
// and records the counts. prompt is the prompt's count (m's
// PromptEvalCount wins), tokens its token sequence.
func (s *Server) prefill(w *recorder, m Model, r reply, limit, prompt int, tokens fakemodel.Tokens) script {
	if m.PromptEvalCount > 0 {
		prompt = m.PromptEvalCount
	}
	cached := min(s.serveCache(m.Name, tokens), prompt)
	delay := fakemodel.Prefill(m.PrefillDelay, m.PrefillPerToken, prompt, cached)
	w.rec.annotate(func(rq *Request) { rq.PromptTokens, rq.CachedTokens, rq.Prefill = prompt, cached, delay })
	return scriptFor(r, limit, prompt, delay)
}

// nonNull is raw unless it is absent or JSON null.
func nonNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// admit applies the checks and knobs shared by chat and generate: think
// support, FailStatus, the model's place in memory (loading.go), load
// delay, and the /api/ps bookkeeping. It reports whether the request
// should be answered, and if so the function to call when it ends (the
// model is in use until then). A load request with keep_alive 0 unloads.
func (s *Server) admit(ctx context.Context, w http.ResponseWriter, m Model, name string, wantThink, load bool, ka json.RawMessage) (done func(), ok bool) {
	if wantThink && m.Thinking == "" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q does not support thinking", name))
		return nil, false
	}
	if m.FailStatus != 0 {
		writeError(w, m.FailStatus, m.FailMessage)
		return nil, false
	}
	if load && keepAlive(ka) == 0 {
		s.unload(m)
		return func() {}, true
	}
	done, ok = s.use(ctx, m, keepAlive(ka))
	if !ok {
		return nil, false
	}
	if load && !s.sleep(ctx, m.LoadDelay) {
		done()
		return nil, false
	}
	return done, true
}

type chatStream struct {
	lineWriter
	model string
}

func (c *chatStream) item(it item) error {
	return c.line(ChatResponse{
		Model: c.model, CreatedAt: time.Now().UTC(),
		Message: Message{Role: "assistant", Content: it.content, Thinking: it.thinking, ToolCalls: it.calls},
	})
}

func (c *chatStream) done(reason string, m Metrics) error {
	return c.line(ChatResponse{
		Model: c.model, CreatedAt: time.Now().UTC(), Message: Message{Role: "assistant"},
		Done: true, DoneReason: reason, Metrics: m,
	})
}

// chatWhole gathers a script into the single answer of stream:false.
type chatWhole struct {
	w       *recorder
	model   string
	content strings.Builder
	think   strings.Builder
	calls   []WireCall
}

func (c *chatWhole) item(it item) error {
	c.content.WriteString(it.content)
	c.think.WriteString(it.thinking)
	c.calls = append(c.calls, it.calls...)
	return nil
}

func (c *chatWhole) fail(msg string) { writeError(c.w, http.StatusInternalServerError, msg) }

func (c *chatWhole) done(reason string, m Metrics) error {
	writeJSON(c.w, http.StatusOK, ChatResponse{
		Model: c.model, CreatedAt: time.Now().UTC(),
		Message: Message{Role: "assistant", Content: c.content.String(), Thinking: c.think.String(), ToolCalls: c.calls},
		Done:    true, DoneReason: reason, Metrics: m,
	})
	return nil
}

func (s *Server) generate(ctx context.Context, w *recorder, body []byte) {
	var req GenerateRequest
	if !decodeBody(w, body, &req) {
		return
	}
	think, err := parseThink(req.Think)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.rec.annotate(func(r *Request) { r.Think, r.Format = think.String(), nonNull(req.Format) })
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	m, ok := s.model(req.Model)
	if !ok {
		notFound(w, req.Model)
		return
	}
	// Ollama checks a level before the model's capabilities (thinking,
	// insert) on generate.
	if m.refusesLevel(think) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("think value %q is not supported for this model", think.level))
		return
	}
	if req.Suffix != "" && m.NoInsert {
		writeError(w, http.StatusBadRequest, "does not support insert")
		return
	}
	done, ok := s.admit(ctx, w, m, req.Model, think.on, req.Prompt == "", req.KeepAlive)
	if !ok {
		return
	}
	defer done()
	if req.Prompt == "" {
		reason := "load"
		if keepAlive(req.KeepAlive) == 0 {
			reason = "unload"
		}
		writeJSON(w, http.StatusOK, GenerateResponse{
			Model: req.Model, CreatedAt: time.Now().UTC(), Done: true, DoneReason: reason,
		})
		return
	}
	f, err := parseFormat(req.Format)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	r, err := m.generateReply(think, f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	tokens := fakemodel.Tokens(nil).AppendText(req.System).AppendText(req.Prompt)
	sc := s.prefill(w, m, r, numPredict(req.Options), countWords(req.System, req.Prompt), tokens)
	g := &generateOut{lw: lineWriter{w}, model: req.Model, stream: req.Stream == nil || *req.Stream}
	s.play(ctx, m, sc, g)
}

// generateOut writes /api/generate's lines, or gathers them when stream is
// false.
type generateOut struct {
	lw       lineWriter
	model    string
	stream   bool
	response strings.Builder
	thinking strings.Builder
}

func (g *generateOut) item(it item) error {
	if !g.stream {
		g.response.WriteString(it.content)
		g.thinking.WriteString(it.thinking)
		return nil
	}
	return g.lw.line(GenerateResponse{
		Model: g.model, CreatedAt: time.Now().UTC(), Response: it.content, Thinking: it.thinking,
	})
}

func (g *generateOut) fail(msg string) {
	if !g.stream {
		writeError(g.lw.w, http.StatusInternalServerError, msg)
		return
	}
	g.lw.fail(msg)
}

func (g *generateOut) done(reason string, m Metrics) error {
	ctxLen := min(m.PromptEvalCount+m.EvalCount, 64)
	tokens := make([]int, ctxLen)
	for i := range tokens {
		tokens[i] = i + 1
	}
	resp := GenerateResponse{
		Model: g.model, CreatedAt: time.Now().UTC(), Done: true, DoneReason: reason,
		Context: tokens, Metrics: m,
	}
	if !g.stream {
		resp.Response, resp.Thinking = g.response.String(), g.thinking.String()
		writeJSON(g.lw.w, http.StatusOK, resp)
		return nil
	}
	return g.lw.line(resp)
}
