package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/iop-dev/iop/sdk"
)

// How a run's options reach Ollama's /api/chat and /api/generate (SPEC P2).
//
// The normalized options go to their places: temperature, top_p, seed and
// stop into options, MaxTokens as options.num_predict, Format as format,
// and ReasoningEffort or Think as think (see thinkFor).
//
// Options.Extra holds the client's other fields, named as an
// OpenAI-compatible server names them. Of those:
//   - Ollama's options by their own names (top_k, min_p, typical_p,
//     repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty,
//     num_ctx, num_predict, num_keep, num_batch, num_gpu, main_gpu,
//     num_thread, use_mmap) go into options, and so does
//     repetition_penalty, vLLM's and llama.cpp's name for repeat_penalty;
//   - an "options" object, Ollama's own spelling, merges into options key
//     by key, its keys winning over the top-level ones; a key in it that
//     Ollama does not know is passed too (Ollama ignores it, with a
//     warning in its log);
//   - truncate, shift and think go to the top level, as Ollama takes them,
//     and so does keep_alive unless the provider's configuration sets one
//     (the operator owns the server's memory); raw too, for a raw
//     completion (/api/generate);
//   - any other field whose name is not one of Ollama's own request fields
//     goes to the top level as the client sent it (logit_bias, user,
//     chat_template_kwargs, a vendor's own): Ollama ignores a field it
//     does not know, and a server that speaks Ollama's API may read it;
//   - a field named as one of Ollama's own request fields (ollamaFields:
//     model, messages, prompt, stream, format, tools, images, template,
//     system, context, logprobs, top_logprobs...) is never taken from
//     Extra, except those above: the adapter sets them itself, or leaves
//     them unset on purpose (logprobs would make Ollama compute what the
//     adapter does not relay; template, system and context would change
//     the prompt behind the run's messages).
//
// A normalized option wins over the same option in Extra. A known option
// whose value has the wrong JSON type is refused (invalid_request, naming
// it) before the call, as Ollama would refuse the request; a null one is
// left out, as Ollama skips it.
//
// ToolChoice: "" and auto send the tools as they are; none sends no tools,
// so the model cannot call one; required and a named function, which
// Ollama cannot force, send no tools either but constrain the answer to
// the call's JSON (see forced.go).

// ollamaFields are the top-level fields of Ollama's /api/chat and
// /api/generate requests (api.ChatRequest and api.GenerateRequest in
// github.com/ollama/ollama/api); TestOllamaFieldsAreReserved keeps this
// list a superset of Ollama's. Extra never sets them directly: the ones the
// adapter takes from Extra (keep_alive, think, truncate, shift, raw,
// options) go through fromExtra's checks, the others are the adapter's.
var ollamaFields = map[string]bool{
	"model": true, "messages": true, "prompt": true, "suffix": true, "system": true, "template": true,
	"context": true, "stream": true, "raw": true, "format": true, "keep_alive": true, "images": true,
	"options": true, "think": true, "truncate": true, "shift": true, "tools": true,
	"_debug_render_only": true, "logprobs": true, "top_logprobs": true, "width": true, "height": true, "steps": true,
	"input": true, "dimensions": true,
}

// optionKind is the JSON type Ollama requires of an option's value.
type optionKind int

const (
	kindInt     optionKind = iota + 1 // a number (Ollama truncates it)
	kindFloat                         // a number
	kindBool                          // true or false
	kindStrings                       // an array of strings
)

// optionKinds are Ollama's options (api.Options and api.Runner in
// github.com/ollama/ollama/api) and their types;
// TestOptionKindsAreOllamas keeps this table equal to Ollama's.
var optionKinds = map[string]optionKind{
	"num_keep": kindInt, "seed": kindInt, "num_predict": kindInt, "top_k": kindInt, "top_p": kindFloat,
	"min_p": kindFloat, "typical_p": kindFloat, "repeat_last_n": kindInt, "temperature": kindFloat,
	"repeat_penalty": kindFloat, "presence_penalty": kindFloat, "frequency_penalty": kindFloat, "stop": kindStrings,
	"num_ctx": kindInt, "num_batch": kindInt, "num_gpu": kindInt, "main_gpu": kindInt, "use_mmap": kindBool,
	"num_thread": kindInt,
}

