package ollamaapi

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// The model listings (/api/tags, /api/ps) and /api/show for models that no
// Ollama server serves are made from the Edge's inventory (SPEC P1): the
// same list /v1/models and the scheduler read, so every screen agrees with
// the routing. An Ollama server's own entry (size, digest, details) is kept
// for a model it serves, under the name the client asks for; any other
// model gets an entry made from what is known.

// details is Ollama's model details (api.ModelDetails); unknown for a
// model no Ollama server serves.
type details struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// tagEntry is an entry of /api/tags (api.ListModelResponse) made from the
// inventory.
type tagEntry struct {
	Name       string    `json:"name"`
	Model      string    `json:"model"`
	ModifiedAt time.Time `json:"modified_at"`
	Size       int64     `json:"size"`
	Digest     string    `json:"digest"`
	Details    details   `json:"details"`
	// AsleepOn marks a model that only sleeping Nodes served (issue 23):
	// their ids. Ollama's list has no field that says a model is not
	// ready, and its clients pick a model by name from the list, so the
	// model is listed as any other (a request for it wakes a Node and
	// waits for it) and this field, which Ollama's clients ignore as
	// they ignore every field they do not know, tells a person or a
	// script reading the list why the first answer may take a while.
	AsleepOn []string `json:"asleep_on,omitempty"`
}

// psEntry is an entry of /api/ps (api.ProcessModelResponse) made from the
// inventory: a model an OpenAI-compatible server or the simulator serves
// is loaded as long as it is served.
type psEntry struct {
	Name      string    `json:"name"`
	Model     string    `json:"model"`
	Size      int64     `json:"size"`
	Digest    string    `json:"digest"`
	Details   details   `json:"details"`
	ExpiresAt time.Time `json:"expires_at"`
	SizeVRAM  int64     `json:"size_vram"`
}

// nodeEntries indexes the entries Ollama servers sent, by node, provider
// and the name each is listed under.
type nodeEntries map[[3]string]json.RawMessage

func (n nodeEntries) find(c sched.Candidate) (json.RawMessage, bool) {
	raw, ok := n[[3]string{c.NodeID, c.Provider, c.Target}]
	if !ok && !strings.Contains(c.Target, ":") {
		raw, ok = n[[3]string{c.NodeID, c.Provider, c.Target + ":latest"}]
	}
	return raw, ok
}

// listing answers /api/tags (running false) or /api/ps (running true):
// every model the principal may ask for and that can be served now (the
// inventory), with an Ollama server's own entry where one serves it,
// sorted by name. For ps, a model an Ollama server has loaded is listed
// once per server that has it (two processes); a model another kind of
// server serves is loaded while it is served.
func (h *handler) listing(path string, running bool) func(r *http.Request, p auth.Principal) (any, *frontend.Failure) {
	route := routeTags
	if running {
		route = routePS
	}
	return func(r *http.Request, p auth.Principal) (any, *frontend.Failure) {
		inv := h.d.Inventory(p)
		entries := nodeEntries{}
		if slices.ContainsFunc(inv, func(o dispatch.Offering) bool { return o.Has(Adapter) }) {
			replies, _ := h.fanOut(r, route, path) // failures are logged; their models get made entries
			for _, rep := range replies {
				var list modelList
				if rep.Err != nil || json.Unmarshal(rep.Body, &list) != nil {
					continue
				}
				for _, raw := range list.Models {
					if name := entryName(raw); name != "" {
						entries[[3]string{rep.NodeID, rep.Provider, name}] = raw
					}
				}
			}
		}
		out := modelList{Models: []json.RawMessage{}}
		for _, o := range inv {
			if running && (o.Reconnecting || len(o.Asleep) > 0) {
				// Served before the Edge restarted, its Nodes not back
				// yet, or by a sleeping Node only: a tag (asking for it
				// says retry, or wakes the Node), not running.
				continue
			}
			listed := false
			for _, c := range o.Candidates {
				if c.Adapter != Adapter {
					continue
				}
				raw, ok := entries.find(c)
				if !ok {
					continue
				}
				out.Models = append(out.Models, renamed(raw, o.ID))
				listed = true
				if !running {
					break // one entry per model; ps lists every process
				}
			}
			switch {
			case listed:
			case running && o.Has(Adapter):
				// An Ollama model that no server has loaded now is not running.
			case running:
				out.Models = append(out.Models, mustJSON(psEntry{Name: o.ID, Model: o.ID}))
			default:
				out.Models = append(out.Models, mustJSON(tagEntry{Name: o.ID, Model: o.ID, ModifiedAt: h.started, AsleepOn: o.Asleep}))
			}
		}
		slices.SortStableFunc(out.Models, func(a, b json.RawMessage) int { return cmp.Compare(entryName(a), entryName(b)) })
		return out, nil
	}
}

// renamed is an Ollama server's entry listed under name (an alias route's
// model, or the client's spelling of the tag), every other field as sent.
func renamed(raw json.RawMessage, name string) json.RawMessage {
	if entryName(raw) == name {
		return raw
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return raw
	}
	n, _ := json.Marshal(name)
	fields["name"], fields["model"] = n, n
	return mustJSON(fields)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil { // only our own types: a bug
		panic("ollamaapi: marshal: " + err.Error())
	}
	return b
}

// showAnswer is /api/show (api.ShowResponse) for a model no Ollama server
// serves: what the Edge knows, which is that it completes, with tools, and
// embeds when a provider of it can.
type showAnswer struct {
	Modelfile    string         `json:"modelfile"`
	Parameters   string         `json:"parameters"`
	Template     string         `json:"template"`
	Details      details        `json:"details"`
	ModelInfo    map[string]any `json:"model_info"`
	Capabilities []string       `json:"capabilities"`
	ModifiedAt   time.Time      `json:"modified_at"`
}

// show answers /api/show for a model that no Ollama server serves: 404
// for a model nobody offers, 503 for one known but unavailable, as a run
// would.
func (h *handler) show(t *frontend.Turn) frontend.Answer {
	return func(resp *frontend.Response) *frontend.Failure {
		if f := t.Unavailable(); f != nil {
			return f
		}
		caps := []string{"completion", "tools"}
		if slices.ContainsFunc(t.Candidates(), func(c sched.Candidate) bool { return slices.Contains(c.Capabilities, dispatch.CapEmbed) }) {
			caps = append(caps, "embedding")
		}
		if !shape.WriteJSON(resp, http.StatusOK, showAnswer{ModelInfo: map[string]any{}, Capabilities: caps, ModifiedAt: h.started}) {
			return frontend.FailClientGone
		}
		return nil
	}
}
