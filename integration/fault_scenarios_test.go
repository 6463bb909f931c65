package integration

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// TestFault runs every scenario of the fault suite, all at once: each
// mostly waits (for suspicion, a fence, a reconnect), so together they take
// about as long as the longest. They are subtests started from goroutines
// rather than parallel tests, because -parallel defaults to GOMAXPROCS
// (two on CI) and would run them two by two. Run one with
// -run 'TestFault/NodeKilled'.
func TestFault(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: skipped in -short mode (it runs real daemons for minutes)")
	}
	t.Parallel()
	if _, err := fakeBin(); err != nil {
		t.Fatal(err)
	}
	scenarios := []struct {
		name string
		run  func(*testing.T)
	}{
		{"NodeKilled", faultNodeKilled},
		{"NodeFrozen", faultNodeFrozen},
		{"LinkCutAndHealed", faultLinkCutAndHealed},
		{"EdgeRouteFlap", faultEdgeRouteFlap},
		{"EdgeKilledAndRestarted", faultEdgeKilledAndRestarted},
		{"PluginKilled", faultPluginKilled},
		{"SlowLossyLinkIsNotSuspect", faultSlowLossyLinkIsNotSuspect},
	}
	var wg sync.WaitGroup
	for _, s := range scenarios {
		wg.Go(func() { t.Run(s.name, s.run) })
	}
	wg.Wait()
}

// twoNodes is the fleet most scenarios use: n1 and n2 serve the fast
// model with the same capacity (so without a fault they share the work),
// and only n1 serves the slow model, so a stream in flight is on n1.
func twoNodes(t *testing.T) *faultFleet {
	t.Helper()
	f := newFaultFleet(t)
	f.addNode(nodeSpec{
		id:     "n1",
		models: []fakeollama.Model{fastAnswer("n1"), slowAnswer()},
		providers: []providerSpec{
			{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}},
			{name: "slow", capacity: 2, targets: []string{slowStream + ":latest"}},
		},
	})
	f.addNode(nodeSpec{
		id:        "n2",
		models:    []fakeollama.Model{fastAnswer("n2")},
		providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}}},
	})
	return f
}

// P4, R9: noded killed (kill -9) mid-answer, with another Node serving the
// same model. The dead Node is suspect within seconds and new work goes to
// the other one, through both APIs; the heartbeat fences it with
// heartbeat_timeout; the streams it was producing end with an error in
// their API's form; restarted, it comes back with a higher generation.
func faultNodeKilled(t *testing.T) {
	requireNetns(t)
	f := twoNodes(t)
	n1, _ := f.view("n1")

	inOpenAI := f.startStream(openAI, slowStream, 2*time.Minute)
	inOllama := f.startStream(ollama, slowStream, 2*time.Minute)
	plugins := children(f.nodes["n1"].proc.cmd.Process.Pid)
	killed := time.Now()
	signalProc(t, f.nodes["n1"].proc, syscall.SIGKILL)
	// Requests sent before anyone knows: those dispatched to n1 wait for a
	// first byte that never comes, and move to n2 once n1 is suspect.
	early := make(chan streamResult, 4)
	for i := range cap(early) {
		go func() { early <- f.stream([]clientAPI{openAI, ollama}[i%2], fastModel, requestWithin, nil) }()
	}
	// Its adapter plugins do not outlive it.
	waitGone(t, "the adapter plugins of a killed noded", plugins)

	if _, ok := f.waitSuspect("n1", killed, "kill -9 noded"); ok {
		f.assertServedBy("n2", 3, "n1 suspect after kill -9")
		if v, _ := f.view("n1"); v.State != "ready" || !v.Suspect {
			t.Logf("n1 left the suspect window during the requests (%v): they were not all sent while it was suspect", v)
		}
	}
	for range cap(early) {
		r := <-early // each is bounded by requestWithin
		if !r.done || r.servedBy() != "n2" {
			t.Errorf("P4: a request sent just after n1 was killed: want a complete answer from n2, got %v", r)
		} else {
			f.timing("kill -9 noded: a %s request sent at the kill was answered by n2 after %.1fs", r.api, r.took.Seconds())
		}
	}
	f.waitFence("n1", n1.Generation, killed, "kill -9 noded")

	for _, s := range []*inFlight{inOpenAI, inOllama} {
		r := s.wait(t, fenceWaitMax+10*time.Second-time.Since(killed), "the stream n1 served when it was killed")
		assertStreamError(t, "stream on n1 at kill -9", r, "")
		f.timing("kill -9 noded: the %s stream in flight ended with its error %.1fs after the kill", r.api, r.ended.Sub(killed).Seconds())
	}

	restarted := time.Now()
	f.startNode("n1", "noded n1 (restarted)")
	f.waitBack("n1", n1.Generation, restarted, "noded restart", 30*time.Second)
	f.assertBothServe("after n1's restart")
}

