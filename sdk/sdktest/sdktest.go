// Package sdktest is the adapter conformance kit: one table of checks that
// every IOP adapter must pass, run through the real plugin path (the gRPC
// plugin protocol, its conversions and the Node's own plugin host) either
// on an adapter value in the test's own process or on a built adapter
// binary.
//
// From an adapter's tests:
//
//	func TestConformance(t *testing.T) {
//		sdktest.Run(t, sdktest.Subject{Adapter: func() sdk.Adapter { return myadapter.New() }},
//			sdktest.Options{Config: cfg, Target: "my-model", SlowTarget: "my-slow-model"})
//	}
//
// On a built binary, without a test: `noded adapter verify ./my-adapter`,
// which calls Verify.
//
// The checks (see Checks) look at what the Node relies on: the describe
// output, strict configuration, honest capabilities, ordered events and
// one outcome per run, prompt return on cancel without leaked goroutines,
// the mapping of upstream failures to kinds, a tool choice that is read and
// not ignored, raw completions and embeddings where the adapter reports
// them, concurrent runs, a restart followed by a new Configure, and nothing
// written to stdout.
//
// The two kinds of subject see different things. In process, the cancel
// check sees the adapter's own goroutines (a run that ignores its ctx shows
// as a leak), but stdout is the test's own and is not checked. A binary is
// checked as the Node runs it: its describe mode, its stdout (which the
// plugin host reads line by line after the handshake), and on cancel the
// goroutines of this process only, which include those of any fake server
// the test runs (a plugin that keeps its upstream request open after a
// cancel shows as the fake's handler still running).
//
// The cancel check counts the goroutines of the whole process, so run the
// kit from a test that is not parallel with others.
//
// # Custom checks
//
// A Check is a function of a Session, whose methods drive the subject with
// the sdk's own types through the same plugin path: Execute and Stream (a
// run), Embed, Tunnel, ListTargets, Probe, Configure, Info, Capabilities
// and Restart. Each converts its sdk values to the plugin protocol and
// back at the kit's edge, so a check sees what the Node would see. Run an
// adapter's own checks beside the kit's with RunChecks or VerifyChecks:
//
//	sdktest.RunChecks(t, subject, opts, append(sdktest.Checks(), myCheck)...)
package sdktest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// Subject is the adapter under check: an adapter value, run in this process
// over the real gRPC path (the plugin protocol and its conversions, minus
// the process), or a built binary, started as a plugin process as the Node
// starts one. Set exactly one of Adapter and Binary.
type Subject struct {
	// Adapter returns a new adapter instance; it is called for every
	// start (a restart gets a fresh one, as a new process would).
	Adapter func() sdk.Adapter
	// Binary is the path of an adapter program built with sdk.Serve.
	Binary string
	// Args are the arguments that make Binary serve the adapter (none for
	// a program whose main is sdk.Serve; "plugin", NAME for an adapter
	// built into noded).
	Args []string
	// DescribeArgs are the arguments that make Binary print its
	// description. Nil: Args followed by "describe".
	DescribeArgs []string
	// Env is added to the environment Binary runs with.
	Env []string
}

func (s Subject) String() string {
	switch {
	case s.Binary != "":
		return strings.TrimSpace(s.Binary + " " + strings.Join(s.Args, " "))
	case s.Adapter != nil:
		return "in-process adapter"
	}
	return "empty subject"
}

func (s Subject) validate() error {
	switch {
	case s.Adapter != nil && s.Binary != "":
		return errors.New("sdktest: Subject has both Adapter and Binary; set one")
	case s.Adapter == nil && s.Binary == "":
		return errors.New("sdktest: Subject has neither Adapter nor Binary; set one")
	}
	return nil
}

func (s Subject) inProcess() bool { return s.Adapter != nil }

// Options say how to drive the subject: its configuration and the targets
// that exercise it. Only Target is needed for most checks; the optional
// ones enable the checks that use them (a check without what it needs is
// skipped, and says what to set).
type Options struct {
	// Config is a valid configuration for the adapter (for an HTTP
	// adapter, one pointing at a fake server).
	Config sdk.Config
	// Target answers with a streamed text answer. Empty: the first target
	// ListTargets returns.
	Target string
	// SlowTarget answers slowly enough to be cancelled after its first
	// event. Empty skips the cancel check.
	SlowTarget string
	// EmbedTarget is the target the embed check asks for embeddings, when
	// the adapter reports the embed capability. Empty: Target.
	EmbedTarget string
	// UnknownTarget is a target the server does not have: Execute must
	// fail with sdk.ErrModelNotFound. Empty skips that part of the error
	// mapping check.
	UnknownTarget string
	// ErrorCases are upstream failures and the kinds they must map to.
	ErrorCases []ErrorCase
	// Concurrency is the number of runs started at once, which must all
	// succeed with their own ordered streams. Zero: 4.
	Concurrency int
	// BadConfig must be refused by Configure with sdk.ErrInvalidRequest.
	// Nil: {"no_such_key_xyz": 1} (an unknown key).
	BadConfig sdk.Config
	// TunnelPath is the path of the harmless GET the capability check
	// sends through the tunnel, when the adapter has one. Empty: "/".
	TunnelPath string
	// Credential, if set, is lent to every run, embedding call and tunnel
	// whose request has none, for servers that want a key.
	Credential *sdk.Credential
	// Timeout bounds each check. Zero: one minute.
	Timeout time.Duration
	// Logger, if set, also receives the log lines of a Binary subject.
	Logger *slog.Logger
}

