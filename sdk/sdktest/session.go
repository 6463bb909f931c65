package sdktest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/sdk"
)

// Session is one subject under check: the plugin now running it, and what
// the checks have seen of it. Checks run on it one at a time; a check may
// call it from several goroutines.
//
// Its calls (Execute, Embed, Tunnel, ...) go to the plugin now running the
// subject, and start one first, configured with Options.Config, when there
// is none or the last one's process has exited. A start that failed is not
// tried again: every later call fails with its error.
type Session struct {
	subject Subject
	opts    Options
	stdout  *stdoutRecorder
	logger  *slog.Logger // the plugin's log, for Binary subjects
	ids     atomic.Int64 // numbers run, embedding call and tunnel ids

	// mu guards the fields below: the plugin may be started (or
	// replaced) by a call from any of a check's goroutines.
	mu         sync.Mutex
	plugin     *pluginhost.Plugin // nil until started, and after a close
	configured bool               // plugin has taken Options.Config
	startErr   error              // a start that failed: not tried again
	target     string             // Options.Target, or the first listed target

	notesMu sync.Mutex
	notes   []string // of the current check
}

func newSession(subject Subject, o Options) *Session {
	o = o.withDefaults()
	rec := &stdoutRecorder{}
	var next slog.Handler
	if o.Logger != nil {
		next = o.Logger.Handler()
	}
	return &Session{
		subject: subject,
		opts:    o,
		stdout:  rec,
		logger:  slog.New(recordingHandler{rec: rec, next: next}),
	}
}

// Subject returns the subject under check.
func (s *Session) Subject() Subject { return s.subject }

// Options returns the session's options, defaults applied.
func (s *Session) Options() Options { return s.opts }

// Logf notes what the current check saw: the notes are the Message of a
// passing check's Result, and go to the test log under Run.
func (s *Session) Logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.notesMu.Lock()
	defer s.notesMu.Unlock()
	s.notes = append(s.notes, msg)
}

func (s *Session) beginCheck() {
	s.notesMu.Lock()
	defer s.notesMu.Unlock()
	s.notes = nil
}

func (s *Session) endCheck() []string {
	s.notesMu.Lock()
	defer s.notesMu.Unlock()
	notes := s.notes
	s.notes = nil
	return notes
}

// running returns the running plugin, configured with Options.Config,
// starting and configuring one first if there is none (or the last one's
// process has exited). A start that failed is not tried again.
func (s *Session) running(ctx context.Context) (*pluginhost.Plugin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.plugin != nil {
		select {
		case <-s.plugin.Exited():
			s.Logf("the plugin had exited; started a new one")
			_ = s.closeLocked(ctx)
		default:
		}
	}
	if s.plugin == nil {
		if s.startErr != nil {
			return nil, fmt.Errorf("the plugin could not be started: %w", s.startErr)
		}
		p, err := s.start(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.startErr = err
			}
			return nil, fmt.Errorf("starting the plugin: %w", err)
		}
		s.plugin, s.configured = p, false
	}
	if !s.configured {
		if err := s.plugin.Configure(ctx, s.opts.Config); err != nil {
			return nil, fmt.Errorf("Configure(Options.Config) failed: %w", err)
		}
		s.configured = true
	}
	return s.plugin, nil
}

// Restart closes the running plugin, as the Node does before it stops
// one, and starts and configures a new one (for an Adapter subject, a new
// instance; for a Binary, a new process). It returns the error of the
// adapter's Close, or of the new start.
func (s *Session) Restart(ctx context.Context) error {
	if err := s.closePlugin(ctx); err != nil {
		return fmt.Errorf("closing the plugin: %w", err)
	}
	_, err := s.running(ctx)
	return err
}

// start starts the subject without configuring it.
func (s *Session) start(ctx context.Context) (*pluginhost.Plugin, error) {
	if s.subject.inProcess() {
		return pluginhost.StartInProcess(ctx, s.subject.Adapter())
	}
	cmd := exec.Command(s.subject.Binary, s.subject.Args...)
	if len(s.subject.Env) > 0 {
		cmd.Env = append(os.Environ(), s.subject.Env...)
	}
	name := strings.Join(append([]string{filepath.Base(s.subject.Binary)}, s.subject.Args...), " ")
	return pluginhost.Start(ctx, pluginhost.Options{Cmd: cmd, Logger: s.logger, Name: name})
}

// closePlugin closes the running plugin, if any. Its log lines have all
// been recorded when it returns.
func (s *Session) closePlugin(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeLocked(ctx)
}

// closeLocked is closePlugin; the caller holds s.mu.
func (s *Session) closeLocked(ctx context.Context) error {
	if s.plugin == nil {
		return nil
	}
	err := s.plugin.Close(ctx)
	s.plugin, s.configured = nil, false
	return err
}

func (s *Session) close() { _ = s.closePlugin(context.Background()) }

// Target returns Options.Target or, when it is empty, the first target
// the adapter lists.
func (s *Session) Target(ctx context.Context) (string, error) {
	if s.opts.Target != "" {
		return s.opts.Target, nil
	}
	s.mu.Lock()
	listed := s.target
	s.mu.Unlock()
	if listed != "" {
		return listed, nil
	}
	caps, err := s.Capabilities(ctx)
	if err != nil {
		return "", err
	}
	if !slices.Contains(caps, sdk.CapListTargets) {
		return "", errors.New("Options.Target is empty and the adapter cannot list targets: name a target")
	}
	targets, err := s.ListTargets(ctx)
	if err != nil {
		return "", fmt.Errorf("Options.Target is empty and ListTargets failed: %w", err)
	}
	if len(targets) == 0 || targets[0].Name == "" {
		return "", errors.New("Options.Target is empty and ListTargets returned no target: name a target")
	}
	s.mu.Lock()
	s.target = targets[0].Name
	s.mu.Unlock()
	return targets[0].Name, nil
}

// sessionID is the session id of the kit's requests.
const sessionID = "sdktest"

// newID returns a fresh id for a run, embedding call or tunnel (kind).
func (s *Session) newID(kind string) string {
	return fmt.Sprintf("sdktest-%s-%d", kind, s.ids.Add(1))
}

// newRun returns a chat run of target with a fresh run id.
func (s *Session) newRun(target string) *sdk.Request {
	return &sdk.Request{
		RunID:     s.newID("run"),
		SessionID: sessionID,
		Target:    target,
		Messages:  []sdk.Message{{Role: "user", Content: "Say hello in a few words."}},
	}
}

// stdoutRecorder keeps the lines a plugin wrote to its stdout.
type stdoutRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *stdoutRecorder) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
}

func (r *stdoutRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// recordingHandler is the slog handler of a plugin's log: pluginhost logs
// what the plugin wrote to stdout with the attribute stream=stdout, and the
// handler records those lines; every record also goes to next, if set.
type recordingHandler struct {
	rec  *stdoutRecorder
	next slog.Handler
}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "stream" && a.Value.String() == "stdout" {
			h.rec.add(r.Message)
			return false
		}
		return true
	})
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithAttrs(attrs)
	}
	return h
}

func (h recordingHandler) WithGroup(name string) slog.Handler {
	if h.next != nil {
		h.next = h.next.WithGroup(name)
	}
	return h
}
