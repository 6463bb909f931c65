package ollamaapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontdoor"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Embeddings over every provider (SPEC P2, issue 12). A model one of whose
// candidates is an Ollama server is tunnelled to it (tunnel.go); any other
// model answers /api/embed and the legacy /api/embeddings through an
// embedding call (on an adapter with the "embed"
// capability), written back in Ollama's shapes: {"model","embeddings",
// durations, prompt_eval_count}, and {"embedding"} for the legacy
// endpoint. input is a string or an array of strings (at most
// wirepb.MaxEmbedInputs); dimensions is passed on; truncate and options
// pass through to the provider. A call without input is Ollama's "load the
// model": answered with no embeddings once the model can be scheduled.

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
func parseEmbed(route string, body []byte) (*wirepb.EmbedRequest, *frontend.Failure) {
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
	return req, nil
}

// setRaw sets extra[name] to v unless v is absent or null.
func setRaw(extra map[string]json.RawMessage, name string, v json.RawMessage) {
	if len(v) > 0 && string(v) != "null" {
		extra[name] = v
	}
}

// embedJob answers /api/embed or /api/embeddings for a model no Ollama
// server serves, through an embedding call. A call without input is
// Ollama's "load the model": answered with no embeddings once the model is
// one a request could be scheduled for now.
func embedJob(t *frontend.Turn, route string) (frontend.Job, *frontend.Failure) {
	req, f := parseEmbed(route, t.Body)
	if f != nil {
		return nil, f
	}
	model := t.Plan.Model
	if len(req.GetInputs()) == 0 {
		return frontend.Answer(func(resp *frontend.Response) *frontend.Failure {
			if f := t.Unavailable(); f != nil {
				return f
			}
			if !writeEmbeddings(resp, route, model, &dispatch.Embedding{Terminal: &wirepb.RunEvent{}}) {
				return frontend.FailClientGone
			}
			return nil
		}), nil
	}
	return &frontend.EmbedJob{Embed: req, Out: func(resp *frontend.Response, e *dispatch.Embedding) bool {
		return writeEmbeddings(resp, route, model, e)
	}}, nil
}

// writeEmbeddings writes the answer in Ollama's shape as it is encoded;
// it reports false when the client could not be written to.
func writeEmbeddings(resp *frontend.Response, route, model string, emb *dispatch.Embedding) bool {
	resp.Relay(http.StatusOK, func(h http.Header) { h.Set("Content-Type", shape.ContentType) })
	bw := bufio.NewWriterSize(resp, 64<<10)
	var b []byte
	if route == routeEmbeddings {
		b = append(b, `{"embedding":`...)
		if len(emb.Vectors) == 0 {
			b = append(b, "[]"...)
		} else {
			b = frontend.AppendValues(b, emb.Vectors[0])
		}
		b = append(b, "}"...)
	} else {
		name, _ := json.Marshal(model)
		b = append(append(append(b, `{"model":`...), name...), `,"embeddings":[`...)
		for i, v := range emb.Vectors {
			if i > 0 {
				b = append(b, ',')
			}
			if b = frontend.AppendValues(b, v); len(b) >= 32<<10 {
				if _, err := bw.Write(b); err != nil {
					return false
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
		return false
	}
	return bw.Flush() == nil
}
