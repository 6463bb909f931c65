package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/auth"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/edge/nodeserver"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The dispatch loop, driven through its interfaces: for every kind of work
// (run, tunnel, embedding call), candidates × each one's first answers →
// the attempts made (with hold-offs as repeated attempts on one
// candidate), the failover reasons, and what the caller gets.

// first is what a fake candidate answers first.
type first string

const (
	answers     first = "answers"     // a first event, a response head, vectors
	lost        first = "lost"        // DISCONNECTED: the Node was lost (R9)
	refuses     first = "refuses"     // FAILED provider_unavailable
	busyNode    first = "busy"        // FAILED capacity_exhausted: the Node is still finishing a call
	refusedBusy first = "refusedBusy" // the Node refused the stream busy: other Edges hold its slots (issue 22)
	stallsOnce  first = "stalls"      // RESPONSE_STALLED, its call confirmed closed (retryable)
	stallsHard  first = "stallsHard"  // RESPONSE_STALLED, not retryable
	rejects     first = "rejects"     // FAILED invalid_request: the client's answer
	noStream    first = "noStream"    // the dispatch fails: no stream opened
	streamWait  first = "streamWait"  // no stream free on the Node's connection
	turnsSilent first = "turnsSilent" // the Node turns suspect before answering (P4)
)

// busyRefusals is how many busy refusals fit in the default queue timeout,
// one per sched.FullBackoff (issue 22: a Node whose slots other Edges hold
// keeps a request waiting as long as its queue would, then it is a failed
// attempt).
const busyRefusals = int(edgeconfig.DefaultQueueTimeout / sched.FullBackoff)

