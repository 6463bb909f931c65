// Package testadapter is a scriptable adapter for the SDK's own tests. A
// run's Target is its script:
//
//	text:N        N text deltas "t0".."tN-1", a usage event, done "stop"
//	tools         a reasoning delta, a tool call in two fragments, usage, done "tool_calls"
//	fail:KIND     fails with that sdk.Kind name ("rate_limited", ...)
//	panic         panics in Execute
//	sleep         blocks until ctx is done, then returns ctx's error
//	exit          sends one event, then exits the process with status 3
//	badevent      sends an Event with Kind 0 and returns Send's error
//	garbage       writes garbage to the real stderr and to stdout, then completes
//
// Probe("stats") reports "active=N cancelled=M" (runs in Execute now, runs
// that saw ctx done). Tunnel echoes the request body under a 200 head;
// path "/fail" fails after the head, "/fail-early" before it.
package testadapter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// Config is the adapter's configuration.
type Config struct {
	// Prefix is put before every text delta.
	Prefix string `json:"prefix"`
}

// Adapter implements every capability.
type Adapter struct {
	cfg       atomic.Pointer[Config]
	active    atomic.Int64
	cancelled atomic.Int64
	closed    atomic.Bool
}

// New returns the full adapter.
func New() *Adapter { return &Adapter{} }

var (
	_ sdk.TargetLister = (*Adapter)(nil)
	_ sdk.Tunneler     = (*Adapter)(nil)
	_ sdk.Prober       = (*Adapter)(nil)
	_ sdk.Closer       = (*Adapter)(nil)
)

// Info describes the adapter.
func (a *Adapter) Info() sdk.Info {
	return sdk.Info{
		Name:         "testadapter",
		Version:      "0.0.1",
		Description:  "a scriptable adapter for tests",
		ConfigFields: map[string]string{"prefix": "put before every text delta"},
	}
}

// Configure decodes the configuration strictly.
func (a *Adapter) Configure(_ context.Context, raw sdk.Config) error {
	var cfg Config
	if err := sdk.DecodeConfig(raw, &cfg); err != nil {
		return err
	}
	a.cfg.Store(&cfg)
	return nil
}

// Stats returns the runs in Execute now and the runs that saw ctx done.
func (a *Adapter) Stats() (active, cancelled int64) { return a.active.Load(), a.cancelled.Load() }

// Closed reports whether Close was called.
func (a *Adapter) Closed() bool { return a.closed.Load() }

// Execute runs the script named by req.Target.
func (a *Adapter) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	a.active.Add(1)
	defer a.active.Add(-1)
	if err := req.Options.ToolChoice.Check(req.Tools); err != nil {
		return nil, err
	}
	prefix := ""
	if c := a.cfg.Load(); c != nil {
		prefix = c.Prefix
	}
	script, arg, _ := strings.Cut(req.Target, ":")
	usage := &sdk.Usage{PromptTokens: 7, CompletionTokens: 3, TotalDuration: 1500 * time.Millisecond, EvalDuration: time.Second}
	switch script {
	case "text":
		n, _ := strconv.Atoi(arg)
		for i := range n {
			if err := out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: fmt.Sprintf("%st%d", prefix, i)}); err != nil {
				return nil, err
			}
		}
		if err := out.Send(ctx, sdk.Event{Kind: sdk.UsageReport, Usage: usage}); err != nil {
			return nil, err
		}
		return &sdk.Result{DoneReason: "stop", Usage: usage}, nil
	case "tools":
		events := []sdk.Event{
			{Kind: sdk.ReasoningDelta, Text: "thinking"},
			{Kind: sdk.ToolCallDelta, ToolCall: &sdk.ToolCall{Index: 0, ID: "call_1", Name: "get_weather", Arguments: `{"city":`}},
			{Kind: sdk.ToolCallDelta, ToolCall: &sdk.ToolCall{Index: 0, Arguments: `"Seoul"}`}},
			{Kind: sdk.UsageReport, Usage: usage},
		}
		for _, ev := range events {
			if err := out.Send(ctx, ev); err != nil {
				return nil, err
			}
		}
		return &sdk.Result{DoneReason: "tool_calls", Usage: usage}, nil
	case "fail":
		return nil, ScriptedError(arg)
	case "panic":
		panic("scripted panic")
	case "sleep":
		<-ctx.Done()
		a.cancelled.Add(1)
		return nil, ctx.Err()
	case "exit":
		_ = out.Send(ctx, sdk.Event{Kind: sdk.TextDelta, Text: "bye"})
		os.Exit(3)
	case "badevent":
		return nil, out.Send(ctx, sdk.Event{})
	case "garbage":
		WriteGarbage()
		return &sdk.Result{DoneReason: "stop"}, nil
	}
	return nil, sdk.Errorf(sdk.KindModelNotFound, "no script %q", req.Target)
}

