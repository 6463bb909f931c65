package inflight

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// clock is a manual clock for the tracker.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 5, 1, 12, 0, 30, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func only(t *testing.T, s Snapshot) View {
	t.Helper()
	if len(s.Live) != 1 {
		t.Fatalf("live = %+v, want one entry", s.Live)
	}
	return s.Live[0]
}

func TestWorkGoesQueuedPrefillStreamingThenLeavesWithItsReasonCounted(t *testing.T) {
	c := newClock()
	tr := New(Options{Now: c.now})
	e := tr.Start(Work{Kind: Run, ID: "run-1", API: "openai_chat", Model: "llama3.2", Principal: "alice"})

	v := only(t, tr.Snapshot())
	if v.Phase != Queued || v.Node != "" || v.DispatchedAt != nil || v.TTFTMillis != nil || v.Attempts != 0 {
		t.Errorf("just started: %+v, want queued, not dispatched", v)
	}
	if v.ID != "run-1" || v.Kind != Run || v.API != "openai_chat" || v.Model != "llama3.2" || v.Principal != "alice" {
		t.Errorf("identity of the work: %+v", v)
	}

	c.advance(200 * time.Millisecond)
	e.Dispatched("n1", "ollama", "llama3.2:latest")
	c.advance(3 * time.Second)
	v = only(t, tr.Snapshot())
	if v.Phase != Prefill || v.Node != "n1" || v.Provider != "ollama" || v.Target != "llama3.2:latest" || v.Attempts != 1 {
		t.Errorf("dispatched: %+v, want prefill on n1", v)
	}
	if v.TTFTMillis != nil || v.AgeMillis != 3200 {
		t.Errorf("prefill: ttft %v age %v, want no ttft and 3200 ms", v.TTFTMillis, v.AgeMillis)
	}

	e.First()
	for range 10 {
		e.Add(1)
	}
	e.Usage(12, 0)
	c.advance(2 * time.Second)
	v = only(t, tr.Snapshot())
	if v.Phase != Streaming || v.TTFTMillis == nil || *v.TTFTMillis != 3200 || v.Tokens != 10 {
		t.Errorf("streaming: %+v, want streaming, ttft 3200 ms, 10 tokens", v)
	}
	if v.TokensPerSecond != 4.5 || v.PromptTokens != 12 || v.CompletionTokens != 0 {
		t.Errorf("rate %v prompt %d completion %d, want 4.5/s (9 tokens after the first, in 2 s), 12, 0", v.TokensPerSecond, v.PromptTokens, v.CompletionTokens)
	}

	e.Usage(0, 10)
	e.End(Completed)
	s := tr.Snapshot()
	if len(s.Live) != 0 {
		t.Errorf("ended work still live: %+v", s.Live)
	}
	if len(s.Recent) != 1 || s.Recent[0].Reason != Completed || s.Recent[0].EndedAt == nil || s.Recent[0].CompletionTokens != 10 || s.Recent[0].AgeMillis != 5200 {
		t.Errorf("recent = %+v, want run-1 completed after 5200 ms with 10 completion tokens", s.Recent)
	}
	if s.Terminals.Totals[Completed] != 1 || len(s.Terminals.Totals) != 1 {
		t.Errorf("totals = %v, want one completed", s.Terminals.Totals)
	}
	last := s.Terminals.Minutes[len(s.Terminals.Minutes)-1]
	if last.Counts[Completed] != 1 || !last.Start.Equal(c.now().Truncate(time.Minute)) {
		t.Errorf("current minute = %+v, want one completed in the minute of %v", last, c.now())
	}
}

