package main

import (
	"slices"
	"strings"
	"testing"
)

// The measurement relies on each turn's conversation being the start of
// the next one's (as an agent's is), and on turns sharing no text but
// that prefix.
func TestEachTurnExtendsTheLast(t *testing.T) {
	o := options{system: 10, perTurn: 5}
	for k := 1; k < 5; k++ {
		this, next := conversation(o, k), conversation(o, k+1)
		if !slices.Equal(this, next[:len(this)]) {
			t.Fatalf("turn %d's messages are not the start of turn %d's", k, k+1)
		}
		if got := len(strings.Fields(next[len(next)-1].Content)); got != o.perTurn {
			t.Errorf("turn %d adds %d words, want %d", k+1, got, o.perTurn)
		}
		if strings.Contains(next[len(this)+1].Content, this[len(this)-1].Content) {
			t.Errorf("turn %d repeats turn %d's text", k+1, k)
		}
	}
	if got := len(strings.Fields(conversation(o, 1)[0].Content)); got != o.system {
		t.Errorf("the system prompt has %d words, want %d", got, o.system)
	}
}