// optionAliases are other servers' names for Ollama's options.
var optionAliases = map[string]string{"repetition_penalty": "repeat_penalty"}

// topLevel are the fields that go to the top level of Ollama's request
// from Extra, and think from the normalized options. raw is
// /api/generate's only (no template applied to a raw completion's prompt);
// chat leaves it out.
type topLevel struct {
	keepAlive, think, truncate, shift, raw json.RawMessage
	// rest are Extra's fields that are not Ollama's, passed as they came
	// (see encodeWith).
	rest map[string]json.RawMessage
	// relaxThink says think was mapped from the normalized options (Think
	// or ReasoningEffort) and asks the model to think: on a model that
	// cannot think as asked, the run is sent again nearer to what it can
	// (see relaxedThink).
	relaxThink bool
}

// options builds Ollama's options and top-level fields from o: Extra's,
// then the normalized ones over them.
func options(o sdk.Options) (map[string]any, topLevel, error) {
	opts, top, err := fromExtra(o.Extra)
	if err != nil {
		return nil, top, err
	}
	if o.Temperature != nil {
		opts["temperature"] = *o.Temperature
	}
	if o.TopP != nil {
		opts["top_p"] = *o.TopP
	}
	if o.MaxTokens != nil {
		opts["num_predict"] = *o.MaxTokens
	}
	if len(o.Stop) > 0 {
		opts["stop"] = o.Stop
	}
	if o.Seed != nil {
		opts["seed"] = *o.Seed
	}
	think, err := thinkFor(o)
	if err != nil {
		return nil, top, err
	}
	if think != nil {
		top.think, top.relaxThink = think, string(think) != "false"
	}
	if len(opts) == 0 {
		opts = nil
	}
	return opts, top, nil
}

// thinkFor maps the run's reasoning options to Ollama's think, or nil to
// leave Extra's think (or Ollama's default). Ollama takes true or false,
// and for models with levels (gpt-oss) "low", "medium" or "high"; since
// 0.17.7 a thinking model without levels takes a level as true (its
// template ignores it), while Ollama 0.11 to 0.17.6 refused it, and a
// model that cannot think refuses true and any level alike (see
// relaxedThink for how the adapter steps down on those refusals). So a
// level is sent only when the client asked for one:
//
//	ReasoningEffort none             false
//	ReasoningEffort minimal, low     "low"
//	ReasoningEffort medium           "medium"
//	ReasoningEffort high, max        "high"
//	Think (without an effort)        true or false
//
// max is sent as "high": Ollama added "max" in 2026 and refuses the run
// (400 "invalid think value") before that, while every Ollama with levels
// takes "high".
func thinkFor(o sdk.Options) (json.RawMessage, error) {
	switch o.ReasoningEffort {
	case "":
	case sdk.EffortNone:
		return json.RawMessage("false"), nil
	case sdk.EffortMinimal, sdk.EffortLow:
		return json.RawMessage(`"low"`), nil
	case sdk.EffortMedium:
		return json.RawMessage(`"medium"`), nil
	case sdk.EffortHigh, sdk.EffortMax:
		return json.RawMessage(`"high"`), nil
	default:
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "ollama: unknown reasoning effort %q", o.ReasoningEffort)
	}
	if o.Think != nil {
		return json.Marshal(*o.Think)
	}
	return nil, nil
}

