package sdktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/goleak"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/sdk"
)

const (
	// cancelReturn is how soon a cancelled run must return (R10).
	cancelReturn = 2 * time.Second
	// leakSettle is how long the goroutines of a cancelled run get to end.
	leakSettle = 3 * time.Second
	// maxLeakLines caps the goroutine stacks quoted in a message.
	maxLeakLines = 16
)

func checkOrdering(ctx context.Context, s *Session) error {
	if _, err := s.running(ctx); err != nil {
		return err
	}
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	req := s.newRun(target)
	events, res, err := s.Execute(ctx, req)
	if err := validateRun(req, events, res, err); err != nil {
		return err
	}
	s.Logf("%q: %d event(s), done reason %q", target, len(events), res.DoneReason)
	return nil
}

// checkToolChoice runs the target with a tool choice that cannot be
// honoured: a named function the run does not offer. An adapter that
// reads tool_choice refuses it (sdk.ToolChoice.Check); one that ignores it
// would run the model unconstrained, and the client asking for a forced
// call would not know (SPEC P2).
func checkToolChoice(ctx context.Context, s *Session) error {
	if _, err := s.running(ctx); err != nil {
		return err
	}
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	req := s.newRun(target)
	req.Tools = []sdk.Tool{{Name: "sdktest_offered", Parameters: []byte(`{"type":"object"}`)}}
	req.Options.ToolChoice = sdk.ToolChoiceFunction("sdktest_not_offered")
	_, _, err = s.Execute(ctx, req)
	if !errors.Is(err, sdk.ErrInvalidRequest) {
		return fmt.Errorf("a run of %q whose tool_choice names a tool it does not offer %s; want kind %s "+
			"(check Options.ToolChoice against the run's tools with sdk.ToolChoice.Check)", target, outcomeText(err), sdk.KindInvalidRequest)
	}
	s.Logf("refused: %v", err)
	return nil
}

// validateRun checks one completed run: at least one event, text among
// them, then a Result with a done reason. The order of the stream is the
// plugin host's to check, and Execute's: events whose seq does not count
// 1, 2, 3, ... without gaps, an event stamped with another run's id, a
// stream with no outcome or two come back here as an error matching
// pluginhost.ErrProtocol.
func validateRun(req *sdk.Request, events []sdk.Event, res *sdk.Result, err error) error {
	run := fmt.Sprintf("run %s of %q", req.RunID, req.Target)
	switch {
	case errors.Is(err, pluginhost.ErrProtocol):
		return fmt.Errorf("%s: %v", run, err)
	case err != nil:
		return fmt.Errorf("%s failed (kind %s): %v; want it to complete (is Options.Target a target that answers?)", run, sdk.KindOf(err), err)
	}
	if res == nil {
		return fmt.Errorf("%s completed without a result", run)
	}
	if len(events) == 0 {
		return fmt.Errorf("%s completed without streaming any event; want the answer as text deltas", run)
	}
	text := slices.ContainsFunc(events, func(ev sdk.Event) bool { return ev.Kind == sdk.TextDelta && ev.Text != "" })
	if !text {
		return fmt.Errorf("%s streamed %d event(s) but no text; want the answer as text deltas", run, len(events))
	}
	if res.DoneReason == "" {
		return fmt.Errorf("%s completed without a done reason; want \"stop\", \"length\", \"tool_calls\" or the server's own", run)
	}
	return nil
}

func checkCancel(ctx context.Context, s *Session) error {
	if s.opts.SlowTarget == "" {
		return Skipf("no slow target (Options.SlowTarget, --slow-target): name one that streams slowly enough to cancel after its first event")
	}
	if _, err := s.running(ctx); err != nil {
		return err
	}
	// Every goroutine there is now (the plugin's, its connections') may
	// stay; any that the cancelled run starts must end.
	before := goleak.IgnoreCurrent()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := s.newRun(s.opts.SlowTarget)
	first := make(chan struct{})
	var once sync.Once
	type outcome struct {
		res *sdk.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.Stream(runCtx, req, func(sdk.Event) error {
			once.Do(func() { close(first) })
			return nil
		})
		done <- outcome{res, err}
	}()
	slow := fmt.Sprintf("Options.SlowTarget %q", s.opts.SlowTarget)
	select {
	case <-first:
	case o := <-done:
		select {
		case <-first:
			return fmt.Errorf("%s ended right after its first event (%s), before it could be cancelled: it must answer more slowly", slow, errText(o.err))
		default:
		}
		return fmt.Errorf("%s ended before its first event (%s); want it to stream, slowly", slow, errText(o.err))
	case <-ctx.Done():
		return fmt.Errorf("%s sent no event within the check's time", slow)
	}

	cancel()
	cancelled := time.Now()
	select {
	case o := <-done:
		if o.err == nil {
			return fmt.Errorf("%s completed after the cancel (it must answer more slowly: it was cancelled after its first event)", slow)
		}
		if !errors.Is(o.err, context.Canceled) {
			return fmt.Errorf("the cancelled run of %s returned %v; want the context's error", slow, o.err)
		}
	case <-time.After(cancelReturn):
		return fmt.Errorf("the cancelled run of %s did not return within %v of the cancel", slow, cancelReturn)
	}
	returned := time.Since(cancelled)

	if leaked := settle(ctx, before, leakSettle); leaked != nil {
		where := "this process (the host's side, and any server the test runs)"
		if s.subject.inProcess() {
			where = "this process (the host's side and the adapter's)"
		}
		return fmt.Errorf("goroutines of the cancelled run of %s were still running in %s %v after it returned: "+
			"the adapter must stop its upstream request and return once the run's ctx is done\n%s",
			slow, where, leakSettle, leakSummary(leaked))
	}
	s.Logf("returned %v after the cancel; no goroutine left", returned.Round(10*time.Microsecond))
	return nil
}

