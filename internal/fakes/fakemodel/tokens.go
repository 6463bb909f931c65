package fakemodel

import (
	"hash/fnv"
	"strings"
)

// Vocabulary is the size of the fakes' vocabulary: the token ids they
// report (see ID) are below it. It is Qwen2's, so ids look familiar.
const Vocabulary = 151643

// Words cuts text into the fakes' tokens: its whitespace-separated words.
// Every count of prompt tokens the fakes report is a count of these.
func Words(text string) []string { return strings.Fields(text) }

// ID is the token id of a word, as a tokenize endpoint reports it: a hash
// of the word, below Vocabulary. Equal words have equal ids.
func ID(word string) int { return int(hash32(word) % Vocabulary) }

// Tokens is a prompt as the prompt cache compares prompts: one value per
// token, from a 64-bit hash of the word (or of a special token's name), so
// that two different prompts practically never compare equal.
type Tokens []uint64

// AppendText appends the tokens of text.
func (t Tokens) AppendText(text string) Tokens {
	for _, w := range Words(text) {
		t = append(t, hash64(w))
	}
	return t
}

// AppendSpecial appends one special token, such as a chat template's
// "<|start|>": it never equals the token of a word.
func (t Tokens) AppendSpecial(name string) Tokens {
	return append(t, hash64("\x00special\x00"+name))
}

func hash32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

func hash64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// Pieces cuts s into the pieces a fake streams: words, each after the first
// keeping the whitespace before it, so that joining them gives s back.
func Pieces(s string) []string {
	var out []string
	start := 0
	for i := 1; i < len(s); i++ {
		if s[i] == ' ' && s[i-1] != ' ' {
			out = append(out, s[start:i])
			start = i
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
