package openaiapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/gateway"
	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// POST /v1/embeddings: a vector for each input, from a model whose provider
// computes embeddings (an adapter with the "embed" capability). It is not a
// run: the gateway dispatches an embedding call on its own stream, with a
// run's queueing, capacity, lease, failover and metrics, and the answer is
// written whole once the call has ended. input is a string or an array of
// strings (at most wirepb.MaxEmbedInputs, none empty); token arrays are
// refused, naming input. dimensions and encoding_format ("float", or
// "base64": each vector's little-endian float32 bytes) are OpenAI's. A
// model no provider embeds with is 400 unsupported; an unknown one 404
// model_not_found.

// routeEmbeddings is the route label of embeddings in metrics and logs.
const routeEmbeddings = "openai_embeddings"

// Embedder is what the embeddings endpoint needs from the gateway beside
// Runner; tests fake it. A Runner that is not an Embedder answers
// /v1/embeddings with 404 unknown_url.
type Embedder interface {
	// Embed computes req's embeddings for p on model, as
	// gateway.Gateway.Embed does. admitted is called when the call leaves
	// the queue with a slot, progress after each frame of vectors, both on
	// the caller's goroutine.
	Embed(ctx context.Context, p auth.Principal, model string, req *wirepb.EmbedRequest, admitted, progress func()) (*gateway.Embedding, error)
}

var _ Embedder = gatewayRunner{}

func (gr gatewayRunner) Embed(ctx context.Context, p auth.Principal, model string, req *wirepb.EmbedRequest, admitted, progress func()) (*gateway.Embedding, error) {
	return gr.g.Embed(ctx, p, model, req, admitted, progress)
}

// embeddingsRequest is the part of an embeddings request the Edge reads;
// the rest (user, a server's own fields) passes through.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int64          `json:"dimensions"`
	EncodingFormat *string         `json:"encoding_format"`
}

var embeddingsInterpreted = []string{"model", "input", "dimensions", "encoding_format"}

// parsedEmbeddings is an embeddings request ready to dispatch.
type parsedEmbeddings struct {
	model  string
	base64 bool
	req    *wirepb.EmbedRequest
}

// inputList is input's array form, bounded as it is decoded.
type inputList []json.RawMessage

func (l *inputList) UnmarshalJSON(b []byte) (err error) {
	*l, err = frontdoor.DecodeList[json.RawMessage](b, wirepb.MaxEmbedInputs, "input")
	return err
}

// parseEmbeddings decodes and validates an embeddings request. Its errors
// are *apiError: 400 naming the param, or 413.
func parseEmbeddings(body []byte) (*parsedEmbeddings, *apiError) {
	var req embeddingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	pe := &parsedEmbeddings{model: req.Model, req: &wirepb.EmbedRequest{}}
	var e *apiError
	if pe.req.Inputs, e = inputsOf(req.Input); e != nil {
		return nil, e
	}
	if d := req.Dimensions; d != nil {
		if *d < 1 || *d > wirepb.MaxEmbedDimensions {
			return nil, invalid("dimensions", "dimensions must be between 1 and %d, got %d.", wirepb.MaxEmbedDimensions, *d)
		}
		pe.req.Dimensions = uint32(*d)
	}
	if f := req.EncodingFormat; f != nil {
		switch *f {
		case "float":
		case "base64":
			pe.base64 = true
		default:
			return nil, invalid("encoding_format", "Unsupported encoding_format %q: expected \"float\" or \"base64\".", *f)
		}
	}
	if pe.req.ExtraJson, e = extraFieldsExcept(body, embeddingsInterpreted); e != nil {
		return nil, e
	}
	if n := proto.Size(pe.req); n > quicwire.MaxStreamFrameSize-wireHeadroom {
		return nil, tooLarge("The input is %d bytes once converted for the Node; the limit is %d.", n, quicwire.MaxStreamFrameSize-wireHeadroom)
	}
	return pe, nil
}

// inputsOf reads input: a string, or an array of strings, none empty.
func inputsOf(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, invalid("input", "You must provide an input.")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, invalid("input", "'$.input' is invalid: an input must not be empty.")
		}
		return []string{one}, nil
	}
	var list inputList
	if err := json.Unmarshal(raw, &list); err != nil {
		var le *frontdoor.ListTooLong
		if errors.As(err, &le) {
			return nil, invalid("input", "Too many inputs: at most %d are accepted.", le.Max)
		}
		return nil, invalid("input", "input must be a string or an array of strings.")
	}
	if len(list) == 0 {
		return nil, invalid("input", "[] is too short - 'input'")
	}
	inputs := make([]string, len(list))
	for i, item := range list {
		if json.Unmarshal(item, &inputs[i]) != nil {
			return nil, invalid("input", "Token arrays are not supported: send the input as text.")
		}
		if inputs[i] == "" {
			return nil, invalid("input", "'$.input[%d]' is invalid: an input must not be empty.", i)
		}
	}
	return inputs, nil
}