func TestTheLoopKeepsHoldsOffOrMovesOnEachFirstAnswer(t *testing.T) {
	type want struct {
		attempts string // the nodes tried, in order
		reasons  string // the failover reasons, in order
		kept     string // the node the work stayed on; "" when it failed
		err      error  // errors.Is the caller's error (when nothing was kept)
		answer   bool   // the work kept ended before answering (its failure is the client's)
		full     string // the nodes marked full, in order
	}
	busy7 := slices.Repeat([]first{busyNode}, 8)
	cases := []struct {
		name   string
		nodes  []string
		firsts map[string][]first
		want   want
	}{
		{"the first candidate answers", []string{"n1", "n2"}, map[string][]first{"n1": {answers}},
			want{attempts: "n1", kept: "n1"}},
		{"a lost Node: the next candidate", []string{"n1", "n2"}, map[string][]first{"n1": {lost}, "n2": {answers}},
			want{attempts: "n1 n2", reasons: "before_first_byte", kept: "n2"}},
		{"a refusing provider: the next candidate", []string{"n1", "n2"}, map[string][]first{"n1": {refuses}, "n2": {answers}},
			want{attempts: "n1 n2", reasons: "before_first_byte", kept: "n2"}},
		{"no stream opened: the next candidate", []string{"n1", "n2"}, map[string][]first{"n1": {noStream}, "n2": {answers}},
			want{attempts: "n1 n2", reasons: "before_first_byte", kept: "n2"}},
		{"a busy Node is held off, not left", []string{"n1", "n2"}, map[string][]first{"n1": {busyNode, busyNode, answers}},
			want{attempts: "n1 n1 n1", kept: "n1"}},
		{"a Node busy past the hold-offs: the next candidate", []string{"n1", "n2"}, map[string][]first{"n1": busy7, "n2": {answers}},
			want{attempts: "n1 n1 n1 n1 n1 n1 n1 n1 n2", reasons: "before_first_byte", kept: "n2"}},
		{"a Node refusing busy is marked full: the next candidate, no failover", []string{"n1", "n2"}, map[string][]first{"n1": {refusedBusy}, "n2": {answers}},
			want{attempts: "n1 n2", kept: "n2", full: "n1"}},
		{"the only Node refusing busy: the queue, then the same Node", []string{"n1"}, map[string][]first{"n1": {refusedBusy, refusedBusy, answers}},
			want{attempts: "n1 n1 n1", kept: "n1", full: "n1 n1"}},
		{"a Node busy for as long as the queue timeout: a failed attempt", []string{"n1"}, map[string][]first{"n1": slices.Repeat([]first{refusedBusy}, busyRefusals+1)},
			want{attempts: strings.TrimSpace(strings.Repeat("n1 ", busyRefusals+1)), reasons: "before_first_byte", full: strings.TrimSpace(strings.Repeat("n1 ", busyRefusals)), err: errLastEnding}},
		{"a confirmed stall is retried once elsewhere", []string{"n1", "n2"}, map[string][]first{"n1": {stallsOnce}, "n2": {answers}},
			want{attempts: "n1 n2", reasons: "response_stalled", kept: "n2"}},
		{"a second stall is the client's answer", []string{"n1", "n2", "n3"}, map[string][]first{"n1": {stallsOnce}, "n2": {stallsOnce}},
			want{attempts: "n1 n2", reasons: "response_stalled", kept: "n2", answer: true}},
		{"an unconfirmed stall is the client's answer", []string{"n1", "n2"}, map[string][]first{"n1": {stallsHard}},
			want{attempts: "n1", kept: "n1", answer: true}},
		{"a rejected request is the client's answer", []string{"n1", "n2"}, map[string][]first{"n1": {rejects}},
			want{attempts: "n1", kept: "n1", answer: true}},
		{"a Node that turns suspect before its first byte", []string{"n1", "n2"}, map[string][]first{"n1": {turnsSilent}, "n2": {answers}},
			want{attempts: "n1 n2", reasons: "node_suspect", kept: "n2"}},
		{"every candidate lost: the last says why", []string{"n1", "n2"}, map[string][]first{"n1": {lost}, "n2": {lost}},
			want{attempts: "n1 n2", reasons: "before_first_byte before_first_byte", err: errLastEnding}},
		{"at most MaxAttempts candidates", []string{"n1", "n2", "n3", "n4"}, map[string][]first{"n1": {lost}, "n2": {lost}, "n3": {lost}, "n4": {answers}},
			want{attempts: "n1 n2 n3", reasons: "before_first_byte before_first_byte before_first_byte", err: errLastEnding}},
		{"no stream free anywhere is a queue timeout", []string{"n1"}, map[string][]first{"n1": {streamWait}},
			want{attempts: "n1", reasons: "before_first_byte", err: sched.ErrQueueTimeout}},
		{"a model nobody offers is unknown", nil, nil,
			want{err: ErrUnknownModel}},
	}
	for _, kind := range []string{"run", "tunnel", "embed"} {
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					fl := newFakeFleet(c.nodes, c.firsts)
					log := &failovers{}
					d := New(loopConfig(t), fl, fl, Options{Logger: slog.New(log)})
					plan, err := d.Resolve(auth.Principal{Name: "p", Routes: []string{edgeconfig.AllRoutes}}, "m")
					if err != nil {
						t.Fatal(err)
					}
					kept, ended, err := start(t, d, kind, plan)
					if got := strings.Join(fl.attempts, " "); got != c.want.attempts {
						t.Errorf("attempts %q, want %q", got, c.want.attempts)
					}
					if got := strings.Join(fl.marked, " "); got != c.want.full {
						t.Errorf("marked full %q, want %q", got, c.want.full)
					}
					if got := strings.Join(log.reasons(), " "); got != c.want.reasons {
						t.Errorf("failover reasons %q, want %q", got, c.want.reasons)
					}
					wantKept, wantErr := c.want.kept, c.want.err
					if kind == "tunnel" && c.want.answer {
						// A tunnel that ends before its head is its start's error.
						wantKept, wantErr = "", errLastEnding
					}
					if kept != wantKept {
						t.Errorf("kept on %q (err %v), want %q", kept, err, wantKept)
					}
					if wantKept != "" && ended != c.want.answer {
						t.Errorf("the kept work ended before answering: %v, want %v", ended, c.want.answer)
					}
					switch {
					case wantErr == nil && err != nil:
						t.Errorf("err %v, want none", err)
					case wantErr == errLastEnding && !lastEnding(err):
						t.Errorf("err %v, want the last candidate's ending", err)
					case wantErr != nil && wantErr != errLastEnding && !errors.Is(err, wantErr):
						t.Errorf("err %v, want %v", err, wantErr)
					}
					if n := fl.held(); n != 0 {
						t.Errorf("%d slots still held after the work ended", n)
					}
				})
			})
		}
	}
}

