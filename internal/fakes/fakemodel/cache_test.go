package fakemodel

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func words(n int, prefix string) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(prefix)
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteByte(' ')
	}
	return b.String()
}

// P9: a session's turns share a growing prefix: each turn finds the one before
// it in the cache, and only what it adds is unseen.
func TestPromptCacheFindsTheSessionsPrefix(t *testing.T) {
	c := NewPromptCache(0, 0)
	system := Tokens(nil).AppendSpecial("system").AppendText(words(100, "s"))
	turn1 := append(system[:len(system):len(system)], Tokens(nil).AppendText(words(10, "a"))...)
	turn2 := append(turn1[:len(turn1):len(turn1)], Tokens(nil).AppendText(words(10, "b"))...)
	if got := c.Serve("m", turn1); got != 0 {
		t.Fatalf("cold cache gave %d", got)
	}
	if got := c.Serve("m", turn2); got != len(turn1) {
		t.Fatalf("turn 2 cached %d, want %d", got, len(turn1))
	}
	if got := c.Serve("m", turn2); got != len(turn2) {
		t.Fatalf("the same prompt again cached %d, want all %d", got, len(turn2))
	}
	// Another session with the same system prompt shares only that.
	other := append(system[:len(system):len(system)], Tokens(nil).AppendText(words(10, "z"))...)
	if got := c.Serve("m", other); got != len(system) {
		t.Fatalf("another session cached %d, want the system prompt's %d", got, len(system))
	}
	if got := c.Serve("other-model", turn2); got != 0 {
		t.Fatalf("another model's cache gave %d", got)
	}
	c.Reset()
	if got := c.Serve("m", turn2); got != 0 {
		t.Fatalf("after Reset: %d", got)
	}
}

func TestPromptCacheForgetsTheLeastRecentBeyondItsBounds(t *testing.T) {
	c := NewPromptCache(2, 0)
	a, b, d := Tokens(nil).AppendText("a a a"), Tokens(nil).AppendText("b b b"), Tokens(nil).AppendText("d d d")
	c.Serve("m", a)
	c.Serve("m", b)
	c.Serve("m", d) // a is forgotten
	if got := c.Serve("m", a); got != 0 {
		t.Fatalf("a still cached: %d", got)
	}
	if got := c.Serve("m", d); got != 3 {
		t.Fatalf("d forgotten: %d", got)
	}

	c = NewPromptCache(10, 5)
	c.Serve("m", a)
	c.Serve("m", b) // 6 tokens > 5: a is forgotten
	if got := c.Serve("m", a); got != 0 {
		t.Fatalf("token budget not kept: %d", got)
	}
	big := Tokens(nil).AppendText(words(20, "w"))
	c.Serve("m", big) // larger than the budget on its own: kept alone
	if got := c.Serve("m", big); got != len(big) {
		t.Fatalf("a prompt over the budget was not kept: %d", got)
	}
}

// A prompt that extends a remembered one takes its place: a 30-turn
// session holds one entry, not thirty.
func TestPromptCacheKeepsOneEntryPerSession(t *testing.T) {
	c := NewPromptCache(3, 0)
	var p Tokens
	for turn := range 30 {
		p = p.AppendText(words(5, string(rune('a'+turn%26))))
		c.Serve("m", p)
	}
	other := Tokens(nil).AppendText("q q")
	c.Serve("m", other)
	c.Serve("m", Tokens(nil).AppendText("r r"))
	if got := c.Serve("m", p); got != len(p) {
		t.Fatalf("the session's entry was evicted by two others: %d", got)
	}
}

func TestPromptCacheIsSafeForConcurrentUse(t *testing.T) {
	c := NewPromptCache(4, 0)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p := Tokens(nil).AppendText(words(50, "p"))
			for j := range 20 {
				c.Serve("m", p.AppendText(words(j, string(rune('a'+i)))))
			}
		})
	}
	wg.Wait()
}

func TestPrefillCostsOnlyTheUnseenTokens(t *testing.T) {
	if got := Prefill(time.Millisecond, time.Microsecond, 1000, 900); got != time.Millisecond+100*time.Microsecond {
		t.Fatalf("prefill %v", got)
	}
	if got := Prefill(0, time.Microsecond, 10, 20); got != 0 {
		t.Fatalf("more cached than the prompt: %v", got)
	}
}

func TestTokenizer(t *testing.T) {
	w := Words("  Hello,\tworld!\n again ")
	if strings.Join(w, "|") != "Hello,|world!|again" {
		t.Fatalf("words %q", w)
	}
	if ID("Hello,") != 129159 || ID("a") == ID("b") || ID("a") < 0 || ID("a") >= Vocabulary {
		t.Fatal("ids are not the stable FNV-1a hash below the vocabulary")
	}
	special := Tokens(nil).AppendSpecial("user")
	word := Tokens(nil).AppendText("user")
	if special[0] == word[0] {
		t.Fatal("a special token equals a word")
	}
}

func TestPiecesRoundTrip(t *testing.T) {
	for _, s := range []string{"", "a", "a b", " lead", "two  spaces", "end ", `{"a": 1, "b": "c d"}`} {
		if got := strings.Join(Pieces(s), ""); got != s {
			t.Errorf("%q → %q", s, got)
		}
	}
	if got := Pieces(`{"a": 1}`); len(got) != 2 || got[1] != " 1}" {
		t.Errorf("pieces %q", got)
	}
}