func TestAFailoverQueuesAgainAndCountsTheAttempt(t *testing.T) {
	tr := New(Options{})
	e := tr.Start(Work{Kind: Tunnel, ID: "tun-1", Model: "m"})
	e.Dispatched("n1", "p", "m")
	e.Queued()
	if v := only(t, tr.Snapshot()); v.Phase != Queued || v.Node != "n1" {
		t.Errorf("after the first candidate failed: %+v, want queued (last dispatched to n1)", v)
	}
	e.Dispatched("n2", "p", "m")
	if v := only(t, tr.Snapshot()); v.Phase != Prefill || v.Node != "n2" || v.Attempts != 2 {
		t.Errorf("on the second candidate: %+v, want prefill on n2, attempt 2", v)
	}
}

func TestOnlyTheFirstEndAndTheFirstOutputCount(t *testing.T) {
	c := newClock()
	tr := New(Options{Now: c.now})
	e := tr.Start(Work{Kind: Run, ID: "r"})
	c.advance(time.Second)
	e.First()
	c.advance(time.Second)
	e.First()
	if v := only(t, tr.Snapshot()); *v.TTFTMillis != 1000 {
		t.Errorf("ttft %v, want the first output's 1000 ms", *v.TTFTMillis)
	}
	e.End("response_stalled")
	e.End(Completed)
	s := tr.Snapshot()
	if len(s.Recent) != 1 || s.Recent[0].Reason != "response_stalled" || s.Terminals.Totals[Completed] != 0 || s.Terminals.Totals["response_stalled"] != 1 {
		t.Errorf("after two ends: recent %+v totals %v, want the first reason only", s.Recent, s.Terminals.Totals)
	}
}

func TestTerminalsLeaveTheWindowMinuteByMinute(t *testing.T) {
	c := newClock()
	tr := New(Options{Now: c.now, Window: 3})
	end := func(reason string) { tr.Start(Work{Kind: Run, ID: reason}).End(reason) }
	end(Completed)
	c.advance(time.Minute)
	end("cancelled")
	end("cancelled")
	s := tr.Snapshot()
	if len(s.Terminals.Minutes) != 3 || s.Terminals.WindowMinutes != 3 {
		t.Fatalf("minutes = %+v, want the window's 3", s.Terminals.Minutes)
	}
	if s.Terminals.Totals[Completed] != 1 || s.Terminals.Totals["cancelled"] != 2 {
		t.Errorf("totals = %v, want 1 completed and 2 cancelled", s.Terminals.Totals)
	}
	if m := s.Terminals.Minutes; m[1].Counts[Completed] != 1 || m[2].Counts["cancelled"] != 2 || len(m[0].Counts) != 0 {
		t.Errorf("per minute = %+v", m)
	}
	// Three minutes on, the bucket of the first minute is reused: its
	// counts are gone, not added to.
	c.advance(2 * time.Minute)
	end("deadline_exceeded")
	s = tr.Snapshot()
	if s.Terminals.Totals[Completed] != 0 || s.Terminals.Totals["cancelled"] != 2 || s.Terminals.Totals["deadline_exceeded"] != 1 {
		t.Errorf("totals three minutes on = %v, want 2 cancelled and 1 deadline_exceeded", s.Terminals.Totals)
	}
	c.advance(10 * time.Minute)
	if s = tr.Snapshot(); len(s.Terminals.Totals) != 0 {
		t.Errorf("totals after the window passed = %v, want none", s.Terminals.Totals)
	}
}

func TestRecentKeepsTheNewestEndedEntriesOnly(t *testing.T) {
	tr := New(Options{Recent: 3})
	for i := range 7 {
		tr.Start(Work{Kind: Run, ID: fmt.Sprint(i)}).End(Completed)
	}
	s := tr.Snapshot()
	var ids []string
	for _, v := range s.Recent {
		ids = append(ids, v.ID)
	}
	if fmt.Sprint(ids) != "[6 5 4]" {
		t.Errorf("recent = %v, want [6 5 4]", ids)
	}
	if s.Terminals.Totals[Completed] != 7 {
		t.Errorf("totals = %v, want 7 completed", s.Terminals.Totals)
	}
}