// embeddings serves POST /v1/embeddings, bounded as chat is (P3): the body
// within MaxRequestBytes and the door's memory, the model checked before
// the rest is decoded; the result within wirepb.MaxEmbedValues.
func (h *handler) embeddings(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	p, ok := h.authenticate(w, r, routeEmbeddings)
	if !ok {
		return
	}
	x := gateway.NewExchange(w, r, routeEmbeddings, h.metrics, h.log)
	x.Arrived, x.P = arrived, p
	var emb *gateway.Embedding
	end := func(e *apiError) {
		var f *gateway.Failure
		if e != nil {
			f = e.failure()
			if e != errGone {
				x.BeforeWrite()
				writeError(w, e)
			}
		}
		var attrs []slog.Attr
		if emb != nil {
			attrs = append(attrs, slog.String("embed_id", emb.ID), slog.String("node", emb.Node.NodeID))
		}
		x.Record("openai embeddings", "ok", f, false, attrs...)
	}
	embedder, ok := h.runner.(Embedder)
	if !ok {
		end(&apiError{status: http.StatusNotFound, typ: typeInvalidRequest, code: "unknown_url",
			message: "Unknown request URL: " + r.Method + " " + r.URL.Path + "."})
		return
	}
	body, err := h.door.ReadBody(w, r, MaxRequestBytes)
	if err != nil {
		end(bodyError(err))
		return
	}
	defer body.Release()
	peek, e := peekChat(body.Bytes)
	x.Model = peek.Model
	if e != nil {
		end(e)
		return
	}
	profile, err := h.runner.Profile(p, peek.Model)
	if err != nil {
		end(fromFailure(gateway.StartFailure(err, nil, peek.Model)))
		return
	}
	req, e := parseEmbeddings(body.Bytes)
	body.Release()
	if e != nil {
		end(e)
		return
	}

	ctx := x.Begin(time.Duration(profile.IdleTimeout))
	defer x.End()
	done := x.Active("embed")
	emb, err = embedder.Embed(ctx, p, req.model, req.req, x.Admitted, x.Wrote)
	done()
	switch {
	case err != nil:
		end(fromFailure(gateway.StartFailure(err, context.Cause(ctx), req.model)))
	case emb.Terminal.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED:
		end(fromFailure(gateway.RunFailure(emb.Terminal, context.Cause(ctx))))
	case !writeEmbeddings(x, req, emb):
		x.Stop(gateway.ErrClientGone)
		end(errGone)
	default:
		end(nil)
	}
}

// writeEmbeddings writes the answer, OpenAI's list of embedding objects
// and the usage, as it is encoded (a result may be tens of megabytes of
// JSON), each write with its deadline. It reports false when the client
// could not be written to.
func writeEmbeddings(x *gateway.Exchange, req *parsedEmbeddings, emb *gateway.Embedding) bool {
	x.FirstByte()
	x.W.Header().Set("Content-Type", "application/json")
	x.BeforeWrite()
	x.W.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(x, 64<<10)
	var b []byte
	b = append(b, `{"object":"list","data":[`...)
	var raw []byte
	for i, v := range emb.Vectors {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":"embedding","index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"embedding":`...)
		if req.base64 {
			raw = raw[:0]
			for _, f := range v.GetValues() {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = gateway.AppendValues(b, v)
		}
		b = append(b, '}')
		if _, err := bw.Write(b); err != nil {
			return false
		}
		b = b[:0]
	}
	prompt := emb.Terminal.GetUsage().GetPromptTokens()
	usage, _ := json.Marshal(struct {
		PromptTokens int64 `json:"prompt_tokens"`
		TotalTokens  int64 `json:"total_tokens"`
	}{prompt, prompt})
	model, _ := json.Marshal(req.model)
	b = append(append(append(append(append(b, `],"model":`...), model...), `,"usage":`...), usage...), "}\n"...)
	if _, err := bw.Write(b); err != nil {
		return false
	}
	return bw.Flush() == nil
}
