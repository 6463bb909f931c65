// Package wake is the Edge's side of wake on demand (issue 23): home and
// lab fleets suspend their GPU machines, and a request for a model that
// only a sleeping machine serves should wake it rather than fail.
//
// A Node lists the machines on its LAN it can wake (noded's `wake`:
// each a Node id, a MAC and a broadcast address) when it registers. The
// Tracker remembers, for every Node some Node can wake, which models it
// served when it was last connected and who can wake it, and keeps that
// in data_dir (wake.json) so an Edge restart does not forget a machine
// that went to sleep before it. A Node is
//
//	awake     its current connection is ready (R1);
//	sleeping  it is not connected, or not ready: asleep, off, or on its
//	          way back (the Edge cannot tell these apart, and a magic
//	          packet does no harm to a machine that is up);
//	waking    a request needed it and a waker was asked to wake it.
//
// When a request needs a model that no connected Node serves but a
// sleeping one served, the dispatcher calls Wake: the first such request
// asks a connected waker that lists the Node (COMMAND_KIND_WAKE), every
// request for it meanwhile waits on that one attempt, the packet is sent
// again every ResendEvery (up to MaxSends, through another waker if the
// first is gone or failed), and the attempt ends when the Node registers
// and is ready (the requests then go to the scheduler as any other), or
// at the wake timeout (the requests are answered 503, retry).
package wake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/internal/edge/sched"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Resending: a magic packet is one UDP datagram and may be lost, and a
// machine that was still going to sleep when the first came may miss it.
const (
	// ResendEvery is how long an attempt waits for the Node before it
	// sends the packet again.
	ResendEvery = 5 * time.Second
	// MaxSends bounds the packets of one attempt.
	MaxSends = 6
	// sendTimeout bounds one wake command on the waker.
	sendTimeout = 10 * time.Second
	// MaxTargetsPerWaker bounds what one Node's wake list adds to the
	// Edge's memory (and its file): more than a LAN of GPU boxes.
	MaxTargetsPerWaker = 256
)

// State is where a Node the Edge can wake is.
type State string

// The states of a Node the Edge can wake.
const (
	Sleeping State = "sleeping"
	Waking   State = "waking"
	Awake    State = "awake"
)

// ErrNotAsleep: no sleeping Node that some Node can wake served the
// model; the request is answered as it would be without waking.
var ErrNotAsleep = errors.New("no sleeping node served the model")

// ErrCannotWake is matched by every *NoWakerError.
var ErrCannotWake = errors.New("node asleep and cannot be woken")

// NoWakerError: the model was served by sleeping Nodes, but no Node that
// can wake any of them is connected.
type NoWakerError struct {
	Model string
	// Nodes are the sleeping Nodes that served it; Wakers the Nodes known
	// to be able to wake them, none connected.
	Nodes, Wakers []string
}

func (e *NoWakerError) Error() string {
	return fmt.Sprintf("node %s is asleep and no connected node can wake it (its wakers: %s)",
		strings.Join(e.Nodes, ", "), strings.Join(e.Wakers, ", "))
}

// Is makes errors.Is(err, ErrCannotWake) hold.
func (e *NoWakerError) Is(target error) bool { return target == ErrCannotWake }

// ErrWakeTimeout is matched by every *TimeoutError.
var ErrWakeTimeout = errors.New("node did not wake in time")

// TimeoutError: the Node was asked to wake but did not register and
// become ready within the wake timeout.
type TimeoutError struct {
	Node, Model string
	// Via is the last waker that sent the packet ("" when none could).
	Via   string
	Sends int
	After time.Duration
}

func (e *TimeoutError) Error() string {
	how := fmt.Sprintf("woken via node %q (%d packets)", e.Via, e.Sends)
	if e.Sends == 0 {
		how = "no waker could send its packet"
	}
	return fmt.Sprintf("node %q, which serves model %q, was asleep and did not wake within %s (%s); it may still be starting: retry",
		e.Node, e.Model, e.After, how)
}

// Is makes errors.Is(err, ErrWakeTimeout) hold.
func (e *TimeoutError) Is(target error) bool { return target == ErrWakeTimeout }

// Source is what the Tracker watches (*fleet.Registry).
type Source interface {
	// Changed is closed at the next change of any Node's state or
	// providers.
	Changed() <-chan struct{}
	// Ready lists the Nodes' ready current generations.
	Ready() []*fleet.Conn
}

// Commander sends a command to a Node (*nodeserver.Server).
type Commander interface {
	Command(ctx context.Context, nodeID string, cmd *wirepb.CommandRequest) (*wirepb.CommandResult, error)
}

