package ollamaapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Embeddings over every provider (SPEC P2, issue 12). A model one of whose
// candidates is an Ollama server is tunnelled to it (tunnel.go); any other
// model answers /api/embed and the legacy /api/embeddings through an
// embedding call of the gateway (on an adapter with the "embed"
// capability), written back in Ollama's shapes: {"model","embeddings",
// durations, prompt_eval_count}, and {"embedding"} for the legacy
// endpoint. input is a string or an array of strings (at most
// wirepb.MaxEmbedInputs); dimensions is passed on; truncate and options
// pass through to the provider. A call without input is Ollama's "load the
// model": answered with no embeddings once the model can be scheduled.

// Embedder is what the embed endpoints need from the gateway beside
// Runner; tests fake it. A Runner that is not an Embedder tunnels every
// embed request, as before.
type Embedder interface {
	// Embed computes req's embeddings for p on model, as
	// gateway.Gateway.Embed does.
	Embed(ctx context.Context, p auth.Principal, model string, req *wirepb.EmbedRequest, admitted, progress func()) (*gateway.Embedding, error)
}

var _ Embedder = gatewayRunner{}

func (gr gatewayRunner) Embed(ctx context.Context, p auth.Principal, model string, req *wirepb.EmbedRequest, admitted, progress func()) (*gateway.Embedding, error) {
	return gr.g.Embed(ctx, p, model, req, admitted, progress)
}

type (
	// ollamaEmbed is the body of /api/embed.
	ollamaEmbed struct {
		Input      json.RawMessage `json:"input"`
		Dimensions int64           `json:"dimensions"`
		Truncate   json.RawMessage `json:"truncate"`
		Options    json.RawMessage `json:"options"`
	}
	// ollamaEmbeddings is the body of the legacy /api/embeddings.
	ollamaEmbeddings struct {
		Prompt  string          `json:"prompt"`
		Options json.RawMessage `json:"options"`
	}
	inputList []string
)

func (l *inputList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[string](b, wirepb.MaxEmbedInputs, "input")
	return err
}

// parseEmbed decodes an /api/embed or /api/embeddings body into an
// embedding call; a call without inputs (Ollama's load) has none.
func parseEmbed(route string, body []byte) (*wirepb.EmbedRequest, *apiError) {
	req := &wirepb.EmbedRequest{}
	extra := map[string]json.RawMessage{}
	if route == routeEmbeddings {
		var e ollamaEmbeddings
		if err := json.Unmarshal(body, &e); err != nil {
			return nil, invalid("%s", err.Error())
		}
		if e.Prompt != "" {
			req.Inputs = []string{e.Prompt}
		}
		setRaw(extra, "options", e.Options)
	} else {
		var e ollamaEmbed
		if err := json.Unmarshal(body, &e); err != nil {
			return nil, invalid("%s", err.Error())
		}
		var one string
		var list inputList
		in := e.Input
		switch {
		case len(in) == 0 || string(in) == "null":
		case json.Unmarshal(in, &one) == nil:
			if one != "" {
				req.Inputs = []string{one}
			}
		case json.Unmarshal(in, &list) == nil:
			for i, s := range list {
				if s == "" {
					return nil, invalid("input[%d] is empty", i)
				}
			}
			req.Inputs = list
		default:
			var le *frontdoor.ListTooLong
			if errors.As(json.Unmarshal(in, &list), &le) {
				return nil, invalid("too many inputs: at most %d are accepted", le.Max)
			}
			return nil, invalid("invalid input type")
		}
		if e.Dimensions < 0 || e.Dimensions > wirepb.MaxEmbedDimensions {
			return nil, invalid("dimensions must be between 0 and %d", wirepb.MaxEmbedDimensions)
		}
		req.Dimensions = uint32(e.Dimensions)
		setRaw(extra, "truncate", e.Truncate)
		setRaw(extra, "options", e.Options)
	}
	if len(extra) > 0 {
		req.ExtraJson, _ = json.Marshal(extra)
	}
	if n := proto.Size(req); n > quicwire.MaxStreamFrameSize-runHeadroom {
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			message: "the input is " + strconv.Itoa(n) + " bytes once converted for the Node; the limit is " + strconv.Itoa(quicwire.MaxStreamFrameSize-runHeadroom)}
	}
	return req, nil
}

// setRaw sets extra[name] to v unless v is absent or null.
func setRaw(extra map[string]json.RawMessage, name string, v json.RawMessage) {
	if len(v) > 0 && string(v) != "null" {
		extra[name] = v
	}
}

// serveEmbed answers /api/embed or /api/embeddings for a model no Ollama
// server serves, through an embedding call. It returns how the request
// ended: nil for success.
func (x *exchange) serveEmbed(embedder Embedder, profile edgeconfig.Profile, body *frontdoor.Body) *apiError {
	req, e := parseEmbed(x.Route, body.Bytes)
	body.Release()
	if e != nil {
		return e
	}
	x.embedding = true
	if len(req.GetInputs()) == 0 {
		// Ollama's "load the model": nothing to embed. The model must be
		// one a request could be scheduled for now.
		if err := x.h.runner.Available(x.P, x.Model); err != nil {
			return fromFailure(gateway.StartFailure(err, nil, x.Model))
		}
		return x.writeEmbeddings(&gateway.Embedding{Terminal: &wirepb.RunEvent{}})
	}
	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	done := x.Active("embed")
	emb, err := embedder.Embed(ctx, x.P, x.Model, req, x.Admitted, x.Wrote)
	done()
	switch {
	case err != nil:
		return fromFailure(gateway.StartFailure(err, context.Cause(ctx), x.Model))
	case emb.Terminal.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		return fromFailure(gateway.RunFailure(emb.Terminal, context.Cause(ctx)))
	}
	x.embedID = emb.ID
	return x.writeEmbeddings(emb)
}

// writeEmbeddings writes the answer in Ollama's shape as it is encoded,
// each write with its deadline.
func (x *exchange) writeEmbeddings(emb *gateway.Embedding) *apiError {
	x.started = true
	x.status = http.StatusOK
	x.FirstByte()
	x.W.Header().Set("Content-Type", "application/json; charset=utf-8")
	x.BeforeWrite()
	x.W.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(x.Exchange, 64<<10)
	var b []byte
	if x.Route == routeEmbeddings {
		b = append(b, `{"embedding":`...)
		if len(emb.Vectors) == 0 {
			b = append(b, "[]"...)
		} else {
			b = gateway.AppendValues(b, emb.Vectors[0])
		}
		b = append(b, "}"...)
	} else {
		model, _ := json.Marshal(x.Model)
		b = append(append(append(b, `{"model":`...), model...), `,"embeddings":[`...)
		for i, v := range emb.Vectors {
			if i > 0 {
				b = append(b, ',')
			}
			if b = gateway.AppendValues(b, v); len(b) >= 32<<10 {
				if _, err := bw.Write(b); err != nil {
					return errGone
				}
				b = b[:0]
			}
		}
		b = append(b, ']')
		u := emb.Terminal.GetUsage()
		for _, f := range []struct {
			name string
			v    int64
		}{{"total_duration", u.GetTotalDurationNs()}, {"load_duration", u.GetLoadDurationNs()}, {"prompt_eval_count", u.GetPromptTokens()}} {
			if f.v > 0 {
				b = strconv.AppendInt(append(append(append(b, `,"`...), f.name...), `":`...), f.v, 10)
			}
		}
		b = append(b, '}')
	}
	if _, err := bw.Write(b); err != nil {
		return errGone
	}
	if bw.Flush() != nil {
		return errGone
	}
	return nil
}
