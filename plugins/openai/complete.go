package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Raw completions and embeddings: the server's own /completions and
// /embeddings.

// completionReserved are the body keys of a text completion that shape the
// answer the adapter reads: Options.Extra may not set them.
var completionReserved = map[string]bool{
	"model": true, "prompt": true, "suffix": true, "stream": true, "stream_options": true, "n": true, "echo": true,
}

// Complete runs a raw completion as a streaming text completion (POST
// {base_url}/completions with the prompt, the suffix, stream_options
// include_usage, the normalized options and Options.Extra's fields, as for
// chat), read like a chat's stream. A server that has no /completions (404
// or 405 that is not about the model) or that refuses the suffix (a 400
// that names it, as vLLM's "suffix is not currently supported") fails with
// KindUnsupported.
func (a *Adapter) Complete(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	c, err := a.config()
	if err != nil {
		return nil, err
	}
	if req.Target == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: the run names no target model")
	}
	body := map[string]any{
		"model":          req.Target,
		"prompt":         req.Prompt,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	}
	if req.Suffix != "" {
		body["suffix"] = req.Suffix
	}
	if err := setOptions(body, req.Options, completionReserved); err != nil {
		return nil, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: encode completion request: %w", err)
	}
	return a.stream(ctx, c, "/completions", b, req.Credential, out, func(resp *http.Response) error {
		return unsupportedEndpoint(resp, "completions", req.Suffix != "")
	})
}

// embeddingReserved are the body keys of an embeddings request that shape
// the answer the adapter reads.
var embeddingReserved = map[string]bool{"model": true, "input": true, "encoding_format": true, "dimensions": true}

// maxEmbedBody bounds an embeddings answer: the most values a result may
// have, at 32 bytes of JSON each.
const maxEmbedBody = wirepb.MaxEmbedValues * 32

// Embed computes embeddings with POST {base_url}/embeddings: the inputs,
// encoding_format float, the dimensions when asked for, and Options.Extra's
// fields (user, a server's own). The vectors are put in input order by
// their index. A server without /embeddings fails with KindUnsupported.
func (a *Adapter) Embed(ctx context.Context, req *sdk.EmbedRequest) (*sdk.EmbedResult, error) {
	c, err := a.config()
	if err != nil {
		return nil, err
	}
	body := map[string]any{"model": req.Target, "input": req.Inputs, "encoding_format": "float"}
	if req.Dimensions > 0 {
		body["dimensions"] = req.Dimensions
	}
	if err := mergeExtra(body, req.Extra, embeddingReserved); err != nil {
		return nil, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: encode embeddings request: %w", err)
	}
	resp, err := a.post(ctx, c, "/embeddings", b, req.Credential, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, unsupportedEndpoint(resp, "embeddings", false)
	}
	var answer struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage *wireUsage `json:"usage"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxEmbedBody)).Decode(&answer); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("openai: %w", ctx.Err())
		}
		return nil, sdk.Errorf(sdk.KindUpstream, "openai: malformed embeddings answer: %v", err)
	}
	sort.SliceStable(answer.Data, func(i, j int) bool { return answer.Data[i].Index < answer.Data[j].Index })
	res := &sdk.EmbedResult{}
	for i, d := range answer.Data {
		if d.Index != i {
			return nil, sdk.Errorf(sdk.KindUpstream, "openai: the embeddings answer has no vector at index %d", i)
		}
		res.Vectors = append(res.Vectors, d.Embedding)
	}
	if answer.Usage != nil {
		res.Usage = &sdk.Usage{PromptTokens: answer.Usage.PromptTokens}
	}
	return res, nil
}

// unsupportedEndpoint maps an error answer of the completions or
// embeddings endpoint as httpError does, except that a server without the
// endpoint (405, or a 404 that is not about the model) and a 400 that
// names a suffix the request carried are KindUnsupported: the server
// cannot do this kind of work, whatever the request.
func unsupportedEndpoint(resp *http.Response, endpoint string, suffix bool) error {
	err := httpError(resp)
	var e *sdk.Error
	if !errors.As(err, &e) {
		return err
	}
	msg := strings.ToLower(e.Message)
	switch {
	case resp.StatusCode == http.StatusMethodNotAllowed,
		resp.StatusCode == http.StatusNotFound && !strings.Contains(msg, "model"):
		e.Kind, e.Message = sdk.KindUnsupported, fmt.Sprintf("openai: the server has no /%s endpoint (%s)", endpoint, e.Message)
	case resp.StatusCode == http.StatusBadRequest && suffix && strings.Contains(msg, "suffix"):
		e.Kind = sdk.KindUnsupported
	}
	return e
}