// Options configure a Tracker.
type Options struct {
	Source   Source
	Commands Commander
	// Path is the memory's file (data_dir/wake.json); "": kept in memory
	// only.
	Path    string
	Logger  *slog.Logger
	Metrics *Metrics
}

// Offer is one target a provider of a Node offered.
type Offer struct {
	Provider string `json:"provider"`
	Adapter  string `json:"adapter"`
	Target   string `json:"target"`
}

// Target is how one waker wakes one Node.
type Target struct {
	MAC       string `json:"mac"`
	Broadcast string `json:"broadcast"`
}

// node is what the Tracker knows of one Node.
type node struct {
	offers []Offer
	// wakers: the Nodes that list this one, by id.
	wakers map[string]Target
	ready  bool
	wake   *attempt // while waking
	// The last attempt's outcome, for the admin view.
	lastWoke     time.Time
	lastTook     time.Duration
	lastVia      string
	lastTimedOut time.Time
}

// attempt is one wake of one Node, shared by every request that waits
// for it.
type attempt struct {
	node, model string
	started     time.Time
	deadline    time.Time
	nextSend    time.Time
	sends       int
	via         string // the waker of the last packet sent
	failed      map[string]bool
	sending     bool // a command is in flight
	done        chan struct{}
	err         error // set before done is closed
}

// Tracker is the Edge's knowledge of which Nodes sleep and who can wake
// them. It is safe for concurrent use; Run keeps it current.
type Tracker struct {
	src     Source
	cmd     Commander
	path    string
	log     *slog.Logger
	metrics *Metrics

	mu      sync.Mutex
	nodes   map[string]*node
	kick    chan struct{} // a new attempt: Run sends its first packet
	written []byte        // the file as last written
	cmdSeq  uint64
}

// New returns a Tracker that remembers what opts.Path holds. A file that
// cannot be read is logged and set aside: the Tracker starts knowing
// nothing, which only means a sleeping Node is not woken before its
// waker and it have been connected again.
func New(opts Options) *Tracker {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Tracker{src: opts.Source, cmd: opts.Commands, path: opts.Path, log: opts.Logger, metrics: opts.Metrics,
		nodes: map[string]*node{}, kick: make(chan struct{}, 1)}
	if t.path != "" {
		nodes, raw, err := read(t.path)
		if err != nil {
			t.log.Warn("the Edge's memory of sleeping Nodes cannot be read; a Node that sleeps now is not woken until it and its waker have connected again",
				"path", t.path, "err", err)
		}
		t.nodes, t.written = nodes, raw
	}
	return t
}

// Request is one request's need for a sleeping Node.
type Request struct {
	// Model is what the client asked for, for the log.
	Model string
	// Match filters the sleeping Nodes' remembered offers, as the
	// dispatcher's plan filters candidates.
	Match func(sched.Candidate) bool
	// Timeout is the wake timeout (scheduling.wake_timeout); 0: waking is
	// off (ErrNotAsleep).
	Timeout time.Duration
}

// Check says, without waiting or sending anything, what Wake would do
// for r: nil when a sleeping Node served it and can be woken now,
// ErrNotAsleep, or a *NoWakerError.
func (t *Tracker) Check(r Request) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.chooseLocked(r)
	return err
}

// Wake wakes a sleeping Node that served r's model and waits until it is
// ready, r.Timeout passes (a *TimeoutError) or ctx ends. Requests for a
// Node already waking wait on its attempt. It returns ErrNotAsleep when
// no sleeping Node served it, a *NoWakerError when none can be woken.
func (t *Tracker) Wake(ctx context.Context, r Request) error {
	t.mu.Lock()
	id, err := t.chooseLocked(r)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	n := t.nodes[id]
	a := n.wake
	if a == nil {
		now := time.Now()
		a = &attempt{node: id, model: r.Model, started: now, deadline: now.Add(r.Timeout), nextSend: now,
			failed: map[string]bool{}, done: make(chan struct{})}
		n.wake = a
		t.log.Info("waking node", "node", id, "model", r.Model, "timeout", r.Timeout)
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	t.mu.Unlock()
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for node %q to wake: %w", id, ctx.Err())
	}
}