// errLastEnding stands for "the last candidate's ending" in the table.
var errLastEnding = errors.New("the last candidate's ending")

// lastEnding reports whether err is the ending of the last candidate tried.
func lastEnding(err error) bool {
	var failed *RunFailedError
	var te *nodeserver.TunnelError
	return errors.As(err, &failed) || errors.As(err, &te)
}

// start starts work of kind under plan, and ends it: it reports the node
// it was kept on, whether that work ended before answering (a failure the
// client gets: a kept terminal, or a tunnel's ending before its head).
func start(t *testing.T, d *Dispatcher, kind string, plan Plan) (kept string, ended bool, err error) {
	t.Helper()
	switch kind {
	case "run":
		r, err := d.StartRun(t.Context(), &plan, &wirepb.RunRequest{}, Watch{})
		if err != nil {
			return "", false, err
		}
		defer r.Close()
		ev, _ := r.Next()
		return r.Node().NodeID, ev.GetType().IsTerminal() && ev.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, nil
	case "tunnel":
		tn, err := d.StartTunnel(t.Context(), &plan, &wirepb.TunnelRequest{}, func(string) ([]byte, error) { return nil, nil }, Watch{})
		if err != nil {
			return "", false, err
		}
		defer tn.Close()
		return tn.Node().NodeID, false, nil
	}
	e, err := d.Embed(t.Context(), &plan, &wirepb.EmbedRequest{Inputs: []string{"x"}}, Watch{}, nil)
	if err != nil {
		return "", false, err
	}
	return e.Node.NodeID, e.Terminal.GetType() != wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED, nil
}

// Issue 25 (P3): a tunnel holds the request it was given, not a copy of
// it, while it waits; each attempt sends a request of its own, made from
// it, with the candidate's provider and target, and the caller's request
// is left as the base for the next attempt.
func TestATunnelTakesItsRequestAndEachAttemptSendsItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fl := newFakeFleet([]string{"n1", "n2"}, map[string][]first{"n1": {lost}, "n2": {answers}})
		d := New(loopConfig(t), fl, fl, Options{})
		plan, err := d.Resolve(auth.Principal{Name: "p", Routes: []string{edgeconfig.AllRoutes}}, "m")
		if err != nil {
			t.Fatal(err)
		}
		req := &wirepb.TunnelRequest{Method: "POST", Path: "/api/chat", Headers: []*wirepb.Header{{Name: "Content-Length", Value: "999"}}}
		tn, err := d.StartTunnel(t.Context(), &plan, req, func(target string) ([]byte, error) { return []byte(target), nil }, Watch{})
		if err != nil {
			t.Fatal(err)
		}
		defer tn.Close()
		if req.GetTunnelId() != tn.ID() || req.GetDeadlineUnixMs() == 0 {
			t.Errorf("the request given carries id %q and deadline %d: it was copied, not taken (tunnel %q)", req.GetTunnelId(), req.GetDeadlineUnixMs(), tn.ID())
		}
		if req.GetProvider() != "" || req.GetSealedLease() != nil || len(req.GetHeaders()) != 1 || req.GetHeaders()[0].GetValue() != "999" {
			t.Errorf("an attempt changed the base request: %v", req)
		}
		if len(fl.tunnels) != 2 {
			t.Fatalf("%d attempts sent, want 2", len(fl.tunnels))
		}
		for i, sent := range fl.tunnels {
			if sent == req || sent.GetTunnelId() != tn.ID() || sent.GetPath() != "/api/chat" || sent.GetTarget() != "m" || sent.GetProvider() == "" {
				t.Errorf("attempt %d sent %v", i, sent)
			}
			if h := sent.GetHeaders(); len(h) != 1 || h[0].GetValue() != "1" {
				t.Errorf("attempt %d headers %v, want its own body's Content-Length 1", i, h)
			}
		}
		if fl.tunnels[0] == fl.tunnels[1] {
			t.Error("both attempts sent one request")
		}
	})
}

