package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Raw completions and embeddings: Ollama's /api/generate and /api/embed.

// generateRequest is Ollama's /api/generate request, as far as a raw
// completion uses it.
type generateRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Suffix    string          `json:"suffix,omitempty"`
	Stream    bool            `json:"stream"`
	Raw       json.RawMessage `json:"raw,omitempty"`
	Format    json.RawMessage `json:"format,omitempty"`
	KeepAlive json.RawMessage `json:"keep_alive,omitempty"`
	Options   map[string]any  `json:"options,omitempty"`
	Think     json.RawMessage `json:"think,omitempty"`
	Truncate  json.RawMessage `json:"truncate,omitempty"`
	Shift     json.RawMessage `json:"shift,omitempty"`
}

// Complete runs a raw completion through Ollama's streaming /api/generate,
// with the prompt and the suffix (fill-in-the-middle, which Ollama does
// with the model's own template), the options as a chat run's (options.go;
// raw from Options.Extra), and streams the response as a chat's. A model
// without fill-in-the-middle ("does not support insert") fails a suffix
// with KindUnsupported.
func (a *Adapter) Complete(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	s := a.cfg.Load()
	if req.Target == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: the run has no target model")
	}
	gr := &generateRequest{Model: req.Target, Prompt: req.Prompt, Suffix: req.Suffix, Stream: true}
	var top topLevel
	var err error
	if gr.Options, top, err = options(req.Options); err != nil {
		return nil, err
	}
	gr.Think, gr.Truncate, gr.Shift, gr.KeepAlive, gr.Raw = top.think, top.truncate, top.shift, top.keepAlive, top.raw
	if s.keepAlive != nil {
		gr.KeepAlive = s.keepAlive
	}
	if gr.Format, err = format(req.Options.Format); err != nil {
		return nil, err
	}
	send := func() (*sdk.Result, error) {
		body, err := encodeWith(gr, top.rest)
		if err != nil {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: encode generate request: %w", err)
		}
		return a.stream(ctx, s, "generate", body, req.Credential, out, nil)
	}
	res, err := send()
	for top.relaxThink {
		think, again := relaxedThink(gr.Think, err) // as a chat's
		if !again {
			break
		}
		gr.Think = think
		res, err = send()
	}
	var e *sdk.Error
	if errors.As(err, &e) && e.Kind == sdk.KindInvalidRequest && strings.Contains(e.Message, "does not support insert") {
		e.Kind = sdk.KindUnsupported // the model has no fill-in-the-middle
	}
	return res, err
}

// embedRequest and embedResponse are Ollama's /api/embed shapes.
type (
	embedRequest struct {
		Model      string          `json:"model"`
		Input      []string        `json:"input"`
		Dimensions int             `json:"dimensions,omitempty"`
		Truncate   json.RawMessage `json:"truncate,omitempty"`
		KeepAlive  json.RawMessage `json:"keep_alive,omitempty"`
		Options    map[string]any  `json:"options,omitempty"`
	}
	embedResponse struct {
		Embeddings      [][]float32 `json:"embeddings"`
		TotalDuration   int64       `json:"total_duration"`
		LoadDuration    int64       `json:"load_duration"`
		PromptEvalCount int64       `json:"prompt_eval_count"`
	}
)

// maxEmbedBody bounds Ollama's /api/embed answer: the most values a
// result may have, at 32 bytes of JSON each.
const maxEmbedBody = wirepb.MaxEmbedValues * 32

// Embed computes embeddings through Ollama's /api/embed: the inputs, the
// dimensions, and from Options.Extra truncate, keep_alive, Ollama's
// options (a configured keep_alive wins) and the fields that are not
// Ollama's, at the top level, as for a chat (options.go).
func (a *Adapter) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	s := a.cfg.Load()
	opts, top, err := options(sdk.Options{Extra: req.Extra})
	if err != nil {
		return nil, err
	}
	er := embedRequest{Model: req.Target, Input: req.Inputs, Dimensions: req.Dimensions, Truncate: top.truncate,
		KeepAlive: top.keepAlive, Options: opts}
	if s.keepAlive != nil {
		er.KeepAlive = s.keepAlive
	}
	body, err := encodeWith(er, top.rest)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: encode embed request: %w", err)
	}
	hreq, err := a.newRequest(ctx, s, http.MethodPost, "/api/embed", body, req.Credential)
	if err != nil {
		return nil, err
	}
	resp, err := a.client.Do(hreq)
	if err != nil {
		return nil, sendError(ctx, "embed", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, statusError("embed", resp)
	}
	var answer embedResponse
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxEmbedBody))
	if err := dec.Decode(&answer); err != nil {
		if ctx.Err() != nil {
			return nil, readError(ctx, "embed", err)
		}
		return nil, sdk.Errorf(sdk.KindUpstream, "ollama embed: malformed answer: %v", err)
	}
	return &sdk.EmbedResult{Vectors: answer.Embeddings, Usage: &sdk.Usage{PromptTokens: answer.PromptEvalCount,
		TotalDuration: time.Duration(answer.TotalDuration), LoadDuration: time.Duration(answer.LoadDuration)}}, nil
}
