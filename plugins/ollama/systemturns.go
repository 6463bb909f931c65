package ollama

import (
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// System turns inside the conversation.
//
// A run's messages may hold a system message after the conversation has
// started: Claude Code sends one after the first user turn of every
// request (its environment block), OpenAI clients send system or developer
// messages anywhere. Ollama passes every message to the model's template,
// and few templates render such a message where it stands:
//
//   - the Go templates (template/*.gotmpl, and most models' in the
//     library) get every system message's text joined in .System, which
//     many (Qwen's, Gemma's, Command R's) render at the top or in
//     the first user turn, and skip system messages in .Messages: the
//     text moves to the start of the prompt, which changes whenever one is
//     added, so the whole prompt is prefilled again;
//   - the renderers of newer models (model/renderers) keep only the first
//     system message (qwen3-coder), hoist them all to the top (qwen3.5,
//     qwen3.8), or refuse them (qwen3.8 before Ollama hoisted, with
//     "system message must be at the beginning").
//
// So by default (system_turns: fold) the adapter sends what every template
// renders in place:
//
//   - the system messages the conversation starts with are joined into
//     one, their texts separated by a blank line (as Ollama joins .System;
//     qwen3-coder's renderer would keep the first only);
//   - a system message after that is folded into a user turn, at its
//     place: its text goes first in the user message that comes next,
//     else last in the user message it comes after, else (after an
//     assistant, or after tool results) it is a user message of its own.
//     Inside a group of tool results (between an assistant's tool calls
//     and the last of their results) it waits for the group's end, so that
//     no message comes between a call and its result. Ollama joins
//     consecutive user messages itself, so a user turn of its own and a
//     text at the end of the previous one render alike.
//
// The text goes as it is when it is one element of markup already
// ("<system-reminder>...</system-reminder>", Claude Code's "<env>...</env>"),
// else wrapped in <system-reminder> tags: the tag Claude Code itself puts
// system context in user turns with, so that the model reads it as the
// operator's, not the user's, words.
//
// Where the text goes depends only on its neighbours, never on the end of
// the conversation, and never moves it toward the top: the prompt a
// turn's request renders is the start of the next turn's, so the model's
// prompt (KV) cache keeps serving the session.
//
// system_turns: keep sends every message as the run has it, for models
// whose templates render system messages where they stand (Llama 3's,
// ChatML's, qwen3-vl's).

// systemTurns is what the adapter does with a run's system messages: see
// above.
type systemTurns string

const (
	systemTurnsFold systemTurns = "fold"
	systemTurnsKeep systemTurns = "keep"
)

// parseSystemTurns validates the system_turns config value ("" is fold).
func parseSystemTurns(v string) (systemTurns, error) {
	switch systemTurns(v) {
	case "", systemTurnsFold:
		return systemTurnsFold, nil
	case systemTurnsKeep:
		return systemTurnsKeep, nil
	}
	return "", sdk.Errorf(sdk.KindInvalidRequest, `config: system_turns %q: want "fold" or "keep"`, v)
}

// reminderTag wraps a folded system text that is not markup already.
const reminderTag = "system-reminder"

// apply returns the messages to send for msgs, and for each the index in
// msgs of the message it comes from (for errors that name the client's
// message). msgs is not modified; with keep, or when there is nothing to
// fold, it is returned as it is.
func (s systemTurns) apply(msgs []sdk.Message) ([]sdk.Message, []int) {
	lead := 0
	for lead < len(msgs) && msgs[lead].Role == "system" {
		lead++
	}
	if s == systemTurnsKeep || lead <= 1 && !hasSystem(msgs[lead:]) {
		return msgs, identity(len(msgs))
	}
	out := make([]sdk.Message, 0, len(msgs))
	from := make([]int, 0, len(msgs))
	if lead > 0 {
		out, from = append(out, joinSystem(msgs[:lead])), append(from, 0)
	}
	var folded *sdk.Message // the system texts waiting for their place
	foldedFrom := 0
	for i := lead; i < len(msgs); i++ {
		m := msgs[i]
		if m.Role == "system" {
			if folded == nil {
				folded, foldedFrom = &sdk.Message{Role: "user"}, i
			}
			addText(folded, asReminder(m.Content), m.Images, false)
			continue
		}
		// A tool result answers a call before it: the folded text waits
		// for the last result of the group.
		if folded != nil && m.Role != "tool" {
			if m.Role == "user" {
				m = withText(m, folded, true)
			} else {
				out, from = place(out, from, folded, foldedFrom)
			}
			folded = nil
		}
		out, from = append(out, m), append(from, i)
	}
	if folded != nil {
		out, from = place(out, from, folded, foldedFrom)
	}
	return out, from
}

func hasSystem(msgs []sdk.Message) bool {
	for _, m := range msgs {
		if m.Role == "system" {
			return true
		}
	}
	return false
}

func identity(n int) []int {
	ix := make([]int, n)
	for i := range ix {
		ix[i] = i
	}
	return ix
}

// joinSystem is the leading system messages as one: their texts (the
// empty ones left out) separated by blank lines, their images in order.
func joinSystem(lead []sdk.Message) sdk.Message {
	if len(lead) == 1 {
		return lead[0]
	}
	joined := sdk.Message{Role: "system"}
	for _, m := range lead {
		addText(&joined, m.Content, m.Images, false)
	}
	return joined
}

// place puts folded after the last message sent: at the end of that
// message when it is a user's, else as a user message of its own.
func place(out []sdk.Message, from []int, folded *sdk.Message, foldedFrom int) ([]sdk.Message, []int) {
	if n := len(out); n > 0 && out[n-1].Role == "user" {
		out[n-1] = withText(out[n-1], folded, false)
		return out, from
	}
	return append(out, *folded), append(from, foldedFrom)
}

// withText is a copy of m with folded's text and images added: first when
// first, else last.
func withText(m sdk.Message, folded *sdk.Message, first bool) sdk.Message {
	m.Images = append([][]byte(nil), m.Images...)
	addText(&m, folded.Content, folded.Images, first)
	return m
}

// addText adds text (separated from m's own by a blank line) and images to
// m, first when first, else last. An empty text adds only the images.
func addText(m *sdk.Message, text string, images [][]byte, first bool) {
	switch {
	case text == "":
	case m.Content == "":
		m.Content = text
	case first:
		m.Content = text + "\n\n" + m.Content
	default:
		m.Content += "\n\n" + text
	}
	if first {
		m.Images = append(append([][]byte(nil), images...), m.Images...)
	} else {
		m.Images = append(m.Images, images...)
	}
}

// asReminder is a system text as it is folded into a user turn: as it is
// when it is one element of markup, else wrapped in reminderTag. An empty
// text is empty.
func asReminder(text string) string {
	t := strings.TrimSpace(text)
	if t == "" || isElement(t) {
		return t
	}
	return "<" + reminderTag + ">\n" + t + "\n</" + reminderTag + ">"
}

// isElement reports whether t is one element of markup: it opens with a
// tag (<name> or <name attributes>) and closes with the same name's end
// tag.
func isElement(t string) bool {
	if len(t) < 2 || t[0] != '<' {
		return false
	}
	end := strings.IndexAny(t, "> \t\r\n")
	if end < 2 {
		return false
	}
	name := t[1:end]
	for i, r := range name {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || !(r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':')) {
			return false
		}
	}
	return strings.HasSuffix(t, "</"+name+">") && len(t) > 2*len(name)+4
}
