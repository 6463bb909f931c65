// Package reload applies a changed configuration file to a running Edge, on SIGHUP or on POST
// /admin/v1/reload (SPEC P5): API keys, principals, trusted networks, routes, profiles and
// credentials change without a restart and without dropping work in flight.
//
// A reload is all or nothing. The file is read and validated whole (edgeconfig.Load), merged
// with what only a restart may change (edgeconfig.Config.ForReload), and validated again; the
// credentials that are new or changed are read; only then is anything replaced. A refused
// reload changes nothing: the running configuration stays, and the error is returned, logged
// and counted.
//
// The configuration a request sees is one immutable snapshot: the authenticator holds it
// behind an atomic pointer, a request reads it once when it is authenticated, and its principal
// carries it to the dispatcher, which resolves the route and profile in it (auth.Principal.Config).
// Work in flight keeps the profile it resolved; the next request gets the new snapshot.
//
// So a key that a reload removes, or a principal whose routes it narrows, refuses every request
// from then on, and the requests it authenticated before run to their end, bounded by their
// profile's deadline, as a route changed under a stream does. This is deliberate: a reload that
// rotates keys cuts no answer short. To end a leaked key's work at once, restart the Edge.
//
// Two reloads are refused although the file is valid: one whose merged configuration is valid
// only with a value that needs a restart, and one that would leave no admin key while the
// running configuration has one (edgeconfig.ErrLastAdminKey): the admin endpoints, this reload
// among them, would have nobody left to call them. A restart applies such a file.
package reload

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
)

// Results of a reload, the values of the metric's result label.
const (
	ResultApplied = "applied"
	ResultRefused = "refused"
)

// ErrNoFile: the Edge was started from a configuration built in code (the dev command, tests),
// so there is no file to read again.
var ErrNoFile = errors.New("this Edge was not started from a configuration file, so there is nothing to reload")

// Result is what a reload did: the answer of POST /admin/v1/reload.
type Result struct {
	// Applied is true when the reload took effect (even with nothing to change).
	Applied bool `json:"applied"`
	// Changes summarise what changed, one entry per section (edgeconfig.Config.Changes).
	Changes []string `json:"changes"`
	// RestartRequired are the fields the file changes that only a restart applies; they were
	// not applied, and the running Edge keeps their old values.
	RestartRequired []string `json:"restart_required,omitempty"`
	// Error is why the reload was refused.
	Error string `json:"error,omitempty"`
}

// Credentials is the credential store's part in a reload (*credentials.Store).
type Credentials interface {
	Apply(cfg *edgeconfig.Config) error
}

// Dispatcher is the dispatcher's part in a reload (*dispatch.Dispatcher).
type Dispatcher interface {
	SetConfig(cfg *edgeconfig.Config)
}

// Options are what a Reloader applies a configuration to, and where it reports.
type Options struct {
	// Path is the configuration file; empty makes every reload ErrNoFile.
	Path string
	// Load reads the file; default edgeconfig.Load.
	Load func(path string) (*edgeconfig.Config, error)
	// Auth holds the snapshot requests read; required.
	Auth        *auth.Authenticator
	Credentials Credentials
	Dispatcher  Dispatcher
	// Count counts each reload by result; nil counts nothing.
	Count func(result string)
	// Logger logs each reload; nil logs nothing.
	Logger *slog.Logger
}

// Reloader reloads one Edge's configuration. Reloads are serialised.
type Reloader struct {
	opts    Options
	log     *slog.Logger
	mu      sync.Mutex
	running *edgeconfig.Config // guarded by mu
}

// New returns the Reloader of an Edge that runs with cfg.
func New(cfg *edgeconfig.Config, opts Options) *Reloader {
	if opts.Load == nil {
		opts.Load = edgeconfig.Load
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reloader{opts: opts, log: log, running: cfg}
}

// Running is the configuration in effect.
func (r *Reloader) Running() *edgeconfig.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Reload reads the file again and applies it; by says who asked ("SIGHUP", or the admin
// principal), for the log. The error, when not nil, is why the reload was refused (also in the
// Result); nothing changed then.
func (r *Reloader) Reload(by string) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, err := r.reload()
	if err != nil {
		res.Error = err.Error()
		r.count(ResultRefused)
		r.log.Error("config reload refused; the running configuration stays", "by", by, "file", r.opts.Path, "err", err,
			"restart_required", res.RestartRequired)
		return res, err
	}
	r.count(ResultApplied)
	r.log.Warn("config reloaded", "by", by, "file", r.opts.Path, "changes", res.Changes)
	if len(res.RestartRequired) > 0 {
		r.log.Warn("config reload: these fields changed in the file but take effect only at a restart; the running values stay",
			"by", by, "restart_required", res.RestartRequired)
	}
	return res, nil
}

func (r *Reloader) reload() (Result, error) {
	res := Result{Changes: []string{}}
	if r.opts.Path == "" {
		return res, ErrNoFile
	}
	next, err := r.opts.Load(r.opts.Path)
	if err != nil {
		return res, err
	}
	merged, restart, err := r.running.ForReload(next)
	res.RestartRequired = restart
	switch {
	case err != nil && len(restart) > 0:
		return res, fmt.Errorf("with the running %s (a restart would take the file's): %w", strings.Join(restart, ", "), err)
	case err != nil:
		return res, err
	}
	if err := r.running.KeepsAdmin(merged); err != nil {
		return res, err
	}
	// Check everything that can fail before replacing anything: the authenticator's own checks,
	// then the credentials, whose Apply either reads every new value or changes nothing.
	if _, err := auth.New(merged); err != nil {
		return res, err
	}
	if r.opts.Credentials != nil {
		if err := r.opts.Credentials.Apply(merged); err != nil {
			return res, err
		}
	}
	if err := r.opts.Auth.Replace(merged); err != nil {
		return res, fmt.Errorf("applying the keys after the credentials: %w", err) // checked above; not reached
	}
	if r.opts.Dispatcher != nil {
		r.opts.Dispatcher.SetConfig(merged)
	}
	res.Applied, res.Changes = true, r.running.Changes(merged)
	if res.Changes == nil {
		res.Changes = []string{}
	}
	r.running = merged
	return res, nil
}

func (r *Reloader) count(result string) {
	if r.opts.Count != nil {
		r.opts.Count(result)
	}
}