// chooseLocked picks the sleeping Node to wake for r: one already waking,
// else the first (by id) with a connected waker.
func (t *Tracker) chooseLocked(r Request) (string, error) {
	if r.Timeout <= 0 {
		return "", ErrNotAsleep
	}
	var asleep []string
	for _, id := range slices.Sorted(maps.Keys(t.nodes)) {
		n := t.nodes[id]
		if n.ready || len(n.wakers) == 0 || !slices.ContainsFunc(n.offers, func(o Offer) bool { return r.Match(candidate(id, o)) }) {
			continue
		}
		if n.wake != nil {
			return id, nil
		}
		asleep = append(asleep, id)
	}
	if len(asleep) == 0 {
		return "", ErrNotAsleep
	}
	wakers := map[string]bool{}
	for _, id := range asleep {
		for w := range t.nodes[id].wakers {
			if t.connectedLocked(w) {
				return id, nil
			}
			wakers[w] = true
		}
	}
	return "", &NoWakerError{Model: r.Model, Nodes: asleep, Wakers: slices.Sorted(maps.Keys(wakers))}
}

// connectedLocked reports whether Node id is ready, so it can be asked to
// send a packet.
func (t *Tracker) connectedLocked(id string) bool {
	n := t.nodes[id]
	return n != nil && n.ready
}

// candidate is a remembered offer as the scheduler's candidate it was.
func candidate(nodeID string, o Offer) sched.Candidate {
	return sched.Candidate{NodeID: nodeID, Provider: o.Provider, Adapter: o.Adapter, Target: o.Target}
}

// Asleep lists the offers of the Nodes that sleep (or wake) and that
// some Node can wake, as candidates: the models a request may wake.
func (t *Tracker) Asleep() []sched.Candidate {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []sched.Candidate
	for _, id := range slices.Sorted(maps.Keys(t.nodes)) {
		n := t.nodes[id]
		if n.ready || len(n.wakers) == 0 {
			continue
		}
		for _, o := range n.offers {
			out = append(out, candidate(id, o))
		}
	}
	return out
}

// Run keeps the Tracker current with its Source and drives the attempts
// (sending, resending, timing out) until ctx is done; it waits for the
// commands it sent. Attempts still open then end with ctx's error.
func (t *Tracker) Run(ctx context.Context) {
	var sends sync.WaitGroup
	defer sends.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		changed := t.src.Changed()
		t.refresh(t.src.Ready())
		next := t.step(ctx, &sends)
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			t.abandon(ctx.Err())
			return
		case <-changed:
		case <-t.kick:
		case <-timer.C:
		}
	}
}

// refresh records what the ready Nodes offer and whom they can wake, ends
// the attempts of Nodes that are ready now, and writes the memory if it
// changed.
func (t *Tracker) refresh(ready []*fleet.Conn) {
	now := time.Now()
	t.mu.Lock()
	up := map[string]bool{}
	for _, c := range ready {
		id := c.NodeID()
		up[id] = true
		n := t.nodeLocked(id)
		n.ready = true
		if offers := offersOf(c.Providers()); len(offers) > 0 {
			// A Node that reports nothing (its servers starting) keeps
			// what it served last.
			n.offers = offers
		}
		listed := map[string]Target{}
		for _, w := range c.WakeTargets() {
			if len(listed) == MaxTargetsPerWaker {
				break
			}
			if w.GetNodeId() != "" && w.GetNodeId() != id {
				listed[w.GetNodeId()] = Target{MAC: w.GetMac(), Broadcast: w.GetBroadcast()}
			}
		}
		for oid, o := range t.nodes {
			if tg, ok := listed[oid]; ok {
				o.wakers[id] = tg
			} else {
				delete(o.wakers, id)
			}
		}
		for oid, tg := range listed {
			if _, ok := t.nodes[oid]; !ok {
				t.nodeLocked(oid).wakers[id] = tg
			}
		}
		if a := n.wake; a != nil {
			took := now.Sub(a.started)
			n.wake, n.lastWoke, n.lastTook, n.lastVia = nil, now, took, a.via
			close(a.done)
			t.metrics.succeeded(took)
			t.log.Info(fmt.Sprintf("woke node %s for model %s via node %s in %.1fs", id, a.model, a.via, took.Seconds()),
				"node", id, "model", a.model, "via", a.via, "wake_seconds", took.Seconds(), "packets", a.sends)
		}
	}
	for id, n := range t.nodes {
		n.ready = up[id]
	}
	raw := t.fileLocked()
	write := t.path != "" && string(raw) != string(t.written)
	t.mu.Unlock()
	if write {
		if err := writeFile(t.path, raw); err != nil {
			t.log.Warn("the Edge's memory of sleeping Nodes cannot be written; after a restart a sleeping Node is not woken until it and its waker have connected again",
				"path", t.path, "err", err, "fix", "make data_dir writable by the Edge's user")
			return
		}
		t.mu.Lock()
		t.written = raw
		t.mu.Unlock()
	}
}

