package fakeollama

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Model management, as Ollama 0.17.4 answers it (server/routes.go,
// server/images.go, server/create.go):
//
//	POST   /api/pull    {"model"} → NDJSON progress: "pulling manifest", per blob
//	                    "pulling <12 hex>" with digest, total and completed,
//	                    "verifying sha256 digest", "writing manifest", "success";
//	                    a model the registry does not have fails after
//	                    "pulling manifest" with "pull model manifest: file does
//	                    not exist"
//	DELETE /api/delete  {"model"} → 200 with no body; 404 {"error":"model 'x' not found"}
//	POST   /api/copy    {"source","destination"} → 200 with no body;
//	                    404 {"error":"model \"x\" not found"}
//	POST   /api/create  {"model","from"} → NDJSON: "using existing layer
//	                    sha256:...", "writing manifest", "success" (a from the
//	                    server lacks is pulled first, as Ollama does)
//
// With "stream": false, pull and create answer once, {"status":"success"}, or
// their error with status 500 (400 for a request Ollama rejects up front).
//
// What a pull can fetch is the server's registry: the models made pullable
// with SetPullable. A pulled model is served and listed by /api/tags from
// then on. The registry is kept beside the server (registries), so that a
// test steers it through these methods and no control API.

// Pullable is a model the fake's registry has.
type Pullable struct {
	// Model is what the server serves once the pull is done; its Name is
	// what a pull asks for (with or without ":latest").
	Model Model
	// Blobs are the sizes of the layers the pull downloads, in order. Nil:
	// a model of Ollama's library, its weights of Model.Size (1 GiB when
	// unset) then its template, license, params and config.
	Blobs []int64
	// Refuse, when set, fails its pulls after "pulling manifest" with this
	// message, as a registry that refuses it.
	Refuse string
}

// PullSteps is how many progress lines a pull sends for each blob it
// downloads, after the blob's first line (which has no completed bytes).
const PullSteps = 4

// registry is one server's: what it can pull, and how.
type registry struct {
	mu       sync.Mutex
	models   map[string]Pullable // by baseName
	step     time.Duration       // before each progress line
	refusal  string              // every pull fails with it, when set
	download map[string]bool     // blobs the server holds, by digest
}

// registries holds each server's registry: the Server type carries none
// of its own.
var registries = struct {
	sync.Mutex
	m map[*Server]*registry
}{m: map[*Server]*registry{}}

func (s *Server) registry() *registry {
	registries.Lock()
	defer registries.Unlock()
	r, ok := registries.m[s]
	if !ok {
		r = &registry{models: map[string]Pullable{}, download: map[string]bool{}}
		registries.m[s] = r
	}
	return r
}

// SetPullable adds p to what the server's pulls can fetch, or replaces the
// entry of the same name.
func (s *Server) SetPullable(p Pullable) {
	r := s.registry()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.models[baseName(p.Model.Name)] = p
}

// SetPullStep sets the pause before each line of a pull's progress (0,
// the default: none).
func (s *Server) SetPullStep(d time.Duration) {
	r := s.registry()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step = d
}

// RefusePulls makes every pull of this server fail after "pulling
// manifest" with msg, as a server that cannot reach its registry; ""
// pulls again.
func (s *Server) RefusePulls(msg string) {
	r := s.registry()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusal = msg
}

// Messages of Ollama's own that the fake answers with.
const (
	// errManifestNotFound is a pull of a model the registry does not have.
	errManifestNotFound = "pull model manifest: file does not exist"
	// errInvalidName is errtypes.InvalidModelNameErrMsg.
	errInvalidName = "invalid model name"
	// errNeitherFromOrFiles is a create with neither.
	errNeitherFromOrFiles = "neither 'from' or 'files' was specified"
)

// PullRequest is the body of /api/pull (api.PullRequest).
type PullRequest struct {
	Model    string `json:"model"`
	Name     string `json:"name"`
	Insecure bool   `json:"insecure,omitempty"`
	Stream   *bool  `json:"stream,omitempty"`
}

// DeleteRequest is the body of /api/delete (api.DeleteRequest).
type DeleteRequest struct {
	Model string `json:"model"`
	Name  string `json:"name"`
}

// CopyRequest is the body of /api/copy (api.CopyRequest).
type CopyRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// CreateRequest is the body of /api/create (api.CreateRequest), as far as
// the fake reads it.
type CreateRequest struct {
	Model  string            `json:"model"`
	Name   string            `json:"name"`
	From   string            `json:"from,omitempty"`
	Files  map[string]string `json:"files,omitempty"`
	Stream *bool             `json:"stream,omitempty"`
}

// ProgressResponse is a line of pull and create (api.ProgressResponse).
type ProgressResponse struct {
	Status    string `json:"status"`
	Digest    string `json:"digest,omitempty"`
	Total     int64  `json:"total,omitempty"`
	Completed int64  `json:"completed,omitempty"`
}

// progress is where a pull or create sends its lines: the stream, or, for
// "stream": false, nowhere until the end (Ollama's waitForStream).
type progress struct {
	lw     lineWriter
	stream bool
}

func (p progress) send(v ProgressResponse) error {
	if !p.stream {
		return nil
	}
	return p.lw.line(v)
}

// end answers the outcome: an {"error"} line or status (Ollama's
// streamResponse and waitForStream), or success.
func (p progress) end(errMsg string) {
	switch {
	case errMsg != "" && p.stream:
		p.lw.fail(errMsg)
	case errMsg != "":
		writeError(p.lw.w, http.StatusInternalServerError, errMsg)
	case p.stream:
		_ = p.lw.line(ProgressResponse{Status: "success"})
	default:
		writeJSON(p.lw.w, http.StatusOK, ProgressResponse{Status: "success"})
	}
}

func (s *Server) pull(ctx context.Context, w *recorder, body []byte) {
	var req PullRequest
	if !decodeBody(w, body, &req) {
		return
	}
	name := cmp.Or(req.Model, req.Name)
	if !validName(name) {
		writeError(w, http.StatusBadRequest, errInvalidName)
		return
	}
	p := progress{lw: lineWriter{w: w}, stream: req.Stream == nil || *req.Stream}
	if errMsg, ended := s.pullModel(ctx, name, p); ended {
		p.end(errMsg)
	}
}

// pullModel streams the pull of name to p and serves the model once it is
// done. It returns the error message it failed with ("" for none), and
// ended false when the client went away (nothing is left to tell).
func (s *Server) pullModel(ctx context.Context, name string, p progress) (errMsg string, ended bool) {
	r := s.registry()
	r.mu.Lock()
	m, ok := r.models[baseName(name)]
	step, refusal := r.step, r.refusal
	r.mu.Unlock()
	if err := p.send(ProgressResponse{Status: "pulling manifest"}); err != nil || !s.sleep(ctx, step) {
		return "", false
	}
	switch {
	case refusal != "":
		return refusal, true
	case !ok:
		return errManifestNotFound, true
	case m.Refuse != "":
		return m.Refuse, true
	}
	for i, size := range m.blobs() {
		digest := blobDigest(m.Model.Name, i)
		line := ProgressResponse{Status: "pulling " + digest[7:19], Digest: digest, Total: size}
		r.mu.Lock()
		held := r.download[digest]
		r.mu.Unlock()
		if held { // a cache hit: one line, whole
			line.Completed = size
			if p.send(line) != nil {
				return "", false
			}
			continue
		}
		if p.send(line) != nil {
			return "", false
		}
		for n := int64(1); n <= PullSteps; n++ {
			if !s.sleep(ctx, step) {
				return "", false
			}
			line.Completed = size * n / PullSteps
			if p.send(line) != nil {
				return "", false
			}
		}
		r.mu.Lock()
		r.download[digest] = true
		r.mu.Unlock()
	}
	for _, status := range []string{"verifying sha256 digest", "writing manifest"} {
		if !s.sleep(ctx, step) || p.send(ProgressResponse{Status: status}) != nil {
			return "", false
		}
	}
	served := m.Model
	served.Name = baseName(name)
	s.SetModel(served)
	return "", true
}

// blobs are the sizes of the layers a pull of p downloads.
func (p Pullable) blobs() []int64 {
	if p.Blobs != nil {
		return p.Blobs
	}
	// A model of Ollama's library: weights, template, license, params,
	// config.
	return []int64{p.Model.size(), 1_429, 7_711, 96, 561}
}

// blobDigest is the digest of layer i of the model name.
func blobDigest(name string, i int) string {
	sum := sha256.Sum256([]byte(baseName(name) + "/" + strconv.Itoa(i)))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// validName is a model name Ollama's parser takes, as far as the fake
// checks: not empty, no spaces.
func validName(name string) bool {
	return name != "" && !strings.ContainsAny(name, " \t\n")
}

func (s *Server) deleteModel(w *recorder, body []byte) {
	var req DeleteRequest
	if !decodeBody(w, body, &req) {
		return
	}
	name := cmp.Or(req.Model, req.Name)
	if !validName(name) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("name %q is invalid", name))
		return
	}
	if _, ok := s.model(name); !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", name))
		return
	}
	s.RemoveModel(name)
	w.WriteHeader(http.StatusOK)
}