// P4, R8, R9: noded frozen (SIGSTOP). Suspect within seconds; resumed
// before the fence it is dispatchable again at once on the same
// generation; frozen past the fence it is fenced heartbeat_timeout and,
// resumed, reconnects with a higher generation.
func faultNodeFrozen(t *testing.T) {
	requireNetns(t)
	f := newFaultFleet(t)
	f.addNode(nodeSpec{
		id:        "n1",
		models:    []fakeollama.Model{fastAnswer("n1")},
		providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}}},
	})
	node := f.nodes["n1"].proc
	v1, _ := f.view("n1")

	// A short freeze: resumed 10 s after it is suspect, well before the fence.
	stopped := time.Now()
	signalProc(t, node, syscall.SIGSTOP)
	_, suspect := f.waitSuspect("n1", stopped, "SIGSTOP")
	if suspect {
		time.Sleep(10 * time.Second) // the freeze goes on; the fence is ~45 s away
	}
	resumed := time.Now()
	signalProc(t, node, syscall.SIGCONT)
	if suspect {
		v, at, ok := f.waitView("n1", 5*time.Second, func(v faultView) bool { return !v.Suspect })
		if !ok {
			t.Errorf("P4: n1 still suspect 5s after SIGCONT: %v", v)
		} else {
			f.timing("SIGCONT: n1 dispatchable again after %.1fs", at.Sub(resumed).Seconds())
			if !f.edgeLoggedSoon("node heard from again", "n1") {
				t.Errorf(`the Edge did not log "node heard from again" for n1`)
			}
		}
	}
	if v, _ := f.view("n1"); v.Generation != v1.Generation || v.State != "ready" {
		t.Fatalf("after a freeze shorter than the fence, n1 is %v, want generation %d ready", v, v1.Generation)
	}
	f.assertServedBy("n1", 2, "n1 resumed before the fence")

	// A long freeze: held until the Edge fences the generation.
	stopped = time.Now()
	signalProc(t, node, syscall.SIGSTOP)
	f.waitSuspect("n1", stopped, "second SIGSTOP")
	f.waitFence("n1", v1.Generation, stopped, "second SIGSTOP")
	resumed = time.Now()
	signalProc(t, node, syscall.SIGCONT)
	f.waitBack("n1", v1.Generation, resumed, "SIGCONT after the fence", 30*time.Second)
	f.assertServedBy("n1", 1, "n1 back after the fence")
}