// ScriptedError is the error `fail:KIND` returns.
func ScriptedError(kindName string) *sdk.Error {
	for k := sdk.KindInternal; k <= sdk.KindUnsupported; k++ {
		if k.String() == kindName {
			return &sdk.Error{Kind: k, Message: "scripted " + kindName, Retryable: k == sdk.KindRateLimited, UpstreamStatus: 400 + int(k)}
		}
	}
	return sdk.Errorf(sdk.KindInternal, "unknown kind %q", kindName)
}

// GarbageLines are what WriteGarbage writes to the real stderr, one per line.
var GarbageLines = []string{
	"not json at all",
	`{"@level":`,
	`{"@level":1,"@message":["x"],"@timestamp":5}`,
	`{"@message":"weird","@level":"info","@timestamp":"yesterday"}`,
	"null",
	"[1,2,3]",
	"\x00\xff\xfe\x1b[31mbinary\x07",
	`{"@level":"warn","@message":"hello from plugin","k":{"nested":[1,2]}}`,
	strings.Repeat("x", 200<<10),
}

// WriteGarbage writes GarbageLines to the process's real stderr (go-plugin
// points os.Stderr elsewhere while serving), and a line to stdout both
// ways (os.Stdout, and the real file descriptor 1).
func WriteGarbage() {
	realStderr := os.NewFile(2, "stderr")
	for _, l := range GarbageLines {
		_, _ = io.WriteString(realStderr, l+"\n")
	}
	fmt.Println("stdout via os.Stdout")
	_, _ = io.WriteString(os.NewFile(1, "stdout"), "stdout via fd 1\n")
}

// ListTargets lists two fixed targets.
func (a *Adapter) ListTargets(context.Context) ([]sdk.Target, error) {
	return []sdk.Target{{Name: "text:3"}, {Name: "tools"}}, nil
}

// Probe reports stats for "stats", unavailable for "down", available for
// anything else.
func (a *Adapter) Probe(_ context.Context, target string) (sdk.Health, error) {
	switch target {
	case "stats":
		return sdk.Health{Status: sdk.HealthAvailable, Detail: fmt.Sprintf("active=%d cancelled=%d", a.active.Load(), a.cancelled.Load())}, nil
	case "down":
		return sdk.Health{Status: sdk.HealthUnavailable, Detail: "scripted down"}, nil
	case "panic":
		panic("scripted probe panic")
	}
	return sdk.Health{Status: sdk.HealthAvailable, Detail: "ok"}, nil
}

// Tunnel echoes the request body.
func (a *Adapter) Tunnel(_ context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	if req.Path == "/fail-early" {
		return sdk.Errorf(sdk.KindUnavailable, "scripted early failure")
	}
	h := http.Header{"X-Method": {req.Method}, "X-Path": {req.Path}}
	if ct := req.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	if req.Credential != nil {
		h.Set("X-Credential-Kind", req.Credential.Kind)
	}
	if err := resp.WriteHeader(http.StatusOK, h); err != nil {
		return err
	}
	if _, err := io.Copy(resp, req.Body); err != nil {
		return err
	}
	if req.Path == "/fail" {
		return &sdk.Error{Kind: sdk.KindUpstream, Message: "scripted failure after the head", UpstreamStatus: 502}
	}
	return nil
}

// Close records that it was called.
func (a *Adapter) Close(context.Context) error {
	a.closed.Store(true)
	return nil
}

// Minimal implements only the required interface: no capabilities.
type Minimal struct{ full *Adapter }

// NewMinimal returns an adapter without optional capabilities.
func NewMinimal() *Minimal { return &Minimal{full: New()} }

// Info describes the adapter.
func (m *Minimal) Info() sdk.Info {
	info := m.full.Info()
	info.Name = "testadapter-minimal"
	return info
}

// Configure decodes the configuration strictly.
func (m *Minimal) Configure(ctx context.Context, cfg sdk.Config) error {
	return m.full.Configure(ctx, cfg)
}

// Execute runs the script named by req.Target.
func (m *Minimal) Execute(ctx context.Context, req *sdk.Request, out sdk.EventSink) (*sdk.Result, error) {
	return m.full.Execute(ctx, req, out)
}
