package execution

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/iop-dev/iop/quicwire"
	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// The stall watchdog (R5, R6, R7). One Watchdog watches one provider call
// (a normalized run, a raw tunnel or an embedding call):
//
//	Start ──► [progress resets] ──► timer fires ──► Claim.TakeStall ──► Stalled() closes, OnStall
//	                                                      │
//	Finish: cancel call (ErrStalled) ─┬─ close grace (did the call return?) ─┐
//	                                  ├─ exact-target probe (own deadline)  ─┼─► join ──► StallObservation
//	                                  └─ fence: no output starts after it   ─┘
//
// It owns the stall timer, the output fence and the health evidence; the
// call's one outcome is the Claim's (outcome.go), which the timer only
// asks for. The hard deadline, queue timeout, heartbeat and client idle
// timeout have their own owners.

// ErrStalled is the cause the provider call is cancelled with when the
// stall is claimed.
var ErrStalled = errors.New("response stalled")

// ErrFenced is returned by Watchdog.Emit for output that arrives after the
// stall fence: it is dropped and counted, never emitted.
var ErrFenced = errors.New("output fenced after a response stall")

// Health evidence values (R6): provider_health / liveness_classification.
// They are quicwire's, which the Edge reads.
const (
	HealthAvailable   = quicwire.HealthAvailable
	HealthUnavailable = quicwire.HealthUnavailable
	HealthUnknown     = quicwire.HealthUnknown

	LivenessRequestStalled    = quicwire.LivenessRequestStalled
	LivenessProviderUnhealthy = quicwire.LivenessProviderUnhealthy
	LivenessHealthUnknown     = quicwire.LivenessHealthUnknown
)

// DefaultCloseGrace and DefaultProbeTimeout are used when a WatchdogConfig
// leaves CloseGrace or ProbeTimeout at zero.
const (
	DefaultCloseGrace   = 5 * time.Second
	DefaultProbeTimeout = 5 * time.Second
)

// RunEventIsProgress reports whether a run event counts as progress (R4,
// R5): text, reasoning and tool-call deltas and non-terminal usage do. A
// terminal type wins over any payload or usage it carries and is never
// progress; an unspecified type is not progress.
func RunEventIsProgress(ev *wirepb.RunEvent) bool {
	switch ev.GetType() {
	case wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_REASONING_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_TOOL_CALL_DELTA,
		wirepb.RunEventType_RUN_EVENT_TYPE_USAGE:
		return true
	}
	return false
}

// TunnelFrameIsProgress reports whether a tunnel frame counts as progress
// (R5): response body bytes that carry data do. An empty body, a body
// chunk made only of SSE comment lines (starting with ':') and blank lines
// (a keep-alive), a response head and a terminal are not. Each chunk is
// classified on its own.
func TunnelFrameIsProgress(f *wirepb.TunnelFrame) bool {
	b, ok := f.GetFrame().(*wirepb.TunnelFrame_Body)
	if !ok {
		return false
	}
	for line := range bytes.SplitSeq(b.Body, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if len(line) > 0 && line[0] != ':' {
			return true
		}
	}
	return false
}

// Evidence is the normalized health evidence of a stall (R6): exactly one
// of available/request_stalled, unavailable/provider_unhealthy and
// unknown/health_unknown.
type Evidence struct {
	ProviderHealth, Classification string
}

// EvidenceFrom normalizes a probe's answer fail-closed (R6): only a clear
// available or unavailable without an error is taken; a probe error, a
// timeout, or anything ambiguous is unknown/health_unknown.
func EvidenceFrom(h sdk.Health, err error) Evidence {
	if err == nil {
		switch h.Status {
		case sdk.HealthAvailable:
			return Evidence{HealthAvailable, LivenessRequestStalled}
		case sdk.HealthUnavailable:
			return Evidence{HealthUnavailable, LivenessProviderUnhealthy}
		}
	}
	return Evidence{HealthUnknown, LivenessHealthUnknown}
}

