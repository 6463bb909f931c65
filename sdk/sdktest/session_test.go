package sdktest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/testadapter"
	"github.com/iop-dev/iop/sdk"
	"github.com/iop-dev/iop/sdk/sdktest"
)

// errStop is what the streaming part of everyCall's check returns from its
// callback, to stop a run.
var errStop = errors.New("stop here")

// everyCall is a custom check that drives every call of the Session with
// sdk values only, on the test adapter (see package testadapter for its
// scripts), and compares what comes back with what the adapter sent.
var everyCall = sdktest.Check{
	Name: "every_call",
	Doc:  "each Session call reaches the adapter and comes back as sdk values",
	Run: func(ctx context.Context, s *sdktest.Session) error {
		var problems []string
		for _, part := range []struct {
			name string
			run  func(context.Context, *sdktest.Session) error
		}{
			{"describe", describeCalls},
			{"configure", configureCalls},
			{"runs", runCalls},
			{"stream", streamCalls},
			{"embed", embedCalls},
			{"tunnel", tunnelCalls},
			{"targets and probe", targetCalls},
			{"restart", restartCalls},
		} {
			if err := part.run(ctx, s); err != nil {
				problems = append(problems, part.name+": "+err.Error())
			}
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
		return nil
	},
}

func describeCalls(ctx context.Context, s *sdktest.Session) error {
	info, err := s.Info(ctx)
	if err != nil || info.Name != "testadapter" || info.ConfigFields["prefix"] == "" {
		return fmt.Errorf("Info: %+v, %v", info, err)
	}
	caps, err := s.Capabilities(ctx)
	if want := sdk.Capabilities(testadapter.New()); err != nil || !slices.Equal(caps, want) {
		return fmt.Errorf("Capabilities: %v, %v; want %v", caps, err, want)
	}
	return nil
}

func configureCalls(ctx context.Context, s *sdktest.Session) error {
	if err := s.Configure(ctx, sdk.Config(`{"prefx":"p-"}`)); !errors.Is(err, sdk.ErrInvalidRequest) {
		return fmt.Errorf("a configuration with a typo: %v; want kind invalid_request", err)
	}
	if err := s.Configure(ctx, sdk.Config(`{"prefix":"p-"}`)); err != nil {
		return err
	}
	events, _, err := s.Execute(ctx, &sdk.Request{Target: "text:1"})
	if err != nil || len(events) == 0 || events[0].Text != "p-t0" {
		return fmt.Errorf("after Configure, a run streamed %+v (%v); want the prefix", events, err)
	}
	return s.Configure(ctx, s.Options().Config)
}

func runCalls(ctx context.Context, s *sdktest.Session) error {
	usage := &sdk.Usage{PromptTokens: 7, CompletionTokens: 3, TotalDuration: 1500 * time.Millisecond, EvalDuration: time.Second}
	events, res, err := s.Execute(ctx, &sdk.Request{Target: "tools"})
	want := []sdk.Event{
		{Kind: sdk.ReasoningDelta, Text: "thinking"},
		{Kind: sdk.ToolCallDelta, ToolCall: &sdk.ToolCall{ID: "call_1", Name: "get_weather", Arguments: `{"city":`}},
		{Kind: sdk.ToolCallDelta, ToolCall: &sdk.ToolCall{Arguments: `"Seoul"}`}},
		{Kind: sdk.UsageReport, Usage: usage},
	}
	if err != nil || !reflect.DeepEqual(events, want) || !reflect.DeepEqual(res, &sdk.Result{DoneReason: "tool_calls", Usage: usage}) {
		return fmt.Errorf("a tool-call run: %+v, %+v, %v", events, res, err)
	}

	_, _, err = s.Execute(ctx, &sdk.Request{Target: "fail:rate_limited"})
	var e *sdk.Error
	if !errors.Is(err, sdk.ErrRateLimited) || !errors.As(err, &e) || !e.Retryable || e.UpstreamStatus != 404 {
		return fmt.Errorf("a rate-limited run: %#v; want a retryable rate_limited error with its upstream status", err)
	}

	events, _, err = s.Execute(ctx, &sdk.Request{Target: "text:2", Prompt: "Once upon a time", Suffix: "end"})
	var text []string
	for _, ev := range events {
		if ev.Kind == sdk.TextDelta {
			text = append(text, ev.Text)
		}
	}
	if err != nil || strings.Join(text, ",") != "Once0,Once1,|end" {
		return fmt.Errorf("a raw completion streamed %q (%v)", text, err)
	}
	return nil
}

func streamCalls(ctx context.Context, s *sdktest.Session) error {
	n := 0
	_, err := s.Stream(ctx, &sdk.Request{Target: "text:1000000"}, func(ev sdk.Event) error {
		if n++; n == 3 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) || n != 3 {
		return fmt.Errorf("a run whose callback failed at the third event returned %v after %d event(s)", err, n)
	}
	return nil
}

func embedCalls(ctx context.Context, s *sdktest.Session) error {
	res, err := s.Embed(ctx, &sdk.EmbedRequest{Target: "embed", Inputs: []string{"a", "b"}, Dimensions: 3})
	want := [][]float32{testadapter.Vector("a", 3), testadapter.Vector("b", 3)}
	if err != nil || !reflect.DeepEqual(res.Vectors, want) {
		return fmt.Errorf("Embed: %+v, %v; want vectors %v", res, err, want)
	}
	if _, err := s.Embed(ctx, &sdk.EmbedRequest{Target: "fail:unavailable", Inputs: []string{"a"}}); !errors.Is(err, sdk.ErrUnavailable) {
		return fmt.Errorf("a failing Embed: %v; want kind unavailable", err)
	}
	return nil
}

// tunnelResponse keeps what a tunnel wrote.
type tunnelResponse struct {
	status int
	header http.Header
	body   strings.Builder
}

func (r *tunnelResponse) WriteHeader(status int, header http.Header) error {
	r.status, r.header = status, header
	return nil
}

func (r *tunnelResponse) Write(p []byte) (int, error) { return r.body.Write(p) }

func tunnelCalls(ctx context.Context, s *sdktest.Session) error {
	resp := &tunnelResponse{}
	err := s.Tunnel(ctx, &sdk.TunnelRequest{
		Target: "any", Method: "POST", Path: "/echo", Header: http.Header{"Content-Type": {"text/plain"}},
		Body: strings.NewReader("ping"),
	}, resp)
	// The session lends Options.Credential to a request without one.
	if err != nil || resp.status != 200 || resp.header.Get("X-Path") != "/echo" || resp.header.Get("Content-Type") != "text/plain" ||
		resp.header.Get("X-Credential-Kind") != "bearer" || resp.body.String() != "ping" {
		return fmt.Errorf("Tunnel: %d %v %q, %v", resp.status, resp.header, resp.body.String(), err)
	}
	if err := s.Tunnel(ctx, &sdk.TunnelRequest{Method: "GET", Path: "/fail"}, &tunnelResponse{}); !errors.Is(err, sdk.ErrUpstream) {
		return fmt.Errorf("a tunnel that failed after its head: %v; want kind upstream", err)
	}
	return nil
}

func targetCalls(ctx context.Context, s *sdktest.Session) error {
	targets, err := s.ListTargets(ctx)
	if want := []sdk.Target{{Name: "text:3"}, {Name: "tools"}}; err != nil || !reflect.DeepEqual(targets, want) {
		return fmt.Errorf("ListTargets: %v, %v; want %v", targets, err, want)
	}
	h, err := s.Probe(ctx, "down")
	if want := (sdk.Health{Status: sdk.HealthUnavailable, Detail: "scripted down"}); err != nil || h != want {
		return fmt.Errorf("Probe: %+v, %v; want %+v", h, err, want)
	}
	return nil
}

func restartCalls(ctx context.Context, s *sdktest.Session) error {
	if err := s.Configure(ctx, sdk.Config(`{"prefix":"old-"}`)); err != nil {
		return err
	}
	if err := s.Restart(ctx); err != nil {
		return err
	}
	// A new plugin, configured with Options.Config again.
	events, _, err := s.Execute(ctx, &sdk.Request{Target: "text:1"})
	if err != nil || len(events) == 0 || events[0].Text != "t0" {
		return fmt.Errorf("after Restart, a run streamed %+v (%v); want Options.Config's empty prefix", events, err)
	}
	return nil
}

// A check of an adapter's own, written with the sdk's types only, runs
// through the same plugin path as the kit's, on an adapter value and on
// a binary.
func TestCustomCheckDrivesTheSubjectWithSDKTypes(t *testing.T) {
	o := testadapterOptions()
	o.Credential = &sdk.Credential{Kind: "bearer", Secret: "s3cret"}
	t.Run("in process", func(t *testing.T) {
		sdktest.RunChecks(t, sdktest.Subject{Adapter: func() sdk.Adapter { return testadapter.New() }}, o, everyCall)
	})
	t.Run("binary", func(t *testing.T) {
		sdktest.RunChecks(t, sdktest.Subject{Binary: adapterBin}, o, everyCall)
	})
}

// VerifyChecks reports a custom check's failure with its message.
func TestVerifyChecksReportsACustomCheck(t *testing.T) {
	failing := sdktest.Check{Name: "fails", Doc: "always fails", Run: func(ctx context.Context, s *sdktest.Session) error {
		_, _, err := s.Execute(ctx, &sdk.Request{Target: "fail:unauthenticated"})
		return fmt.Errorf("the run ended with kind %s", sdk.KindOf(err))
	}}
	results := sdktest.VerifyChecks(t.Context(), sdktest.Subject{Adapter: func() sdk.Adapter { return testadapter.New() }},
		testadapterOptions(), failing)
	if len(results) != 1 || results[0].Status != sdktest.Fail || results[0].Message != "the run ended with kind unauthenticated" {
		t.Errorf("results %+v", results)
	}
}
