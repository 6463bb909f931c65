// Package simulator is a deterministic model for demos, tests and load. It
// has no upstream server: Execute makes its text itself, from a fixed
// vocabulary seeded by a hash of the request (target, last user message and
// seed), so the same request always streams the same tokens; Complete does
// the same for a raw completion's prompt and suffix, and Embed makes unit
// vectors from a hash of each input.
//
// Each configured model has knobs: its token count and rate, a prefill
// delay before the first token, reasoning sent before the text (marked
// with the run's reasoning effort, and left out when the run asks for no
// thinking), a tool call sent after it, a stall after N tokens (it stops
// emitting and waits for the run to be cancelled) and a failure of a given
// kind after N tokens. Waits use the standard timers, so tests drive them
// with testing/synctest.
//
// CountTokens counts a prompt by the simulator's own tokenization, one
// token a word (promptTokens), which is also the prompt count of the
// usage its runs report.
package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// Version is the adapter's version, reported in its Info.
const Version = "0.1.0"

// DefaultModel is the one model served when the configuration names none.
const DefaultModel = "sim-small"

// Defaults of a model's knobs.
const (
	DefaultTokens        = 32
	DefaultTokenInterval = 20 * time.Millisecond
	DefaultEmbeddingDims = 16
)

// Config is the adapter's configuration, decoded strictly.
type Config struct {
	// Models are the simulated models; none means one DefaultModel with
	// default knobs.
	Models []ModelConfig `json:"models,omitempty"`
}

// ModelConfig is one simulated model and its knobs.
type ModelConfig struct {
	// Name is the target name. Required, unique.
	Name string `json:"name"`
	// Tokens is the number of text tokens of an answer (default 32).
	Tokens *int `json:"tokens,omitempty"`
	// TokenInterval is the wait between two tokens, as a Go duration
	// (default "20ms").
	TokenInterval string `json:"token_interval,omitempty"`
	// PrefillDelay is the wait before the first event (default none).
	PrefillDelay string `json:"prefill_delay,omitempty"`
	// StallAfter, when positive, makes the model stop after that many
	// tokens (or after its last, if it has fewer) and send nothing more
	// until the run is cancelled.
	StallAfter int `json:"stall_after,omitempty"`
	// Fail makes the run fail (see FailConfig).
	Fail *FailConfig `json:"fail,omitempty"`
	// ToolCall is a call sent, whole, in one tool-call delta after the
	// text; the run then finishes with "tool_calls".
	ToolCall *ToolCallConfig `json:"tool_call,omitempty"`
	// Reasoning is text sent as one reasoning delta before the answer.
	Reasoning string `json:"reasoning,omitempty"`
	// NoSuffix makes raw completions with a suffix fail as unsupported, as
	// a model without fill-in-the-middle does.
	NoSuffix bool `json:"no_suffix,omitempty"`
	// EmbeddingDims is the length of the model's embeddings (default
	// DefaultEmbeddingDims).
	EmbeddingDims int `json:"embedding_dims,omitempty"`
}

// FailConfig makes a model's runs fail.
type FailConfig struct {
	// Kind names the failure kind, as sdk.Kind.String spells it:
	// internal, invalid_request, unauthenticated, rate_limited,
	// model_not_found, unavailable, upstream, unsupported.
	Kind string `json:"kind"`
	// Message is the error's message (default "simulated failure").
	Message string `json:"message,omitempty"`
	// AfterTokens is the number of tokens sent before failing (or all of
	// them, if the answer has fewer). If a stall is due at the same
	// point, the failure wins.
	AfterTokens int `json:"after_tokens,omitempty"`
}

// ToolCallConfig is a tool call the model makes.
type ToolCallConfig struct {
	Name string `json:"name"`
	// Arguments is the call's arguments, a JSON value (default {}).
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// model is a validated ModelConfig.
type model struct {
	name       string
	tokens     int
	interval   time.Duration
	prefill    time.Duration
	stallAfter int
	fail       *failure
	toolName   string
	toolArgs   string
	reasoning  string
	noSuffix   bool
	dims       int
}

type failure struct {
	kind    sdk.Kind
	message string
	after   int
}

// Adapter is the simulator. Create it with New.
type Adapter struct {
	models atomic.Pointer[catalog]
}

// catalog is the configured models, by name and in configuration order.
type catalog struct {
	byName map[string]*model
	names  []string
}

var (
	_ sdk.Adapter      = (*Adapter)(nil)
	_ sdk.TargetLister = (*Adapter)(nil)
	_ sdk.Prober       = (*Adapter)(nil)
	_ sdk.Completer    = (*Adapter)(nil)
	_ sdk.Embedder     = (*Adapter)(nil)
	_ sdk.TokenCounter = (*Adapter)(nil)
)

// New returns a simulator serving DefaultModel until configured.
func New() *Adapter {
	a := &Adapter{}
	c, err := Config{}.validate()
	if err != nil {
		panic(err) // the defaults are valid
	}
	a.models.Store(c)
	return a
}

// Info describes the adapter.
func (a *Adapter) Info() sdk.Info {
	return sdk.Info{
		Name:        "simulator",
		Version:     Version,
		Description: "deterministic simulated models for demos, tests and load (no model server); counts tokens a word each",
		ConfigFields: map[string]string{
			"models": `optional list of {name, tokens (default 32), token_interval (default "20ms"), prefill_delay (default "0s"), ` +
				`stall_after (0 = never), fail {kind, message, after_tokens}, tool_call {name, arguments}, ` +
				`reasoning (marked "[effort LEVEL] " with the run's effort, left out when the run asks for no thinking), ` +
				`no_suffix (no fill-in-the-middle), embedding_dims (default 16)}; ` +
				`default: one model "` + DefaultModel + `"`,
		},
	}
}

// Configure validates and installs the models.
func (a *Adapter) Configure(_ context.Context, raw sdk.Config) error {
	var cfg Config
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return err
	}
	c, err := cfg.validate()
	if err != nil {
		return err
	}
	a.models.Store(c)
	return nil
}