func (s *Server) copyModel(w *recorder, body []byte) {
	var req CopyRequest
	if !decodeBody(w, body, &req) {
		return
	}
	switch {
	case !validName(req.Source):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("source %q is invalid", req.Source))
		return
	case !validName(req.Destination):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("destination %q is invalid", req.Destination))
		return
	}
	m, ok := s.model(req.Source)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model %q not found", req.Source))
		return
	}
	m.Name = baseName(req.Destination)
	s.SetModel(m)
	w.WriteHeader(http.StatusOK)
}

// create makes a model from another ("from"), pulling it first when the
// server lacks it, as Ollama does; files (blobs uploaded before) are not
// served by the fake and answer as a from-less create.
func (s *Server) create(ctx context.Context, w *recorder, body []byte) {
	var req CreateRequest
	if !decodeBody(w, body, &req) {
		return
	}
	name := cmp.Or(req.Model, req.Name)
	if !validName(name) {
		writeError(w, http.StatusBadRequest, errInvalidName)
		return
	}
	if req.From == "" {
		writeError(w, http.StatusBadRequest, errNeitherFromOrFiles)
		return
	}
	p := progress{lw: lineWriter{w: w}, stream: req.Stream == nil || *req.Stream}
	from, ok := s.model(req.From)
	if !ok {
		errMsg, ended := s.pullModel(ctx, req.From, p)
		if errMsg != "" {
			p.end(errMsg)
		}
		if errMsg != "" || !ended {
			return
		}
		from, _ = s.model(req.From)
	}
	layers := Pullable{Model: from}.blobs()
	for i := range layers {
		if !s.sleep(ctx, s.pullStep()) || p.send(ProgressResponse{Status: "using existing layer " + blobDigest(from.Name, i)}) != nil {
			return
		}
	}
	if !s.sleep(ctx, s.pullStep()) || p.send(ProgressResponse{Status: "writing manifest"}) != nil {
		return
	}
	made := from
	made.Name = baseName(name)
	s.SetModel(made)
	p.end("")
}

func (s *Server) pullStep() time.Duration {
	r := s.registry()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.step
}
