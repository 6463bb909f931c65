package ollama

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"

	"github.com/iop-dev/iop/sdk"
)

// How a run's options reach Ollama's /api/chat (SPEC P2).
//
// The normalized options go to their places: temperature, top_p, seed and
// stop into options, MaxTokens as options.num_predict, Format as format,
// Think as think.
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
//   - everything else is dropped: OpenAI's fields that Ollama has no
//     equivalent for (logit_bias, user, parallel_tool_calls, service_tier,
//     store, metadata, prediction, modalities, audio), other servers'
//     (chat_template_kwargs, guided_json, a vendor's own), and logprobs and
//     top_logprobs (Ollama would compute them, but the adapter does not
//     relay them). Ollama ignores a top-level field it does not know, so
//     sending them would do no harm; not sending them keeps the body what
//     Ollama documents.
//
// A normalized option wins over the same option in Extra. A known option
// whose value has the wrong JSON type is refused (invalid_request, naming
// it) before the call, as Ollama would refuse the request; a null one is
// left out, as Ollama skips it.
//
// ToolChoice: "" and auto send the tools as they are; none sends no tools,
// so the model cannot call one; required and a named function fail the run
// with KindUnsupported, since Ollama cannot force a tool call, and the
// Edge answers the client 400.

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

// topLevel are the fields of Extra that go to the top level of Ollama's
// request. raw is /api/generate's only (no template applied to a raw
// completion's prompt); chat leaves it out.
type topLevel struct {
	keepAlive, think, truncate, shift, raw json.RawMessage
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
	if o.Think != nil {
		top.think, _ = json.Marshal(*o.Think)
	}
	if len(opts) == 0 {
		opts = nil
	}
	return opts, top, nil
}

// fromExtra sorts Extra's fields into options and top-level fields, and
// drops the rest (see above).
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

// toolsFor returns the tools to send for req's tool choice (see above).
func toolsFor(req *sdk.Request) ([]sdk.Tool, error) {
	c := req.Options.ToolChoice
	if err := c.Check(req.Tools); err != nil {
		return nil, err
	}
	switch {
	case c == sdk.ToolChoiceNone:
		return nil, nil
	case c.Forces():
		return nil, sdk.Errorf(sdk.KindUnsupported,
			"ollama: Ollama cannot force a tool call (tool_choice %q); use auto or none", c)
	}
	return req.Tools, nil
}