func (cfg Config) validate() (*catalog, error) {
	models := cfg.Models
	if len(models) == 0 {
		models = []ModelConfig{{Name: DefaultModel}}
	}
	c := &catalog{byName: map[string]*model{}}
	for i, mc := range models {
		m, err := mc.validate()
		if err != nil {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: models[%d]: %s", i, err)
		}
		if _, dup := c.byName[m.name]; dup {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: models[%d]: name %q is used twice", i, m.name)
		}
		c.byName[m.name] = m
		c.names = append(c.names, m.name)
	}
	return c, nil
}

func (mc ModelConfig) validate() (*model, error) {
	if mc.Name == "" {
		return nil, fmt.Errorf("name is required")
	}
	m := &model{name: mc.Name, tokens: DefaultTokens, interval: DefaultTokenInterval, reasoning: mc.Reasoning,
		noSuffix: mc.NoSuffix, dims: DefaultEmbeddingDims}
	switch d := mc.EmbeddingDims; {
	case d < 0 || d > wirepb.MaxEmbedDimensions:
		return nil, fmt.Errorf("embedding_dims: must be between 1 and %d", wirepb.MaxEmbedDimensions)
	case d > 0:
		m.dims = d
	}
	if mc.Tokens != nil {
		if *mc.Tokens < 0 {
			return nil, fmt.Errorf("tokens: must not be negative")
		}
		m.tokens = *mc.Tokens
	}
	var err error
	if m.interval, err = duration("token_interval", mc.TokenInterval, DefaultTokenInterval); err != nil {
		return nil, err
	}
	if m.prefill, err = duration("prefill_delay", mc.PrefillDelay, 0); err != nil {
		return nil, err
	}
	if mc.StallAfter < 0 {
		return nil, fmt.Errorf("stall_after: must not be negative")
	}
	m.stallAfter = mc.StallAfter
	if f := mc.Fail; f != nil {
		kind, ok := kindNamed(f.Kind)
		if !ok {
			return nil, fmt.Errorf("fail.kind: unknown kind %q", f.Kind)
		}
		if f.AfterTokens < 0 {
			return nil, fmt.Errorf("fail.after_tokens: must not be negative")
		}
		msg := f.Message
		if msg == "" {
			msg = "simulated failure"
		}
		m.fail = &failure{kind: kind, message: msg, after: f.AfterTokens}
	}
	if tc := mc.ToolCall; tc != nil {
		if tc.Name == "" {
			return nil, fmt.Errorf("tool_call.name is required")
		}
		m.toolName, m.toolArgs = tc.Name, "{}"
		if len(tc.Arguments) > 0 {
			if !json.Valid(tc.Arguments) {
				return nil, fmt.Errorf("tool_call.arguments: not valid JSON")
			}
			m.toolArgs = string(tc.Arguments)
		}
	}
	return m, nil
}

func duration(key, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a duration (e.g. \"20ms\")", key, s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s: must not be negative", key)
	}
	return d, nil
}

// kindNamed returns the sdk.Kind whose String is name.
func kindNamed(name string) (sdk.Kind, bool) {
	for k := sdk.KindInternal; k <= sdk.KindUnsupported; k++ {
		if k.String() == name {
			return k, true
		}
	}
	return 0, false
}

// ListTargets lists the configured models, in configuration order.
func (a *Adapter) ListTargets(context.Context) ([]sdk.Target, error) {
	c := a.models.Load()
	out := make([]sdk.Target, len(c.names))
	for i, n := range c.names {
		out[i] = sdk.Target{Name: n}
	}
	return out, nil
}

// Probe answers available for a configured model, unavailable otherwise.
func (a *Adapter) Probe(_ context.Context, target string) (sdk.Health, error) {
	if _, ok := a.models.Load().byName[target]; ok {
		return sdk.Health{Status: sdk.HealthAvailable, Detail: "simulated model configured"}, nil
	}
	return sdk.Health{Status: sdk.HealthUnavailable, Detail: "no such simulated model"}, nil
}