// WatchdogConfig configures one Watchdog.
type WatchdogConfig struct {
	// StallTimeout is the time without progress after which the stall is
	// claimed (see StallTimeout for the wire value).
	StallTimeout time.Duration
	// CloseGrace bounds the wait for the provider call to return after it
	// is cancelled; 0 means DefaultCloseGrace.
	CloseGrace time.Duration
	// ProbeTimeout is the probe's own deadline (not the run's cancelled
	// context); 0 means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// Probe asks the provider about the exact target. Nil means the
	// evidence is unknown.
	Probe func(ctx context.Context) (sdk.Health, error)
	// NextSeq is the transport session's health_observation_seq source
	// (R7), drawn once per finalized observation. Nil (no connection)
	// omits the key: the observation carries 0.
	NextSeq func() uint64
	// Observed, if set, is given the evidence of a finalized stall just
	// before its health_observation_seq is drawn, so that whatever it
	// records (the provider target's health) is in place by the time the
	// sequence shows the observation (see ProviderStatusUpdate).
	Observed func(Evidence)
	// OnStall, if set, is called on the timer's goroutine once the stall
	// is claimed (Stalled is closed): it finishes the stall there (Finish)
	// and sends its terminal, so that no goroutine of the call's waits on
	// Stalled meanwhile.
	OnStall func()

	// Identity carried in the observation.
	NodeID     string
	Generation uint64
	Provider   string
	Target     string
}

// Watchdog is the activity watchdog of one provider call (R5). Its
// methods are safe for concurrent use.
type Watchdog struct {
	cfg        WatchdogConfig
	claim      *Claim // the call's; the timer takes the stall from it
	cancelCall context.CancelCauseFunc
	stalled    chan struct{}
	returned   chan struct{}

	// emitSem (capacity 1) serializes emission with the fence: once the
	// fence is up, no output starts. A channel rather than a mutex, so a
	// wait on it is durable under testing/synctest.
	emitSem chan struct{}

	mu           sync.Mutex
	timer        *time.Timer
	started      bool
	stopped      bool
	lastProgress time.Time
	sinceLast    time.Duration // at the stall: the time without progress
	fenced       bool          // the stall was taken: output is dropped
	finishing    bool
	dropped      uint64
	returnedAt   time.Time
}

// NewWatchdog returns a watchdog, not armed yet (see Start), whose timer
// takes the stall from claim. cancelCall cancels the provider call when
// the stall is finished.
func NewWatchdog(cfg WatchdogConfig, claim *Claim, cancelCall context.CancelCauseFunc) *Watchdog {
	if cfg.CloseGrace <= 0 {
		cfg.CloseGrace = DefaultCloseGrace
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = DefaultProbeTimeout
	}
	if cancelCall == nil {
		cancelCall = func(error) {}
	}
	return &Watchdog{cfg: cfg, claim: claim, cancelCall: cancelCall,
		stalled: make(chan struct{}), returned: make(chan struct{}), emitSem: make(chan struct{}, 1)}
}

// Start arms the timer: the stall is claimed StallTimeout after Start or
// the last progress, whichever is later. Later calls do nothing.
func (w *Watchdog) Start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started || w.stopped || w.claim.Winner() != CauseNone {
		return
	}
	w.started = true
	w.lastProgress = time.Now()
	w.timer = time.AfterFunc(w.cfg.StallTimeout, w.fire)
}

// Progress records progress: only progress resets the timer. It does
// nothing once the outcome is claimed.
func (w *Watchdog) Progress() {
	w.mu.Lock()
	if w.claim.Winner() == CauseNone {
		w.lastProgress = time.Now()
	}
	w.mu.Unlock()
}

// fire is the timer's callback. The timer is not reset on every progress:
// when it fires early it re-arms for the rest of the timeout since the last
// progress, so the stall is claimed exactly StallTimeout after it.
func (w *Watchdog) fire() {
	if w.claimStall() && w.cfg.OnStall != nil {
		w.cfg.OnStall()
	}
}

// claimStall takes the stall from the claim if the timeout has passed
// since the last progress, and reports whether it did; otherwise it
// re-arms the timer for the rest of the timeout.
func (w *Watchdog) claimStall() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.claim.Winner() != CauseNone {
		return false
	}
	now := time.Now()
	if idle := now.Sub(w.lastProgress); idle < w.cfg.StallTimeout {
		w.timer.Reset(w.cfg.StallTimeout - idle)
		return false
	}
	if !w.claim.TakeStall(now) {
		return false // the cause that ended the context has the outcome (S5)
	}
	w.sinceLast = now.Sub(w.lastProgress)
	w.fenced = true
	close(w.stalled)
	return true
}

// Stalled is closed when the stall is claimed. A deadline or disconnect
// claimed at the same instant may still take the outcome over (see
// Claim); Finish then returns nil.
func (w *Watchdog) Stalled() <-chan struct{} { return w.stalled }

// CallReturned tells the watchdog that the provider call returned; it
// confirms the close when it comes inside the close grace.
func (w *Watchdog) CallReturned() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.returnedAt.IsZero() {
		w.returnedAt = time.Now()
		close(w.returned)
	}
}