// P4, R9: n1's link cut (the host end of its veth down) with n2 serving
// the same model. Suspect within seconds and the work moves to n2; healed
// before the fence, n1 is the same generation and no longer suspect; cut
// past the fence, it is fenced heartbeat_timeout and, healed, back ready
// with a higher generation within seconds.
func faultLinkCutAndHealed(t *testing.T) {
	requireNetns(t)
	f := twoNodes(t)
	ns := f.nodes["n1"].ns
	v1, _ := f.view("n1")

	cut := time.Now()
	ns.cut()
	_, suspect := f.waitSuspect("n1", cut, "link cut")
	if suspect {
		f.assertServedBy("n2", 3, "n1's link cut")
		time.Sleep(time.Until(cut.Add(20 * time.Second))) // the cut goes on; the fence is far
	}
	healed := time.Now()
	ns.heal()
	if suspect {
		// Heard from again when the next packet crosses: after a cut that
		// is QUIC's next probe, whose interval has backed off during the
		// cut (1 s to 17 s measured for cuts of 12 s to 44 s). It must come
		// before the fence is due.
		v, at, ok := f.waitView("n1", 25*time.Second, func(v faultView) bool { return !v.Suspect })
		if !ok {
			t.Errorf("P4: n1 still suspect 25s after its link healed: %v", v)
		} else {
			f.timing("link healed: n1 dispatchable again after %.1fs", at.Sub(healed).Seconds())
		}
	}
	// Ready again: on the same generation when the old connection proved
	// itself first (a heartbeat answered), or on a newer one when the
	// Node's fresh connection did (issue 26: the old one's sender may still
	// be backing off its retransmissions). n1 ran nothing, so either loses
	// nothing.
	v2, _ := f.view("n1")
	if v2.Generation < v1.Generation || v2.State != "ready" {
		t.Fatalf("after a cut shorter than the fence, n1 is %v, want ready at generation %d or newer", v2, v1.Generation)
	}
	if v2.Generation != v1.Generation {
		f.timing("link healed: n1's fresh connection replaced the silent one (generation %d -> %d)", v1.Generation, v2.Generation)
	}

	cut = time.Now()
	ns.cut()
	f.waitSuspect("n1", cut, "second link cut")
	f.waitFence("n1", v2.Generation, cut, "second link cut")
	healed = time.Now()
	ns.heal()
	f.waitBack("n1", v2.Generation, healed, "link healed after the fence", 90*time.Second)
	f.assertBothServe("after the heal")
}

// P4, R9: the Edge's own route to a Node goes away for a while (its
// interface flaps): the Edge's sends fail with ENETUNREACH instead of
// vanishing. That is a lost packet, not the end of the connection: the Node
// turns suspect, and when the route is back it is dispatchable again on the
// same generation. (quic-go closes a connection at its first send error;
// before transport.UnreachableIsLoss this fenced the Node at once, reason
// internal.)
func faultEdgeRouteFlap(t *testing.T) {
	requireNetns(t)
	f := newFaultFleet(t)
	f.addNode(nodeSpec{
		id:        "n1",
		models:    []fakeollama.Model{fastAnswer("n1")},
		providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}}},
	})
	ns := f.nodes["n1"].ns
	v1, _ := f.view("n1")

	down := time.Now()
	ns.downHost()
	_, suspect := f.waitSuspect("n1", down, "the Edge's route down")
	if v, _ := f.view("n1"); v.State != "ready" || v.Generation != v1.Generation {
		t.Fatalf("the Edge's route down: n1 is %v, want generation %d still ready (suspect, not fenced)", v, v1.Generation)
	}
	if suspect {
		time.Sleep(time.Until(down.Add(12 * time.Second)))
	}
	up := time.Now()
	ns.upHost()
	v, at, ok := f.waitView("n1", 25*time.Second, func(v faultView) bool { return !v.Suspect })
	if !ok {
		t.Fatalf("P4: n1 still suspect 25s after the Edge's route came back: %v", v)
	}
	f.timing("route back: n1 dispatchable again after %.1fs", at.Sub(up).Seconds())
	// On its generation, or on the fresh connection that replaced it when
	// that proved itself first (issue 26; n1 ran nothing, so neither loses
	// anything).
	if v.Generation < v1.Generation || v.State != "ready" {
		t.Fatalf("after a route flap shorter than the fence, n1 is %v, want ready at generation %d or newer", v, v1.Generation)
	}
	f.assertServedBy("n1", 2, "after the Edge's route came back")
}

