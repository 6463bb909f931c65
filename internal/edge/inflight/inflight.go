// Package inflight tracks the work in flight on the Edge, for its status page:
// each run, tunnel and embedding call from admission to its terminal, with
// its phase (queued, prefill, streaming), time to first token and tokens
// so far, and how recent work ended, by reason, over the last minutes.
//
// The front end starts and ends an Entry (with the code its client is
// answered with); the dispatcher drives it in between:
//
//	Start ──▶ queued ──Dispatched──▶ prefill ──First──▶ streaming ──End
//	            ▲                       │
//	            └───────Queued──────────┘   (a failover waits again)
//
// Prefill is the phase other gateways cannot tell from a hang: the work is
// on a Node, the provider has not produced a token yet.
//
// The hot path is cheap: a token is one atomic add on its Entry (Add), with
// no lock and no allocation; the tracker's lock is taken a few times per
// piece of work (Start, Dispatched, End) and by Snapshot. Memory is
// bounded: the live set by the work the scheduler admits, the ended entries
// by a fixed ring, the terminal counts by a ring of per-minute buckets.
package inflight

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is what a piece of work is.
type Kind string

// Kinds of work.
const (
	Run    Kind = "run"    // a normalized run
	Tunnel Kind = "tunnel" // a provider's own HTTP API, relayed (R3)
	Embed  Kind = "embed"  // an embedding call
)

// Phase is where live work is.
type Phase int32

// Phases, in the order work goes through them.
const (
	// Queued: waiting for a slot.
	Queued Phase = iota
	// Prefill: dispatched to a Node, no output yet.
	Prefill
	// Streaming: output has come back.
	Streaming
)

var phaseNames = [...]string{"queued", "prefill", "streaming"}

// String returns the phase's name as the admin API spells it.
func (p Phase) String() string {
	if p >= 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "unknown"
}

// MarshalText spells the phase as String does.
func (p Phase) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// Reasons a piece of work ended with, beside the gateway's failure codes
// ("response_stalled", "deadline_exceeded", "lease_rejected", ...).
const (
	// Completed: the work ended with its normal terminal.
	Completed = "completed"
	// Other stands for any reason past MaxReasons in one minute.
	Other = "other"
)

// Defaults of Options.
const (
	DefaultWindow = 15 // minutes of terminal counts
	DefaultRecent = 20 // ended entries kept
	// MaxReasons bounds the distinct reasons counted in one minute; the
	// rest count as Other.
	MaxReasons = 32
)

// Options are the optional parts of a Tracker.
type Options struct {
	// Window is how many minutes of terminal counts are kept; 0 is
	// DefaultWindow.
	Window int
	// Recent is how many ended entries are kept; 0 is DefaultRecent.
	Recent int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Usage, when set, is told the usage of every piece of work that
	// ends after it was dispatched: the cluster's usage ledger (issue 22).
	Usage UsageRecorder
}

// UsageRecorder takes the usage of a piece of work as it ends: who asked
// (the principal's name), for which model (as the client named it), the
// Node it last ran on, and the tokens its provider reported (0 when it
// reported none). It is called once per piece of work, on the goroutine
// that ends it, outside the tracker's lock: it must be quick (an addition
// in memory), never a write per call.
type UsageRecorder interface {
	Record(principal, model, node string, promptTokens, completionTokens int64)
}

// Tracker holds the live work and the recent terminals. A nil *Tracker
// tracks nothing: Start returns a nil *Entry, whose methods do nothing.
type Tracker struct {
	now   func() time.Time
	usage UsageRecorder

	mu      sync.Mutex
	live    map[*Entry]struct{}
	recent  []View // ring of ended entries; next is the slot to write
	next    int
	ended   int // entries ended so far, to know how much of recent is filled
	minutes []bucket
}

// bucket counts the terminals of one minute.
type bucket struct {
	minute int64 // Unix minute; 0 for never used
	counts map[string]uint64
}

// New returns an empty tracker.
func New(opts Options) *Tracker {
	t := &Tracker{now: opts.Now, usage: opts.Usage, live: make(map[*Entry]struct{})}
	if t.now == nil {
		t.now = time.Now
	}
	t.recent = make([]View, cmp.Or(opts.Recent, DefaultRecent))
	t.minutes = make([]bucket, cmp.Or(opts.Window, DefaultWindow))
	return t
}

// Work is what is known of a piece of work when it starts.
type Work struct {
	Kind Kind
	ID   string
	// API is the client API route it came in by ("openai_chat",
	// "ollama_generate", ...); "" when it did not come from a client API.
	API       string
	Model     string
	Principal string
	// Arrived is when the client's request arrived; zero is now.
	Arrived time.Time
}

