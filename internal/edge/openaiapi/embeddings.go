package openaiapi

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// POST /v1/embeddings: a vector for each input, from a model whose provider
// computes embeddings (an adapter with the "embed" capability). It is not a
// run: the dispatcher runs an embedding call on its own stream, with a
// run's queueing, capacity, lease, failover and metrics, and the answer is
// written whole once the call has ended. input is a string or an array of
// strings (at most wirepb.MaxEmbedInputs, none empty); token arrays are
// refused, naming input. dimensions and encoding_format ("float", or
// "base64": each vector's little-endian float32 bytes) are OpenAI's. A
// model no provider embeds with is 400 unsupported; an unknown one 404
// model_not_found.

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

// parseEmbeddings decodes and validates an embeddings request: 400 naming
// the param at fault.
func parseEmbeddings(body []byte) (*parsedEmbeddings, *frontend.Failure) {
	var req embeddingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	pe := &parsedEmbeddings{model: req.Model, req: &wirepb.EmbedRequest{}}
	var e *frontend.Failure
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
	return pe, nil
}

// inputsOf reads input: a string, or an array of strings, none empty.
func inputsOf(raw json.RawMessage) ([]string, *frontend.Failure) {
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

// translateEmbeddings makes an embeddings request's call, answered whole
// once it ends, within wirepb.MaxEmbedValues.
func translateEmbeddings(t *frontend.Turn) (frontend.Job, *frontend.Failure) {
	req, f := parseEmbeddings(t.Body)
	if f != nil {
		return nil, f
	}
	return &frontend.EmbedJob{Embed: req.req, Out: func(resp *frontend.Response, e *dispatch.Embedding) bool {
		return writeEmbeddings(resp, req, e)
	}}, nil
}

// writeEmbeddings writes the answer, OpenAI's list of embedding objects
// and the usage, as it is encoded (a result may be tens of megabytes of
// JSON), each write with its deadline. It reports false when the client
// could not be written to.
func writeEmbeddings(resp *frontend.Response, req *parsedEmbeddings, emb *dispatch.Embedding) bool {
	resp.Relay(http.StatusOK, func(h http.Header) { h.Set("Content-Type", "application/json") })
	bw := bufio.NewWriterSize(resp, 64<<10)
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
			b = frontend.AppendValues(b, v)
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