// P4, R9: the Edge killed (kill -9) and restarted with the same
// configuration. A client streaming at the kill loses its connection (the
// Edge process died): an error, not a hang. Every Node is back ready with
// a higher generation within seconds: the restarted Edge resets the old
// connections (a stateless reset key that survives restarts). The Nodes
// run the daemon's own reconnect backoff here.
func faultEdgeKilledAndRestarted(t *testing.T) {
	requireNetns(t)
	f := newFaultFleet(t)
	for _, id := range []string{"n1", "n2"} {
		f.addNode(nodeSpec{
			id:               id,
			models:           []fakeollama.Model{fastAnswer(id), slowAnswer()},
			providers:        []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest", slowStream + ":latest"}}},
			defaultReconnect: true,
		})
	}
	gens := map[string]uint64{}
	for _, id := range []string{"n1", "n2"} {
		v, _ := f.view(id)
		gens[id] = v.Generation
	}

	s := f.startStream(openAI, slowStream, 2*time.Minute)
	killed := time.Now()
	signalProc(t, f.edge, syscall.SIGKILL)
	r := s.wait(t, 10*time.Second, "a stream through the killed Edge")
	if r.done || r.terminated {
		t.Errorf("a stream through a killed Edge ended as if complete: %v", r)
	} else {
		f.timing("kill -9 edged: the client's stream broke after %.1fs (%v)", r.ended.Sub(killed).Seconds(), r.err)
	}

	restarted := time.Now()
	f.startEdge("edged (restarted)")
	for _, id := range []string{"n1", "n2"} {
		f.waitBack(id, gens[id], restarted, "edged restart", 90*time.Second)
	}
	f.assertBothServe("after the Edge restart")
}

