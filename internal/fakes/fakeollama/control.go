package fakeollama

import (
	"encoding/json"
	"net/http"
	"strings"
)

// The control API steers a fake that runs as its own process. It answers in
// every mode but ModeRefuse (then nothing listens), and its requests are not
// recorded.
//
//	GET    /_fake/requests       the recorded requests, as JSON (see Request)
//	GET    /_fake/concurrency    generation requests in flight now and at most (Concurrency)
//	POST   /_fake/reset          forget the recorded requests
//	PUT    /_fake/models         add or replace a model (a Model as JSON)
//	DELETE /_fake/models/{name}  remove a model
//	PUT    /_fake/mode           {"mode": "up" | "unavailable" | "reset" | "hang"}
//	PUT    /_fake/prompt-cache   {"prompts": N, "tokens": M}: a new, empty cache of those bounds
//	DELETE /_fake/prompt-cache   forget every prompt served (the next requests prefill cold)
//	PUT    /_fake/loading        {"max_loaded": N, "load_time": NANOSECONDS}: how models are held (Loading)
//	GET    /_fake/loads          the loads and evictions so far, and what is loaded (LoadStats)
const controlPrefix = "/_fake/"

func (s *Server) serveControl(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, controlPrefix)
	switch {
	case r.Method == http.MethodGet && path == "requests":
		writeJSON(w, http.StatusOK, s.Requests())
	case r.Method == http.MethodGet && path == "concurrency":
		writeJSON(w, http.StatusOK, s.Concurrency())
	case r.Method == http.MethodPost && path == "reset":
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && path == "models":
		var m Model
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil || m.Name == "" {
			writeError(w, http.StatusBadRequest, "fakeollama: body must be a Model with a name")
			return
		}
		s.SetModel(m)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodDelete && strings.HasPrefix(path, "models/"):
		s.RemoveModel(strings.TrimPrefix(path, "models/"))
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && path == "mode":
		var body struct {
			Mode Mode `json:"mode"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if body.Mode == ModeRefuse {
			// Nothing would be left listening to turn it back on.
			writeError(w, http.StatusBadRequest, "fakeollama: refuse cannot be set remotely")
			return
		}
		if err := s.SetMode(body.Mode); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && path == "prompt-cache":
		var bounds struct {
			Prompts int `json:"prompts"`
			Tokens  int `json:"tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&bounds); err != nil {
			writeError(w, http.StatusBadRequest, "fakeollama: body must be {\"prompts\": N, \"tokens\": M}: "+err.Error())
			return
		}
		s.SetPromptCache(bounds.Prompts, bounds.Tokens)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && path == "loading":
		var l Loading
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil || l.MaxLoaded < 0 || l.LoadTime < 0 {
			writeError(w, http.StatusBadRequest, "fakeollama: body must be {\"max_loaded\": N, \"load_time\": NANOSECONDS}, neither negative")
			return
		}
		s.SetLoading(l)
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && path == "loads":
		writeJSON(w, http.StatusOK, s.Loads())
	case r.Method == http.MethodDelete && path == "prompt-cache":
		s.ResetPromptCache()
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, http.StatusNotFound, "fakeollama: no such control endpoint")
	}
}
