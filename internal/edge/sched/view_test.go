package sched_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/iop-dev/iop/internal/edge/sched"
)

// The status page's models: which Nodes serve each now, the free share of
// their providers' capacity (shared by all of a provider's targets), and
// each model's queue under the target it names.
func TestModelsShowWhereEachIsServedItsFreeCapacityAndItsQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n1", provider("ollama", "ollama", 2, "llama3.2:latest", "qwen3:8b"))
		f.join("n2", provider("vllm", "openai", 3, "llama3.2:latest"))

		held := []*sched.Slot{f.acquire(req("a", "llama3.2")), f.acquire(req("b", "llama3.2")), f.acquire(req("c", "llama3.2"))}
		held = append(held, f.acquire(sched.Request{ID: "d", Model: "qwen3:8b", QueueTimeout: time.Minute, MaxQueueDepth: 10}))
		// n2 has 3, n1 had 2 less the qwen3 slot: the next two llama3.2 fill them.
		held = append(held, f.acquire(req("e", "llama3.2")))
		w1 := f.enqueue(req("w1", "llama3.2"))
		time.Sleep(3 * time.Second)
		w2 := f.enqueue(req("w2", "llama3.2"))
		// A route's name: its requests wait for targets of another name.
		alias := req("w3", "route-alias")
		alias.Match = func(c sched.Candidate) bool { return c.Target == "llama3.2:latest" }
		w3 := f.enqueue(alias)
		queued(t, w1, w2, w3)

		ms := f.s.Models()
		if len(ms) != 3 {
			t.Fatalf("models = %+v, want llama3.2:latest, qwen3:8b and route-alias", ms)
		}
		llama, qwen, route := ms[0], ms[1], ms[2]
		if llama.Model != "llama3.2:latest" || len(llama.Serving) != 2 || llama.Serving[0].NodeID != "n1" || llama.Serving[1].NodeID != "n2" {
			t.Errorf("llama3.2:latest served by %+v, want n1 and n2", llama.Serving)
		}
		if llama.Capacity != 5 || llama.InFlight != 5 || llama.Free != 0 {
			t.Errorf("llama3.2:latest capacity %d in flight %d free %d, want 5, 5, 0", llama.Capacity, llama.InFlight, llama.Free)
		}
		if llama.QueueDepth != 2 || llama.OldestWaitMillis != 3000 {
			t.Errorf("llama3.2:latest queue %d oldest %v ms, want 2 and 3000 ms (the bare name's queue)", llama.QueueDepth, llama.OldestWaitMillis)
		}
		if qwen.Model != "qwen3:8b" || len(qwen.Serving) != 1 || qwen.Capacity != 2 || qwen.InFlight != 2 || qwen.Free != 0 || qwen.QueueDepth != 0 {
			t.Errorf("qwen3:8b = %+v, want n1's provider, 2 of 2 in flight (shared with llama3.2), no queue", qwen)
		}
		if route.Model != "route-alias" || len(route.Serving) != 0 || route.QueueDepth != 1 || route.Capacity != 0 {
			t.Errorf("route-alias = %+v, want a queue of 1 that names no target", route)
		}

		for _, s := range held {
			s.Release()
		}
		synctest.Wait()
		w1.granted(t).Release()
		w2.granted(t).Release()
		synctest.Wait()
		w3.granted(t).Release()
		synctest.Wait()
		for _, m := range f.s.Models() {
			if m.QueueDepth != 0 || m.InFlight != 0 || m.Free != m.Capacity {
				t.Errorf("after everything ended: %+v, want no queue and all capacity free", m)
			}
		}
	})
}

// Issue 25: a request asking what serves its model is answered from the
// candidates where they are: Matching copies only what it admits, in
// Candidates' order, and Any copies nothing, so that the question costs
// what serves the model, not a copy of the whole fleet's list.
func TestMatchingAndAnyLookAtTheCandidatesWithoutCopyingThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t)
		f.join("n1", provider("ollama", "ollama", 2, "llama3.2:latest", "qwen3:8b"))
		f.join("n2", provider("vllm", "openai", 3, "llama3.2:latest"))
		f.join("n3", provider("ollama", "ollama", 1, "llama3.2:latest"))
		synctest.Wait()

		llamaOnOllama := func(c sched.Candidate) bool { return c.Adapter == "ollama" && c.Target == "llama3.2:latest" }
		got := f.s.Matching(llamaOnOllama)
		if len(got) != 2 || got[0].NodeID != "n1" || got[1].NodeID != "n3" || got[0].Target != "llama3.2:latest" || got[0].Capacity != 2 {
			t.Errorf("Matching = %+v, want n1's and n3's llama3.2:latest on ollama, in order", got)
		}
		var want []sched.Candidate
		for _, c := range f.s.Candidates() {
			if llamaOnOllama(c) {
				want = append(want, c)
			}
		}
		if len(want) != len(got) || want[0].NodeID != got[0].NodeID || want[1].NodeID != got[1].NodeID {
			t.Errorf("Matching = %+v, Candidates filtered = %+v", got, want)
		}
		if f.s.Matching(func(c sched.Candidate) bool { return c.Target == "mistral" }) != nil {
			t.Error("Matching of nothing is not nil")
		}
		if !f.s.Any(llamaOnOllama) || f.s.Any(func(c sched.Candidate) bool { return c.Adapter == "vllm" }) {
			t.Error("Any: want llama3.2 on ollama, and no vllm adapter")
		}
		if n := testing.AllocsPerRun(20, func() { f.s.Any(llamaOnOllama) }); n != 0 {
			t.Errorf("Any allocates %.0f times, want none", n)
		}
		if n := testing.AllocsPerRun(20, func() { f.s.Matching(llamaOnOllama) }); n > 2 {
			t.Errorf("Matching allocates %.0f times for two candidates, want its result's only", n)
		}
	})
}