// Entry is one piece of live work. Its methods are safe on a nil *Entry
// (they do nothing) and from any goroutine; Add is the one made for the
// hot path.
type Entry struct {
	t *Tracker
	w Work

	// Guarded by t.mu.
	node, provider, target string
	dispatched             time.Time
	attempts               int
	done                   bool

	phase atomic.Int32
	// firstNanos is the time to first output in nanoseconds; 0 before it.
	firstNanos atomic.Int64
	tokens     atomic.Int64
	// prompt and completion are the provider's own counts, when reported.
	prompt, completion atomic.Int64
}

// Start begins tracking w, queued.
func (t *Tracker) Start(w Work) *Entry {
	if t == nil {
		return nil
	}
	if w.Arrived.IsZero() {
		w.Arrived = t.now()
	}
	e := &Entry{t: t, w: w}
	t.mu.Lock()
	t.live[e] = struct{}{}
	t.mu.Unlock()
	return e
}

// Identify names the work with the id the dispatcher gave it, which it
// has once it is resolved; the front end starts tracking before that.
func (e *Entry) Identify(id string) {
	if e == nil {
		return
	}
	e.t.mu.Lock()
	e.w.ID = id
	e.t.mu.Unlock()
}

// Queued notes that the work waits for a slot again (a failover).
func (e *Entry) Queued() {
	if e == nil {
		return
	}
	e.phase.Store(int32(Queued))
}

// Dispatched notes that the work was sent to provider's target on node:
// it is in prefill until First.
func (e *Entry) Dispatched(node, provider, target string) {
	if e == nil {
		return
	}
	e.t.mu.Lock()
	e.node, e.provider, e.target = node, provider, target
	e.dispatched = e.t.now()
	e.attempts++
	e.t.mu.Unlock()
	if Phase(e.phase.Load()) != Streaming {
		e.phase.Store(int32(Prefill))
	}
}

// First notes the work's first output: its time to first token is now,
// and it is streaming. Only the first call counts.
func (e *Entry) First() {
	if e == nil {
		return
	}
	ttft := max(int64(e.t.now().Sub(e.w.Arrived)), 1)
	if e.firstNanos.CompareAndSwap(0, ttft) {
		e.phase.Store(int32(Streaming))
	}
}

// Add counts n tokens of output (for a tunnel, n lines of its stream): one
// atomic add, for the hot path.
func (e *Entry) Add(n int64) {
	if e == nil {
		return
	}
	e.tokens.Add(n)
}

// Usage notes the provider's own token counts; a count of 0 leaves the
// last one reported.
func (e *Entry) Usage(prompt, completion int64) {
	if e == nil {
		return
	}
	if prompt > 0 {
		e.prompt.Store(prompt)
	}
	if completion > 0 {
		e.completion.Store(completion)
	}
}

// End ends the work with reason (Completed, or the failure's code): it
// leaves the live set and is counted in its minute, and work that was
// dispatched is recorded with Options.Usage, whatever its reason (a failed
// or cancelled answer cost what its provider reported of it). Only the
// first call counts.
func (e *Entry) End(reason string) {
	if e == nil {
		return
	}
	t := e.t
	t.mu.Lock()
	if e.done {
		t.mu.Unlock()
		return
	}
	e.done = true
	delete(t.live, e)
	now := t.now()
	v := e.viewLocked(now)
	v.Reason, v.EndedAt = reason, &now
	t.recent[t.next] = v
	t.next = (t.next + 1) % len(t.recent)
	t.ended++
	t.countLocked(now, reason)
	t.mu.Unlock()
	if t.usage != nil && v.Node != "" {
		t.usage.Record(v.Principal, v.Model, v.Node, v.PromptTokens, v.CompletionTokens)
	}
}

// countLocked counts reason in the bucket of now's minute.
func (t *Tracker) countLocked(now time.Time, reason string) {
	m := now.Unix() / 60
	b := &t.minutes[m%int64(len(t.minutes))]
	if b.minute != m {
		b.minute = m
		if b.counts == nil {
			b.counts = make(map[string]uint64)
		}
		clear(b.counts)
	}
	if _, ok := b.counts[reason]; !ok && len(b.counts) >= MaxReasons {
		reason = Other
	}
	b.counts[reason]++
}