// fromExtra sorts Extra's fields into options, Ollama's top-level fields
// and the rest (see above).
func fromExtra(extra json.RawMessage) (map[string]any, topLevel, error) {
	opts := map[string]any{}
	var top topLevel
	e := bytes.TrimSpace(extra)
	if len(e) == 0 || string(e) == "null" {
		return opts, top, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(e, &fields); err != nil {
		return nil, top, sdk.Errorf(sdk.KindInvalidRequest, "ollama: extra options must be a JSON object")
	}
	// Sorted, so that of two names for one option (repeat_penalty and
	// repetition_penalty) the same one wins on every run.
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		v := fields[name]
		if alias, ok := optionAliases[name]; ok {
			if _, both := fields[alias]; both {
				continue // Ollama's own name wins
			}
			name = alias
		}
		if _, ok := optionKinds[name]; ok {
			if err := setOption(opts, name, v); err != nil {
				return nil, top, err
			}
			continue
		}
		switch name {
		case "keep_alive":
			top.keepAlive = v
		case "think":
			top.think = v
		case "truncate":
			top.truncate = v
		case "shift":
			top.shift = v
		case "raw":
			top.raw = v
		default:
			if !ollamaFields[name] {
				if top.rest == nil {
					top.rest = map[string]json.RawMessage{}
				}
				top.rest[name] = v
			}
		}
	}
	if raw, ok := fields["options"]; ok && !isNull(raw) {
		var own map[string]json.RawMessage
		if err := json.Unmarshal(raw, &own); err != nil {
			return nil, top, sdk.Errorf(sdk.KindInvalidRequest, "ollama: extra options: options must be a JSON object")
		}
		for name, v := range own {
			if err := setOption(opts, name, v); err != nil {
				return nil, top, err
			}
		}
	}
	return opts, top, nil
}

// encodeWith encodes body, an Ollama request, as JSON with rest's fields
// added at its top level, in name order. rest never holds one of Ollama's
// own field names (fromExtra keeps them out), so no field is sent twice and
// none of the adapter's is replaced.
func encodeWith(body any, rest map[string]json.RawMessage) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		return b, nil
	}
	buf := bytes.NewBuffer(b[:len(b)-1]) // without its closing brace
	for _, name := range slices.Sorted(maps.Keys(rest)) {
		key, _ := json.Marshal(name)
		buf.WriteByte(',')
		buf.Write(key)
		buf.WriteByte(':')
		if err := json.Compact(buf, rest[name]); err != nil {
			return nil, fmt.Errorf("extra field %s: %w", name, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// setOption sets opts[name] to v, after checking v's type for an option
// Ollama knows. A null value is left out.
func setOption(opts map[string]any, name string, v json.RawMessage) error {
	v = bytes.TrimSpace(v)
	if isNull(v) {
		return nil
	}
	ok := true
	switch optionKinds[name] {
	case kindInt, kindFloat:
		ok = v[0] == '-' || ('0' <= v[0] && v[0] <= '9')
	case kindBool:
		ok = string(v) == "true" || string(v) == "false"
	case kindStrings:
		var ss []string
		ok = json.Unmarshal(v, &ss) == nil
	}
	if !ok {
		return sdk.Errorf(sdk.KindInvalidRequest, "ollama: option %s must be %s", name, optionKinds[name])
	}
	opts[name] = v
	return nil
}

func (k optionKind) String() string {
	switch k {
	case kindInt:
		return "an integer"
	case kindFloat:
		return "a number"
	case kindBool:
		return "true or false"
	case kindStrings:
		return "an array of strings"
	}
	return "valid"
}

func isNull(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) == 0 || string(v) == "null"
}

// toolsFor returns the tools to send for req's tool choice, and the call
// the run must make when the choice forces one (see above).
func toolsFor(req *sdk.Request) ([]sdk.Tool, *forcedCall, error) {
	c := req.Options.ToolChoice
	if err := c.Check(req.Tools); err != nil {
		return nil, nil, err
	}
	switch {
	case c == sdk.ToolChoiceNone:
		return nil, nil, nil
	case c.Forces():
		f, err := forceCall(c, req.Tools)
		if err != nil {
			return nil, nil, err
		}
		return nil, f, nil // the schema alone forces the call (forced.go)
	}
	return req.Tools, nil, nil
}