// nodeLocked returns Node id's entry, made if new.
func (t *Tracker) nodeLocked(id string) *node {
	n := t.nodes[id]
	if n == nil {
		n = &node{wakers: map[string]Target{}}
		t.nodes[id] = n
	}
	return n
}

// offersOf lists every target of ps.
func offersOf(ps []*wirepb.Provider) []Offer {
	var out []Offer
	for _, p := range ps {
		for _, tg := range p.GetTargets() {
			out = append(out, Offer{Provider: p.GetName(), Adapter: p.GetAdapter(), Target: tg.GetName()})
		}
	}
	slices.SortFunc(out, func(a, b Offer) int {
		return strings.Compare(a.Provider+"\x00"+a.Target, b.Provider+"\x00"+b.Target)
	})
	return slices.Compact(out)
}

// step times out the attempts past their deadline and sends the packets
// that are due, each from its own goroutine (counted in sends); it returns
// when it next has something to do.
func (t *Tracker) step(ctx context.Context, sends *sync.WaitGroup) time.Time {
	now := time.Now()
	next := now.Add(time.Hour)
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, n := range t.nodes {
		a := n.wake
		if a == nil {
			continue
		}
		if !now.Before(a.deadline) {
			n.wake, n.lastTimedOut = nil, now
			a.err = &TimeoutError{Node: id, Model: a.model, Via: a.via, Sends: a.sends, After: a.deadline.Sub(a.started)}
			close(a.done)
			t.metrics.timedOut()
			t.log.Warn("node did not wake in time", "node", id, "model", a.model, "via", a.via, "packets", a.sends,
				"timeout", a.deadline.Sub(a.started))
			continue
		}
		if a.deadline.Before(next) {
			next = a.deadline
		}
		if a.sending || a.sends >= MaxSends {
			continue
		}
		if now.Before(a.nextSend) {
			next = minTime(next, a.nextSend)
			continue
		}
		via, tg, ok := t.wakerLocked(n, a)
		if !ok {
			// No connected waker now: try again later (one may connect
			// before the deadline).
			a.nextSend = now.Add(ResendEvery)
			next = minTime(next, a.nextSend)
			continue
		}
		a.sending, a.via = true, via
		t.cmdSeq++
		cmd := &wirepb.CommandRequest{CommandId: fmt.Sprintf("wake-%d", t.cmdSeq), Kind: wirepb.CommandKind_COMMAND_KIND_WAKE, WakeNodeId: id}
		sends.Go(func() { t.send(ctx, a, via, tg, cmd) })
	}
	return next
}

// wakerLocked picks the connected waker of n to send a's next packet:
// the last one used, else the first by id, preferring those whose command
// has not failed in this attempt.
func (t *Tracker) wakerLocked(n *node, a *attempt) (string, Target, bool) {
	ids := slices.Sorted(maps.Keys(n.wakers))
	if i := slices.Index(ids, a.via); i > 0 {
		ids = append([]string{a.via}, slices.Delete(ids, i, i+1)...)
	}
	for _, failedToo := range []bool{false, true} {
		for _, w := range ids {
			if t.connectedLocked(w) && a.failed[w] == failedToo {
				return w, n.wakers[w], true
			}
		}
	}
	return "", Target{}, false
}

// send asks waker via to send a's packet, and records the outcome.
func (t *Tracker) send(ctx context.Context, a *attempt, via string, tg Target, cmd *wirepb.CommandRequest) {
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	res, err := t.cmd.Command(ctx, via, cmd)
	if err == nil && res.GetFailure() != nil {
		err = errors.New(res.GetFailure().GetMessage())
	}
	t.mu.Lock()
	a.sending = false
	a.nextSend = time.Now().Add(ResendEvery)
	if err != nil {
		a.failed[via] = true
	} else {
		a.sends++
	}
	sent := a.sends
	t.mu.Unlock()
	if err != nil {
		t.metrics.sendFailed()
		t.log.Warn("a waker could not send the wake packet", "node", a.node, "via", via, "mac", tg.MAC, "broadcast", tg.Broadcast, "err", err)
	} else {
		t.metrics.sent()
		t.log.Info("wake packet sent", "node", a.node, "via", via, "mac", tg.MAC, "broadcast", tg.Broadcast, "packet", sent)
	}
	select {
	case t.kick <- struct{}{}: // the next step is due at nextSend
	default:
	}
}

// abandon ends every open attempt with err (the Edge stops).
func (t *Tracker) abandon(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range t.nodes {
		if a := n.wake; a != nil {
			n.wake = nil
			a.err = fmt.Errorf("waking node %q: %w", a.node, err)
			close(a.done)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