// ErrorCase is one upstream failure and the kind it must map to.
type ErrorCase struct {
	// Name labels the case in messages.
	Name string
	// Target is the target to run. Empty: Options.Target.
	Target string
	// Setup, if set, brings the failure about (say, makes a fake server
	// answer 503) before the run; the teardown it returns, if not nil,
	// undoes it after.
	Setup func() (teardown func())
	// Want is the kind the run must fail with (errors.Is with the
	// sentinel of that kind must hold on the host).
	Want sdk.Kind
}

// Defaults of Options.
const (
	DefaultConcurrency = 4
	DefaultTunnelPath  = "/"
	DefaultTimeout     = time.Minute
)

// DefaultBadConfig is the configuration that must be refused when
// Options.BadConfig is nil: an unknown key.
var DefaultBadConfig = sdk.Config(`{"no_such_key_xyz": 1}`)

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.BadConfig == nil {
		o.BadConfig = DefaultBadConfig
	}
	if o.TunnelPath == "" {
		o.TunnelPath = DefaultTunnelPath
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return o
}

// Check is one named conformance check.
type Check struct {
	// Name is short and has no spaces, so that `go test -run
	// TestX/NAME` selects it.
	Name string
	// Doc says in one line what the check requires.
	Doc string
	// Run checks the session's subject. It returns nil when the subject
	// passes, an error from Skipf when the check cannot run with the
	// options given, and otherwise an error saying what was expected and
	// what happened.
	Run func(ctx context.Context, s *Session) error
}

// skipError is a check that could not run.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "skipped: " + e.reason }

// Skipf returns the error a Check returns when it cannot run with the
// options given; the reason should say what to set.
func Skipf(format string, args ...any) error {
	return &skipError{reason: fmt.Sprintf(format, args...)}
}

// Status is the outcome of one check.
type Status int

// Check outcomes.
const (
	Pass Status = iota + 1
	Fail
	Skip
)

func (s Status) String() string {
	switch s {
	case Pass:
		return "PASS"
	case Fail:
		return "FAIL"
	case Skip:
		return "SKIP"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Result is the outcome of one check, as Verify reports it.
type Result struct {
	Name   string
	Status Status
	// Message says why the check failed or was skipped; for a pass, what
	// it saw (the notes of Session.Logf).
	Message string
	Elapsed time.Duration
}

// Run runs every check of the kit (Checks) on the subject, each as a
// subtest named after it: a failed check fails its subtest and the others
// still run. The subject's plugin is closed when t's test ends.
func Run(t *testing.T, subject Subject, o Options) {
	t.Helper()
	RunChecks(t, subject, o, Checks()...)
}

// RunChecks is Run with the checks given, in order, instead of the kit's:
// an adapter's own checks, alone or appended to Checks(). They share one
// session, as the kit's checks do.
func RunChecks(t *testing.T, subject Subject, o Options, checks ...Check) {
	t.Helper()
	if err := subject.validate(); err != nil {
		t.Fatal(err)
	}
	s := newSession(subject, o)
	t.Cleanup(s.close)
	for _, c := range checks {
		t.Run(c.Name, func(t *testing.T) {
			st, msg, notes := s.runCheck(t.Context(), c)
			for _, n := range notes {
				t.Log(n)
			}
			switch st {
			case Fail:
				t.Error(msg)
			case Skip:
				t.Skip(msg)
			}
		})
	}
}

// Verify runs every check of the kit (Checks) on the subject, in order, and
// returns one Result per check. A failing check does not stop the others.
// The subject's plugin is closed before Verify returns.
func Verify(ctx context.Context, subject Subject, o Options) []Result {
	return VerifyChecks(ctx, subject, o, Checks()...)
}

// VerifyChecks is Verify with the checks given, in order, instead of the
// kit's.
func VerifyChecks(ctx context.Context, subject Subject, o Options, checks ...Check) []Result {
	results := make([]Result, 0, len(checks))
	if err := subject.validate(); err != nil {
		for _, c := range checks {
			results = append(results, Result{Name: c.Name, Status: Fail, Message: err.Error()})
		}
		return results
	}
	s := newSession(subject, o)
	defer s.close()
	for _, c := range checks {
		start := time.Now()
		st, msg, notes := s.runCheck(ctx, c)
		if st == Pass {
			msg = strings.Join(notes, "; ")
		}
		results = append(results, Result{Name: c.Name, Status: st, Message: msg, Elapsed: time.Since(start)})
	}
	return results
}

// runCheck runs c under the check timeout and classifies its outcome; msg
// says why it failed or was skipped, and notes are what it saw (Logf).
func (s *Session) runCheck(ctx context.Context, c Check) (st Status, msg string, notes []string) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	s.beginCheck()
	defer func() {
		if r := recover(); r != nil {
			st, msg = Fail, fmt.Sprintf("sdktest: check %s panicked: %v", c.Name, r)
		}
		notes = s.endCheck()
	}()
	err := c.Run(ctx, s)
	var skip *skipError
	switch {
	case errors.As(err, &skip):
		return Skip, skip.reason, nil
	case err != nil:
		msg := err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg += fmt.Sprintf(" (the check ran out of its %v: Options.Timeout)", s.opts.Timeout)
		}
		return Fail, msg, nil
	}
	return Pass, "", nil
}