// Emit passes one output item through the fence: after the stall is
// claimed it is dropped and counted and Emit returns ErrFenced; otherwise
// progress (see RunEventIsProgress, TunnelFrameIsProgress) is recorded and
// send is called. Emission is serialized: no send starts after the fence.
func (w *Watchdog) Emit(progress bool, send func() error) error {
	w.emitSem <- struct{}{}
	defer func() { <-w.emitSem }()
	w.mu.Lock()
	if w.fenced {
		w.dropped++
		w.mu.Unlock()
		return ErrFenced
	}
	if progress && w.claim.Winner() == CauseNone {
		w.lastProgress = time.Now()
	}
	w.mu.Unlock()
	return send()
}

// Fenced reports whether output is fenced (the stall was claimed).
func (w *Watchdog) Fenced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fenced
}

// Dropped is how many output items the fence dropped.
func (w *Watchdog) Dropped() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// Finish produces the metadata of the single response_stalled terminal. It
// is called once, after Stalled is closed; otherwise, or if a deadline or
// disconnect took the outcome over (see Claim), or on a second call, it
// returns nil. It cancels the provider call with ErrStalled, waits until
// no output is being sent (the fence; a send stuck on flow control holds
// it until the stream is reset), and runs the close grace and the
// probe concurrently, joining both: it takes max(grace, probe), bounded by
// max(CloseGrace, ProbeTimeout). The result holds no payload text.
func (w *Watchdog) Finish() *wirepb.StallObservation {
	w.mu.Lock()
	if !w.fenced || w.finishing || w.claim.Winner() != CauseStalled {
		w.mu.Unlock()
		return nil
	}
	w.finishing = true
	w.mu.Unlock()

	w.cancelCall(ErrStalled)
	graceEnd := time.Now().Add(w.cfg.CloseGrace)
	grace := make(chan bool, 1)
	go func() { grace <- w.closeConfirmed(graceEnd) }()
	probe := make(chan Evidence, 1)
	go func() { probe <- w.probe() }()
	w.emitSem <- struct{}{} // the fence: wait out a send that started before it
	<-w.emitSem
	confirmed, ev := <-grace, <-probe

	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.claim.FinalizeStall() {
		return nil
	}
	if w.cfg.Observed != nil {
		w.cfg.Observed(ev)
	}
	var seq uint64
	if w.cfg.NextSeq != nil {
		seq = w.cfg.NextSeq()
	}
	return &wirepb.StallObservation{
		StallTimeoutMs:         w.cfg.StallTimeout.Milliseconds(),
		SinceLastProgressMs:    w.sinceLast.Milliseconds(),
		CloseConfirmed:         confirmed,
		ProviderHealth:         ev.ProviderHealth,
		LivenessClassification: ev.Classification,
		HealthObservationSeq:   seq,
		NodeId:                 w.cfg.NodeID,
		Generation:             w.cfg.Generation,
		Provider:               w.cfg.Provider,
		Target:                 w.cfg.Target,
		Retryable:              confirmed,
	}
}

// closeConfirmed waits until the call returns or the grace ends. The close
// is confirmed only when the call returned strictly before graceEnd, so a
// return at the very instant the grace ends is not (deterministically).
func (w *Watchdog) closeConfirmed(graceEnd time.Time) bool {
	t := time.NewTimer(time.Until(graceEnd))
	defer t.Stop()
	select {
	case <-w.returned:
	case <-t.C:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.returnedAt.IsZero() && w.returnedAt.Before(graceEnd)
}

// probe runs the exact-target probe under its own deadline, derived from a
// fresh context rather than the run's (cancelled) one. An answer that
// comes at or after the deadline, or a probe that does not return by it,
// is unknown.
func (w *Watchdog) probe() Evidence {
	if w.cfg.Probe == nil {
		return EvidenceFrom(sdk.Health{}, errors.New("no probe"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.ProbeTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	type answer struct {
		h   sdk.Health
		err error
	}
	done := make(chan answer, 1)
	go func() {
		h, err := w.cfg.Probe(ctx)
		done <- answer{h, err}
	}()
	t := time.NewTimer(w.cfg.ProbeTimeout)
	defer t.Stop()
	select {
	case a := <-done:
		if !time.Now().Before(deadline) {
			return EvidenceFrom(sdk.Health{}, context.DeadlineExceeded)
		}
		return EvidenceFrom(a.h, a.err)
	case <-t.C:
		return EvidenceFrom(sdk.Health{}, context.DeadlineExceeded)
	}
}

// Stop disarms the timer. A stall already claimed stays claimed.
func (w *Watchdog) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}