func loopConfig(t *testing.T) *edgeconfig.Config {
	t.Helper()
	cfg, err := edgeconfig.Parse([]byte(`
listen: {http: "127.0.0.1:8080", quic: "127.0.0.1:7443"}
identity: {mode: loopback}
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// fakeFleet is Slots and Nodes over named nodes, one candidate each
// (target "m", an adapter that embeds), whose streams answer firsts in
// turn: the last one again once they are used up.
type fakeFleet struct {
	nodes  []string
	firsts map[string][]first
	// busy nodes are past the bounded load for a request that prefers
	// them: it gets the first other candidate.
	busy map[string]bool

	mu       sync.Mutex
	attempts []string
	slots    int // held
	// marked are the nodes marked full, in order; full, those still
	// marked: Acquire passes them over while another candidate is free,
	// and clears the marks when none is, as the scheduler's queue does
	// once the Node reports a slot free.
	marked []string
	full   map[string]bool
	// tunnels are the requests each tunnel attempt sent, in order.
	tunnels []*wirepb.TunnelRequest
}

func (f *fakeFleet) MarkFull(c sched.Candidate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marked = append(f.marked, c.NodeID)
	if f.full == nil {
		f.full = map[string]bool{}
	}
	f.full[c.NodeID] = true
}

func newFakeFleet(nodes []string, firsts map[string][]first) *fakeFleet {
	f := &fakeFleet{nodes: nodes, firsts: map[string][]first{}}
	for n, fs := range firsts {
		f.firsts[n] = slices.Clone(fs)
	}
	return f
}

func (f *fakeFleet) Candidates() []sched.Candidate {
	var cs []sched.Candidate
	for _, n := range f.nodes {
		cs = append(cs, sched.Candidate{NodeID: n, Provider: "p", Adapter: "a", Target: "m", Capabilities: []string{CapEmbed}})
	}
	return cs
}

func (f *fakeFleet) Matching(match func(sched.Candidate) bool) []sched.Candidate {
	var cs []sched.Candidate
	for _, c := range f.Candidates() {
		if match(c) {
			cs = append(cs, c)
		}
	}
	return cs
}

func (f *fakeFleet) Any(match func(sched.Candidate) bool) bool { return len(f.Matching(match)) > 0 }

func (f *fakeFleet) Acquire(_ context.Context, r sched.Request) (Slot, error) {
	cands := f.Candidates()
	if p := r.Prefer; p != nil && !f.busy[p.NodeID] {
		// The preferred first, as the scheduler picks it within its load.
		slices.SortStableFunc(cands, func(a, b sched.Candidate) int {
			switch {
			case a.NodeID == p.NodeID:
				return -1
			case b.NodeID == p.NodeID:
				return 1
			}
			return 0
		})
	}
	f.mu.Lock()
	if len(f.full) > 0 && !slices.ContainsFunc(cands, func(c sched.Candidate) bool { return !f.full[c.NodeID] }) {
		// Every one full: the queue waits for a free slot, as long as
		// the scheduler's backoff at most.
		clear(f.full)
		f.mu.Unlock()
		time.Sleep(sched.FullBackoff)
		f.mu.Lock()
	}
	slices.SortStableFunc(cands, func(a, b sched.Candidate) int {
		switch {
		case f.full[a.NodeID] && !f.full[b.NodeID]:
			return 1
		case f.full[b.NodeID] && !f.full[a.NodeID]:
			return -1
		}
		return 0
	})
	f.mu.Unlock()
	for _, c := range cands {
		if r.Match(c) && !slices.ContainsFunc(r.Exclude, func(x sched.Candidate) bool { return x.NodeID == c.NodeID }) {
			f.mu.Lock()
			f.slots++
			f.mu.Unlock()
			return &fakeSlot{f: f, c: c}, nil
		}
	}
	return nil, &sched.RefusalError{Reason: sched.ReasonNoCandidate, Model: r.Model}
}

func (f *fakeFleet) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slots
}

// next is node's next first answer, noted as an attempt.
func (f *fakeFleet) next(node string) first {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, node)
	fs := f.firsts[node]
	if len(fs) == 0 {
		return answers
	}
	a := fs[0]
	if len(fs) > 1 {
		f.firsts[node] = fs[1:]
	}
	return a
}

func (f *fakeFleet) Offers(match func(sched.Candidate) bool) bool {
	return slices.ContainsFunc(f.Candidates(), match)
}

func (f *fakeFleet) Online(string) []NodeProvider { return nil }

func (f *fakeFleet) open(nodeID string) (*fakeStream, error) {
	switch a := f.next(nodeID); a {
	case noStream:
		return nil, fmt.Errorf("node %s: not dispatchable", nodeID)
	case streamWait:
		return nil, nodeserver.ErrStreamWait
	default:
		return &fakeStream{first: a}, nil
	}
}

func (f *fakeFleet) Run(_ context.Context, nodeID string, _ *wirepb.RunRequest) (RunStream, error) {
	s, err := f.open(nodeID)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (f *fakeFleet) Tunnel(_ context.Context, nodeID string, req *wirepb.TunnelRequest, _ io.Reader) (TunnelStream, error) {
	f.mu.Lock()
	f.tunnels = append(f.tunnels, req)
	f.mu.Unlock()
	s, err := f.open(nodeID)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (f *fakeFleet) Embed(_ context.Context, nodeID string, _ *wirepb.EmbedRequest) (EmbedStream, error) {
	s, err := f.open(nodeID)
	if err != nil {
		return nil, err
	}
	return s, nil
}

type fakeSlot struct {
	f        *fakeFleet
	c        sched.Candidate
	released bool
}

func (s *fakeSlot) Candidate() sched.Candidate { return s.c }
func (s *fakeSlot) Conn() Conn                 { return fakeConn{suspect: s.f.suspect(s.c.NodeID)} }
func (s *fakeSlot) Release() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if !s.released {
		s.released = true
		s.f.slots--
	}
}

// suspect reports whether node's next answer is to turn silent.
func (f *fakeFleet) suspect(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	fs := f.firsts[node]
	return len(fs) > 0 && fs[0] == turnsSilent
}

// fakeConn turns suspect at once when it is to.
type fakeConn struct{ suspect bool }

func (fakeConn) Generation() uint64 { return 1 }
func (fakeConn) Verified() bool     { return false }
func (fakeConn) Identity() string   { return "loopback" }
func (fakeConn) LeaseKey() []byte   { return nil }
func (c fakeConn) AfterSuspect(f func()) func() bool {
	if c.suspect {
		f()
	}
	return func() bool { return true }
}

// fakeStream is a run, tunnel and embedding call whose first answer is
// first; an answered run completes after its first event.
type fakeStream struct {
	first     first
	abandoned bool
	read      int
}

func (s *fakeStream) Abandon(error) bool { s.abandoned = true; return true }
func (s *fakeStream) Abandoned() bool    { return s.abandoned }
func (s *fakeStream) Ready() bool        { return false }
func (s *fakeStream) Close()             {}

// ending is the terminal of a first answer other than answers.
func (s *fakeStream) ending() *wirepb.RunEvent {
	fail := func(k wirepb.FailureKind) *wirepb.RunEvent {
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED, Failure: &wirepb.Failure{Kind: k}}
	}
	stall := func(retryable bool) *wirepb.RunEvent {
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED,
			Stall: &wirepb.StallObservation{Retryable: retryable, LivenessClassification: "request_stalled"}}
	}
	switch {
	case s.abandoned, s.first == lost, s.first == turnsSilent:
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED}
	case s.first == refuses:
		return fail(wirepb.FailureKind_FAILURE_KIND_PROVIDER_UNAVAILABLE)
	case s.first == busyNode:
		return fail(wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED)
	case s.first == refusedBusy:
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_FAILED,
			Failure: &wirepb.Failure{Kind: wirepb.FailureKind_FAILURE_KIND_CAPACITY_EXHAUSTED, Reason: nodeserver.BusyReason, Retryable: true}}
	case s.first == stallsOnce:
		return stall(true)
	case s.first == stallsHard:
		return stall(false)
	case s.first == rejects:
		return fail(wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST)
	}
	return nil
}

func (s *fakeStream) Next() (*wirepb.RunEvent, error) {
	s.read++
	switch {
	case s.read > 2:
		return nil, io.EOF
	case s.read == 2:
		return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED}, nil
	}
	if ev := s.ending(); ev != nil {
		s.read = 2
		return ev, nil
	}
	return &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_TEXT_DELTA, Text: "a"}, nil
}

func (s *fakeStream) Head() (*wirepb.TunnelResponseHead, error) {
	if ev := s.ending(); ev != nil {
		te := &nodeserver.TunnelError{Outcome: wirepb.TunnelOutcome_TUNNEL_OUTCOME_FAILED, Failure: ev.GetFailure(), Stall: ev.GetStall()}
		switch ev.GetType() {
		case wirepb.RunEventType_RUN_EVENT_TYPE_DISCONNECTED:
			te.Outcome = wirepb.TunnelOutcome_TUNNEL_OUTCOME_DISCONNECTED
		case wirepb.RunEventType_RUN_EVENT_TYPE_RESPONSE_STALLED:
			te.Outcome = wirepb.TunnelOutcome_TUNNEL_OUTCOME_RESPONSE_STALLED
		}
		return nil, te
	}
	return &wirepb.TunnelResponseHead{Status: 200}, nil
}

func (s *fakeStream) Read([]byte) (int, error)         { return 0, io.EOF }
func (s *fakeStream) NextPiece() ([]byte, error)       { return nil, io.EOF }
func (s *fakeStream) Terminal() *wirepb.TunnelTerminal { return nil }

func (s *fakeStream) Wait(func()) ([]*wirepb.Vector, *wirepb.RunEvent) {
	if ev := s.ending(); ev != nil {
		return nil, ev
	}
	return []*wirepb.Vector{{Values: []float32{1}}}, &wirepb.RunEvent{Type: wirepb.RunEventType_RUN_EVENT_TYPE_COMPLETED}
}

// failovers is a log handler that keeps the reason of every failover.
type failovers struct {
	mu  sync.Mutex
	got []string
}

func (h *failovers) Enabled(context.Context, slog.Level) bool { return true }
func (h *failovers) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *failovers) WithGroup(string) slog.Handler            { return h }
func (h *failovers) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "moving work to another candidate" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			h.mu.Lock()
			h.got = append(h.got, a.Value.String())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func (h *failovers) reasons() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// The hold-offs of a busy Node are 20 ms doubling each time, maxHoldOffs
// of them (about 2.5 s in all), and end with their context.
func TestHoldOffsAreBoundedInNumberAndTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		n := 0
		for holdOff(t.Context(), n) {
			n++
		}
		if n != maxHoldOffs || time.Since(start) != 20*time.Millisecond*(1<<maxHoldOffs-1) {
			t.Errorf("%d hold-offs in %v", n, time.Since(start))
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if holdOff(ctx, 0) {
			t.Error("a hold-off outlived its context")
		}
	})
}
