package sdktest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Session is one subject under check: the plugin now running it, and what
// the checks have seen of it. Checks run on it one at a time; a check may
// use the plugin from several goroutines.
type Session struct {
	subject Subject
	opts    Options
	stdout  *stdoutRecorder
	logger  *slog.Logger // the plugin's log, for Binary subjects
	runs    atomic.Int64 // numbers run and tunnel ids

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

// Plugin returns the running plugin, configured with Options.Config,
// starting and configuring one first if there is none (or the last one's
// process has exited). A start that failed is not tried again.
func (s *Session) Plugin(ctx context.Context) (*pluginhost.Plugin, error) {
	if s.plugin != nil {
		select {
		case <-s.plugin.Exited():
			s.Logf("the plugin had exited; started a new one")
			_ = s.closePlugin(ctx)
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

// Restart closes the running plugin (returning the error of its Close) and
// starts and configures a new one.
func (s *Session) Restart(ctx context.Context) (*pluginhost.Plugin, error) {
	if err := s.closePlugin(ctx); err != nil {
		return nil, fmt.Errorf("closing the plugin: %w", err)
	}
	return s.Plugin(ctx)
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
	if s.target != "" {
		return s.target, nil
	}
	p, err := s.Plugin(ctx)
	if err != nil {
		return "", err
	}
	if !p.Has(sdk.CapListTargets) {
		return "", errors.New("Options.Target is empty and the adapter cannot list targets: name a target")
	}
	targets, err := p.ListTargets(ctx)
	if err != nil {
		return "", fmt.Errorf("Options.Target is empty and ListTargets failed: %w", err)
	}
	if len(targets) == 0 || targets[0].Name == "" {
		return "", errors.New("Options.Target is empty and ListTargets returned no target: name a target")
	}
	s.target = targets[0].Name
	return s.target, nil
}

// newRun returns a run request for target with a fresh run id.
func (s *Session) newRun(target string) *wirepb.RunRequest {
	return &wirepb.RunRequest{
		RunId:     fmt.Sprintf("sdktest-run-%d", s.runs.Add(1)),
		SessionId: "sdktest",
		Target:    target,
		Messages:  []*wirepb.ChatMessage{{Role: "user", Content: "Say hello in a few words."}},
	}
}

// execute runs req on p and returns the events it streamed and its outcome.
func (s *Session) execute(ctx context.Context, p *pluginhost.Plugin, req *wirepb.RunRequest) ([]*wirepb.RunEvent, *sdk.Result, error) {
	var events []*wirepb.RunEvent
	term, err := p.Execute(ctx, req, s.opts.Credential, func(ev *wirepb.RunEvent) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		return events, nil, err
	}
	res, err := pluginhost.ResultOf(term)
	return events, res, err
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