func TestReasonsBeyondTheBoundCountAsOther(t *testing.T) {
	tr := New(Options{})
	for i := range MaxReasons + 5 {
		tr.Start(Work{Kind: Run}).End(fmt.Sprintf("reason_%d", i))
	}
	s := tr.Snapshot()
	if len(s.Terminals.Totals) != MaxReasons+1 || s.Terminals.Totals[Other] != 5 {
		t.Errorf("%d reasons, other %d; want %d and 5", len(s.Terminals.Totals), s.Terminals.Totals[Other], MaxReasons+1)
	}
}

func TestLiveWorkIsListedOldestFirst(t *testing.T) {
	c := newClock()
	tr := New(Options{Now: c.now})
	for _, id := range []string{"a", "b", "c"} {
		tr.Start(Work{Kind: Run, ID: id})
		c.advance(time.Millisecond)
	}
	s := tr.Snapshot()
	if len(s.Live) != 3 || s.Live[0].ID != "a" || s.Live[2].ID != "c" {
		t.Errorf("live = %+v, want a, b, c", s.Live)
	}
}

func TestANilTrackerTracksNothing(t *testing.T) {
	var tr *Tracker
	e := tr.Start(Work{Kind: Run, ID: "x"})
	if e != nil {
		t.Fatalf("nil tracker started %+v", e)
	}
	e.Queued()
	e.Dispatched("n", "p", "t")
	e.First()
	e.Add(1)
	e.Usage(1, 1)
	e.End(Completed)
}

// The hot path: counting a token allocates nothing, and counts race-free
// with snapshots (run with -race).
func TestCountingATokenAllocatesNothingAndRacesNothing(t *testing.T) {
	tr := New(Options{})
	e := tr.Start(Work{Kind: Run, ID: "r"})
	e.First()
	if a := testing.AllocsPerRun(1000, func() { e.Add(1) }); a != 0 {
		t.Errorf("Add allocates %v times per call", a)
	}
	before := only(t, tr.Snapshot()).Tokens
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 10000 {
			e.Add(1)
		}
	})
	wg.Go(func() {
		for range 100 {
			tr.Snapshot()
		}
	})
	wg.Wait()
	if v := only(t, tr.Snapshot()); v.Tokens != before+10000 {
		t.Errorf("tokens = %d, want %d", v.Tokens, before+10000)
	}
}

func BenchmarkAdd(b *testing.B) {
	e := New(Options{}).Start(Work{Kind: Run, ID: "r"})
	b.ReportAllocs()
	for b.Loop() {
		e.Add(1)
	}
}

// usageLog is a UsageRecorder that keeps every call.
type usageLog struct {
	mu    sync.Mutex
	calls []string
}

func (u *usageLog) Record(principal, model, node string, prompt, completion int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls = append(u.calls, fmt.Sprintf("%s %s %s %d %d", principal, model, node, prompt, completion))
}

// Issue 22: the usage ledger hears of every piece of work that ran on a
// Node, once, as it ends, with the provider's last counts; work that never
// reached a Node is not a Node's usage.
func TestEndTellsTheUsageLedgerOnce(t *testing.T) {
	u := &usageLog{}
	tr := New(Options{Usage: u})
	done := tr.Start(Work{Kind: Run, Model: "llama3.2", Principal: "alice"})
	done.Dispatched("n1", "ollama", "llama3.2:latest")
	done.Usage(12, 3)
	done.Usage(12, 7)
	done.End(Completed)
	done.End("cancelled")

	failed := tr.Start(Work{Kind: Tunnel, Model: "qwen", Principal: "bob"})
	failed.Dispatched("n1", "ollama", "qwen")
	failed.Dispatched("n2", "ollama", "qwen") // a failover: the Node it last ran on
	failed.End("response_stalled")

	tr.Start(Work{Kind: Run, Model: "m", Principal: "carol"}).End("queue_timeout")

	want := []string{"alice llama3.2 n1 12 7", "bob qwen n2 0 0"}
	if fmt.Sprint(u.calls) != fmt.Sprint(want) {
		t.Errorf("recorded %q, want %q", u.calls, want)
	}
}