// View is one piece of work as the admin API shows it.
type View struct {
	ID        string `json:"id"`
	Kind      Kind   `json:"kind"`
	API       string `json:"api,omitempty"`
	Model     string `json:"model"`
	Principal string `json:"principal,omitempty"`
	Phase     Phase  `json:"phase"`
	// Node, Provider and Target are where it was last dispatched; empty
	// while it has not been.
	Node     string `json:"node,omitempty"`
	Provider string `json:"provider,omitempty"`
	Target   string `json:"target,omitempty"`
	// Attempts is how many times it was dispatched (more than one after a
	// failover).
	Attempts     int        `json:"attempts"`
	StartedAt    time.Time  `json:"started_at"`
	DispatchedAt *time.Time `json:"dispatched_at,omitempty"`
	// AgeMillis is how long it has lived: until now, or until it ended.
	AgeMillis float64 `json:"age_ms"`
	// TTFTMillis is the time from arrival to the first output; absent
	// before it.
	TTFTMillis *float64 `json:"ttft_ms,omitempty"`
	// Tokens is the output so far: tokens of a run (its deltas), lines of
	// a tunnel's stream.
	Tokens int64 `json:"tokens"`
	// TokensPerSecond is the pace of the output after the first: the
	// tokens since it over the time since it; absent before a second.
	TokensPerSecond float64 `json:"tokens_per_second,omitempty"`
	// PromptTokens and CompletionTokens are the provider's own counts,
	// once reported.
	PromptTokens     int64 `json:"prompt_tokens,omitempty"`
	CompletionTokens int64 `json:"completion_tokens,omitempty"`
	// Reason and EndedAt are set once it ended.
	Reason  string     `json:"reason,omitempty"`
	EndedAt *time.Time `json:"ended_at,omitempty"`
}

// viewLocked is e as of now. Callers hold t.mu.
func (e *Entry) viewLocked(now time.Time) View {
	v := View{
		ID: e.w.ID, Kind: e.w.Kind, API: e.w.API, Model: e.w.Model, Principal: e.w.Principal,
		Phase: Phase(e.phase.Load()), Node: e.node, Provider: e.provider, Target: e.target, Attempts: e.attempts,
		StartedAt: e.w.Arrived, AgeMillis: millis(now.Sub(e.w.Arrived)),
		Tokens: e.tokens.Load(), PromptTokens: e.prompt.Load(), CompletionTokens: e.completion.Load(),
	}
	if !e.dispatched.IsZero() {
		at := e.dispatched
		v.DispatchedAt = &at
	}
	if ns := e.firstNanos.Load(); ns > 0 {
		ttft := time.Duration(ns)
		ms := millis(ttft)
		v.TTFTMillis = &ms
		if streamed := now.Sub(e.w.Arrived) - ttft; streamed > 0 && v.Tokens > 1 {
			v.TokensPerSecond = float64(v.Tokens-1) / streamed.Seconds()
		}
	}
	return v
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Snapshot is the tracker's state at one moment.
type Snapshot struct {
	Now time.Time `json:"now"`
	// Live is the work in flight, oldest first.
	Live []View `json:"live"`
	// Recent is the work that ended last, newest first.
	Recent    []View    `json:"recent"`
	Terminals Terminals `json:"terminals"`
}

// Terminals counts how work ended over the last minutes.
type Terminals struct {
	WindowMinutes int `json:"window_minutes"`
	// Minutes are the window's minutes, oldest first, the current one
	// last (it is still filling).
	Minutes []Minute `json:"minutes"`
	// Totals sums Minutes by reason.
	Totals map[string]uint64 `json:"totals"`
}

// Minute is the terminals of one minute.
type Minute struct {
	Start  time.Time         `json:"start"`
	Counts map[string]uint64 `json:"counts"`
}

// Snapshot returns the live work, the recent terminals and the counts of
// the window's minutes.
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	s := Snapshot{Now: now, Live: make([]View, 0, len(t.live))}
	for e := range t.live {
		s.Live = append(s.Live, e.viewLocked(now))
	}
	slices.SortFunc(s.Live, func(a, b View) int {
		return cmp.Or(a.StartedAt.Compare(b.StartedAt), cmp.Compare(a.ID, b.ID))
	})
	n := min(t.ended, len(t.recent))
	s.Recent = make([]View, 0, n)
	for i := 1; i <= n; i++ {
		s.Recent = append(s.Recent, t.recent[(t.next-i+len(t.recent))%len(t.recent)])
	}
	window := len(t.minutes)
	s.Terminals = Terminals{WindowMinutes: window, Minutes: make([]Minute, 0, window), Totals: map[string]uint64{}}
	current := now.Unix() / 60
	for m := current - int64(window) + 1; m <= current; m++ {
		mv := Minute{Start: time.Unix(m*60, 0).UTC(), Counts: map[string]uint64{}}
		if b := t.minutes[m%int64(window)]; b.minute == m {
			for reason, c := range b.counts {
				mv.Counts[reason] = c
				s.Terminals.Totals[reason] += c
			}
		}
		s.Terminals.Minutes = append(s.Terminals.Minutes, mv)
	}
	return s
}