// settle waits up to within for every goroutine not ignored by before to
// end, and returns goleak's report of those still running.
func settle(ctx context.Context, before goleak.Option, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := goleak.Find(before)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leakSummary keeps the goroutine headers and function names of goleak's
// report (not the file lines), cut to maxLeakLines.
func leakSummary(err error) string {
	var keep []string
	for line := range strings.SplitSeq(err.Error(), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "[")
		if line == "" || line == "]" || strings.HasPrefix(line, "/") || strings.HasPrefix(line, "found unexpected goroutines") {
			continue // file lines start with a tab, then a path
		}
		if i := strings.LastIndex(line, "("); i > 0 && strings.HasSuffix(line, ")") {
			line = line[:i] // the call's arguments
		}
		keep = append(keep, "  "+line)
	}
	if len(keep) > maxLeakLines {
		keep = append(keep[:maxLeakLines], fmt.Sprintf("  … (%d more lines)", len(keep)-maxLeakLines))
	}
	return strings.Join(keep, "\n")
}

func checkErrorMapping(ctx context.Context, s *Session) error {
	if s.opts.UnknownTarget == "" && len(s.opts.ErrorCases) == 0 {
		return Skipf("no unknown target (Options.UnknownTarget, --unknown-target) and no Options.ErrorCases: name a target the server does not have")
	}
	if _, err := s.running(ctx); err != nil {
		return err
	}
	var problems []string
	cases := len(s.opts.ErrorCases)
	if t := s.opts.UnknownTarget; t != "" {
		cases++
		_, _, err := s.Execute(ctx, s.newRun(t))
		if !errors.Is(err, sdk.ErrModelNotFound) {
			problems = append(problems, fmt.Sprintf("a run of the unknown target %q %s; want kind %s", t, outcomeText(err), sdk.KindModelNotFound))
		}
	}
	for _, c := range s.opts.ErrorCases {
		if err := s.errorCase(ctx, c); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	s.Logf("%d case(s) mapped to their kinds", cases)
	return nil
}

// errorCase runs one ErrorCase, with its setup and teardown around it.
func (s *Session) errorCase(ctx context.Context, c ErrorCase) error {
	target := c.Target
	if target == "" {
		var err error
		if target, err = s.Target(ctx); err != nil {
			return err
		}
	}
	if _, err := s.running(ctx); err != nil {
		return err
	}
	if c.Setup != nil {
		if teardown := c.Setup(); teardown != nil {
			defer teardown()
		}
	}
	_, _, err := s.Execute(ctx, s.newRun(target))
	if !errors.Is(err, &sdk.Error{Kind: c.Want}) {
		return fmt.Errorf("error case %q: a run of %q %s; want kind %s", c.Name, target, outcomeText(err), c.Want)
	}
	return nil
}

// outcomeText describes a run's error for a message.
func outcomeText(err error) string {
	if err == nil {
		return "succeeded"
	}
	return fmt.Sprintf("failed with kind %s (%v)", sdk.KindOf(err), err)
}

func checkConcurrency(ctx context.Context, s *Session) error {
	if _, err := s.running(ctx); err != nil {
		return err
	}
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	n := s.opts.Concurrency
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		req := s.newRun(target)
		wg.Go(func() {
			<-start
			events, res, err := s.Execute(ctx, req)
			errs[i] = validateRun(req, events, res, err)
		})
	}
	close(start)
	wg.Wait()
	var problems []string
	for _, err := range errs {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d of %d concurrent runs went wrong: %s", len(problems), n, strings.Join(problems, "; "))
	}
	s.Logf("%d concurrent runs", n)
	return nil
}

func checkRestart(ctx context.Context, s *Session) error {
	old, err := s.running(ctx)
	if err != nil {
		return err
	}
	if err := s.closePlugin(ctx); err != nil {
		return fmt.Errorf("closing the plugin failed: %w", err)
	}
	select {
	case <-old.Exited():
	default:
		return errors.New("the plugin had not exited when Close returned")
	}
	p, err := s.running(ctx)
	if err != nil {
		return fmt.Errorf("after a restart: %w", err)
	}
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	req := s.newRun(target)
	events, res, err := s.Execute(ctx, req)
	if err := validateRun(req, events, res, err); err != nil {
		return fmt.Errorf("after a restart and Configure: %w", err)
	}
	if old.Pid() != 0 {
		s.Logf("pid %d closed, pid %d configured and running", old.Pid(), p.Pid())
	}
	return nil
}

func checkNoStdout(ctx context.Context, s *Session) error {
	if s.subject.inProcess() {
		return Skipf("an in-process adapter shares the test's stdout; run the kit on a built binary to check it")
	}
	s.mu.Lock()
	startErr := s.startErr
	s.mu.Unlock()
	if startErr != nil {
		return fmt.Errorf("the plugin could not be started: %w", startErr)
	}
	// Closing the plugin drains its output into the log, where the
	// session records what came from stdout.
	if err := s.closePlugin(ctx); err != nil {
		s.Logf("closing the plugin: %v", err)
	}
	lines := s.stdout.all()
	if len(lines) == 0 {
		return nil
	}
	quoted := make([]string, 0, 3)
	for _, l := range lines[:min(3, len(lines))] {
		quoted = append(quoted, clip([]byte(l)))
	}
	return fmt.Errorf("the plugin wrote %d line(s) to stdout, which the plugin handshake owns (log with log/slog, which goes to stderr): %s",
		len(lines), strings.Join(quoted, ", "))
}
