package fakemodel

import (
	"sync"
	"time"
)

// Default bounds of a PromptCache.
const (
	// DefaultCachePrompts is how many prompts a cache remembers.
	DefaultCachePrompts = 64
	// DefaultCacheTokens bounds the tokens a cache holds in all (32 MiB of
	// hashes), so that long agent sessions cannot grow it without end.
	DefaultCacheTokens = 4 << 20
)

// PromptCache stands in for a model server's prompt (KV) cache: it
// remembers the token sequences of the prompts served recently, per model,
// and tells a new prompt how many of its first tokens one of them shares.
// Those tokens need no prefill; the rest do. A real server keeps the
// prompt's KV blocks (vLLM) or a slot's context (llama.cpp, Ollama); what a
// session-affinity measurement needs from either is the same: the turn that
// lands where the session's previous turn ran skips most of its prefill.
//
// A prompt that extends a remembered one (a session's next turn) takes its
// place, so one session holds one entry. Beyond the bounds the least
// recently served prompts are forgotten. It is safe for concurrent use.
type PromptCache struct {
	mu        sync.Mutex
	maxPrompt int
	maxTokens int
	held      int     // tokens in entries
	entries   []entry // least recently served first
}

type entry struct {
	key    string
	tokens Tokens
}

// NewPromptCache returns a cache of at most prompts prompts and tokens
// tokens in all; 0 (or less) takes the default bound.
func NewPromptCache(prompts, tokens int) *PromptCache {
	if prompts <= 0 {
		prompts = DefaultCachePrompts
	}
	if tokens <= 0 {
		tokens = DefaultCacheTokens
	}
	return &PromptCache{maxPrompt: prompts, maxTokens: tokens}
}

// Serve returns the length of the longest common prefix of prompt with a
// prompt remembered under key (a model's name), and remembers prompt as
// the most recently served.
func (c *PromptCache) Serve(key string, prompt Tokens) (cached int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.entries[:0]
	for _, e := range c.entries {
		if e.key != key {
			kept = append(kept, e)
			continue
		}
		n := commonPrefix(e.tokens, prompt)
		cached = max(cached, n)
		if n == len(e.tokens) {
			// prompt extends (or repeats) it: prompt takes its place.
			c.held -= len(e.tokens)
			continue
		}
		kept = append(kept, e)
	}
	clear(c.entries[len(kept):]) // let forgotten sequences go
	c.entries = append(kept, entry{key: key, tokens: append(Tokens(nil), prompt...)})
	c.held += len(prompt)
	for len(c.entries) > 1 && (len(c.entries) > c.maxPrompt || c.held > c.maxTokens) {
		c.held -= len(c.entries[0].tokens)
		c.entries[0] = entry{}
		c.entries = c.entries[1:]
	}
	return cached
}

// Reset forgets every prompt: the next requests start cold.
func (c *PromptCache) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries, c.held = nil, 0
}

// Prefill is the prefill delay of a prompt of total tokens of which cached
// are in the cache: base plus perToken for every token not cached.
func Prefill(base, perToken time.Duration, total, cached int) time.Duration {
	return base + perToken*time.Duration(max(total-cached, 0))
}

func commonPrefix(a, b Tokens) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