// R9, S2: the adapter plugin process killed (kill -9) mid-answer, through
// each API in turn. A normalized run (OpenAI) goes through the plugin: its
// client gets an in-stream provider_unavailable error. A raw tunnel (the
// Ollama API) to an adapter that gives a route is relayed by the Node
// itself: the plugin's death does not touch it, and it completes. Either
// way the provider goes offline and comes back online, and the next
// request succeeds. The Node stays connected on the same generation. It
// runs on the host's loopback (no namespace).
func faultPluginKilled(t *testing.T) {
	f := newFaultFleet(t)
	shortSlow := fakeollama.Model{Name: "slowshort:latest", TokenCount: 30, TokenDelay: 100 * time.Millisecond}
	n := f.addNode(nodeSpec{
		id:        "n1",
		models:    []fakeollama.Model{fastAnswer("n1"), slowAnswer(), shortSlow},
		providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest", slowStream + ":latest", shortSlow.Name}}},
		hostOnly:  true,
	})
	v1, _ := f.view("n1")
	for i, a := range []clientAPI{openAI, ollama} {
		plugins := children(n.proc.cmd.Process.Pid)
		if len(plugins) != 1 {
			t.Fatalf("noded has %d children %v, want its one adapter plugin", len(plugins), plugins)
		}
		model := slowStream
		if a == ollama {
			model = "slowshort"
		}
		s := f.startStream(a, model, time.Minute)

		// Poll the provider's state from now on, fast: it is offline only
		// for as long as the plugin takes to restart.
		offline := make(chan bool, 1)
		stop := make(chan struct{})
		go func() {
			saw := false
			defer func() { offline <- saw }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if v, ok := f.view("n1"); ok && len(v.Providers) == 1 && v.Providers[0].State != "online" {
					saw = true
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		killed := time.Now()
		if err := syscall.Kill(plugins[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r := s.wait(t, requestWithin, "a stream whose plugin was killed")
		if a == openAI {
			assertStreamError(t, fmt.Sprintf("%s stream at plugin kill", a), r, "provider_unavailable")
			f.timing("plugin kill -9: the %s stream ended with its error after %.1fs", a, r.ended.Sub(killed).Seconds())
		} else {
			if !r.done || r.errMsg != "" || r.err != nil {
				t.Errorf("the Ollama tunnel stream, relayed by the Node, was touched by the plugin kill: %v", r)
			}
			f.timing("plugin kill -9: the %s tunnel stream completed %.1fs later, untouched", a, r.ended.Sub(killed).Seconds())
		}

		_, at, ok := f.waitView("n1", requestWithin, func(v faultView) bool {
			return v.allOnline(1) && strings.Count(n.proc.out.String(), "adapter plugin online") >= i+2
		})
		close(stop)
		sawOffline := <-offline
		if !ok {
			t.Fatalf("the provider did not come back online within %v of the plugin kill:\n%s", requestWithin, n.proc.out)
		}
		f.timing("plugin kill -9: provider back online after %.1fs (the Edge's view showed it offline: %v)", at.Sub(killed).Seconds(), sawOffline)
		if !strings.Contains(n.proc.out.String(), "adapter plugin exited; restarting") {
			t.Errorf("noded did not report the plugin's exit")
		}
		for _, b := range []clientAPI{openAI, ollama} {
			if r := f.stream(b, fastModel, requestWithin, nil); !r.done || r.servedBy() != "n1" {
				t.Errorf("the request after the plugin came back: %v", r)
			}
		}
	}
	if v, _ := f.view("n1"); v.Generation != v1.Generation || v.State != "ready" {
		t.Errorf("a plugin kill moved the Node: %v, want generation %d ready", v, v1.Generation)
	}
}

// P4, R8: the control experiment. A slow, lossy link (a userspace relay
// adding 200 ms each way and dropping 5% of datagrams each way) between a
// Node and the Edge: over 30 s of streaming through both APIs the Node is
// never suspect and never leaves its generation, and every stream
// completes with its whole answer. Suspicion is about silence, not about
// a bad link.
func faultSlowLossyLinkIsNotSuspect(t *testing.T) {
	f := newFaultFleet(t)
	relay := newUDPRelay(t, fmt.Sprintf("127.0.0.1:%d", f.quicPort), 200*time.Millisecond, 0.05)
	steady := fakeollama.Model{Name: "steady:latest", TokenCount: 40, TokenDelay: 100 * time.Millisecond}
	f.addNode(nodeSpec{
		id:        "n1",
		models:    []fakeollama.Model{steady},
		providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{steady.Name}}},
		hostOnly:  true,
		edgeAddr:  relay.addr(),
	})
	v1, _ := f.view("n1")

	// Watch the Node for the whole experiment.
	var mu sync.Mutex
	var bad []faultView
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if v, ok := f.view("n1"); ok && (v.Suspect || v.State != "ready" || v.Generation != v1.Generation) {
				mu.Lock()
				bad = append(bad, v)
				mu.Unlock()
			}
		}
	}()

	until := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	var streams atomic.Int64
	for _, a := range []clientAPI{openAI, ollama} {
		wg.Go(func() {
			for time.Now().Before(until) {
				r := f.stream(a, "steady", requestWithin, nil)
				if !r.done || r.content != steady.AnswerText() {
					t.Errorf("a stream over the slow lossy link: %v", r)
					return
				}
				streams.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-watched
	f.timing("slow lossy link: %d streams completed in 30s; relay forwarded %d datagrams, dropped %d",
		streams.Load(), relay.forwarded.Load(), relay.dropped.Load())
	if len(bad) > 0 {
		t.Errorf("P4: over a slow lossy link the Node was seen %d times suspect or not ready on its generation, first %v", len(bad), bad[0])
	}
	if f.edgeLogged("node suspect", "n1") {
		t.Errorf("the Edge logged n1 suspect over a slow lossy link")
	}
	if relay.dropped.Load() == 0 {
		t.Errorf("the relay dropped nothing: the experiment did not run on a lossy link")
	}
}
