package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/pluginhost"
	"github.com/iop-dev/iop/internal/pluginpb"
	"github.com/iop-dev/iop/sdk"
)

// Checks returns the conformance checks, in the order Run and Verify run
// them.
func Checks() []Check {
	return []Check{
		{"describe", "`describe` prints name, version, capabilities and protocol_version as JSON, and matches what the plugin says", checkDescribe},
		{"strict_config", "Configure refuses an unknown key as invalid_request and takes a valid configuration", checkStrictConfig},
		{"honest_capabilities", "every capability reported works; every other one answers unsupported", checkCapabilities},
		{"ordering", "a run streams events with seq 1, 2, 3, ... and ends in exactly one outcome, with a done reason", checkOrdering},
		{"cancel", "a cancelled run returns within 2s with the context's error and leaves no goroutine behind", checkCancel},
		{"error_mapping", "an unknown target fails as model_not_found; each upstream failure maps to its kind", checkErrorMapping},
		{"tool_choice", "a run whose tool_choice names a tool it does not offer fails as invalid_request: tool_choice is never ignored", checkToolChoice},
		{"complete", "an adapter that reports complete streams a raw completion of a prompt as a run; one that does not is refused as unsupported", checkComplete},
		{"embed", "an adapter that reports embed returns one vector per input, in order, all of one length, and honours dimensions; one that does not is refused as unsupported", checkEmbed},
		{"concurrency", "runs started at once all succeed, each with its own ordered stream", checkConcurrency},
		{"restart", "after Close, a new plugin takes the configuration again and runs", checkRestart},
		{"no_stdout", "the plugin writes nothing to stdout (the plugin handshake owns it)", checkNoStdout},
	}
}

// describeTimeout bounds a `describe` run of a binary: it should answer at
// once.
const describeTimeout = 10 * time.Second

// adapterName is the form of Info.Name (see sdk.Info).
var adapterName = regexp.MustCompile(`^[a-z0-9_-]+$`)

// description is what `describe` prints; pointers tell a missing field
// from an empty one.
type description struct {
	Name            string    `json:"name"`
	Version         string    `json:"version"`
	Capabilities    *[]string `json:"capabilities"`
	ProtocolVersion *int      `json:"protocol_version"`
}

func checkDescribe(ctx context.Context, s *Session) error {
	out, err := describeOutput(ctx, s.subject)
	if err != nil {
		return err
	}
	d, err := parseDescription(out)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	caps, err := s.Capabilities(ctx)
	if err != nil {
		return err
	}
	var problems []string
	if info.Name == "" || info.Version == "" {
		problems = append(problems, fmt.Sprintf("Info() over the plugin protocol has name %q and version %q; want both set", info.Name, info.Version))
	}
	if info.Name != d.Name || info.Version != d.Version {
		problems = append(problems, fmt.Sprintf("describe says %s %s but the plugin says %s %s", d.Name, d.Version, info.Name, info.Version))
	}
	if got, want := sorted(*d.Capabilities), sorted(caps); !slices.Equal(got, want) {
		problems = append(problems, fmt.Sprintf("describe reports capabilities %v but the plugin reports %v", got, want))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	s.Logf("%s %s, capabilities [%s]", d.Name, d.Version, strings.Join(*d.Capabilities, ", "))
	return nil
}

// describeOutput runs the binary's describe mode, or describes the
// in-process adapter as sdk.Serve would.
func describeOutput(ctx context.Context, sub Subject) ([]byte, error) {
	if sub.inProcess() {
		var buf bytes.Buffer
		if err := sdk.Describe(&buf, sub.Adapter()); err != nil {
			return nil, fmt.Errorf("sdk.Describe failed: %w", err)
		}
		return buf.Bytes(), nil
	}
	args := sub.DescribeArgs
	if args == nil {
		args = append(slices.Clone(sub.Args), "describe")
	}
	ctx, cancel := context.WithTimeout(ctx, describeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sub.Binary, args...)
	cmd.WaitDelay = time.Second
	if len(sub.Env) > 0 {
		cmd.Env = append(os.Environ(), sub.Env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	cmdline := strings.TrimSpace(sub.Binary + " " + strings.Join(args, " "))
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("`%s` did not exit within %v; describe must print and exit at once", cmdline, describeTimeout)
	case err != nil:
		return nil, fmt.Errorf("`%s` failed (%v), want exit status 0; stderr: %s", cmdline, err, clip(stderr.Bytes()))
	}
	if d := time.Since(start); d > describeTimeout/2 {
		return nil, fmt.Errorf("`%s` took %v; describe must print and exit at once", cmdline, d.Round(time.Millisecond))
	}
	return stdout.Bytes(), nil
}

// parseDescription checks describe's output: one JSON object with a valid
// name, a version, a list of known capabilities and the host's protocol
// version.
func parseDescription(out []byte) (description, error) {
	var d description
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("describe printed %s, want one JSON object: %v", clip(out), err)
	}
	if rest := bytes.TrimSpace(out[dec.InputOffset():]); len(rest) > 0 {
		return d, fmt.Errorf("describe printed more than one JSON object (then %s); stdout must hold only the description", clip(rest))
	}
	var problems []string
	if !adapterName.MatchString(d.Name) {
		problems = append(problems, fmt.Sprintf("name %q, want lowercase [a-z0-9_-]+", d.Name))
	}
	if d.Version == "" {
		problems = append(problems, "no version")
	}
	if d.Capabilities == nil {
		problems = append(problems, "no capabilities list (want [] when there are none)")
	} else {
		for _, c := range *d.Capabilities {
			if !knownCapability(c) {
				problems = append(problems, fmt.Sprintf("unknown capability %q", c))
			}
		}
	}
	switch {
	case d.ProtocolVersion == nil:
		problems = append(problems, "no protocol_version")
	case *d.ProtocolVersion != pluginpb.ProtocolVersion:
		problems = append(problems, fmt.Sprintf("protocol_version %d, but the host speaks %d", *d.ProtocolVersion, pluginpb.ProtocolVersion))
	}
	if len(problems) > 0 {
		return d, fmt.Errorf("describe output %s: %s", clip(out), strings.Join(problems, "; "))
	}
	return d, nil
}

func checkStrictConfig(ctx context.Context, s *Session) error {
	if _, err := s.running(ctx); err != nil {
		return err
	}
	err := s.Configure(ctx, s.opts.BadConfig)
	switch {
	case err == nil:
		return fmt.Errorf("the adapter accepted Configure(%s); want it refused with kind invalid_request (decode with sdk.DecodeConfig, which rejects unknown keys)", s.opts.BadConfig)
	case !errors.Is(err, sdk.ErrInvalidRequest):
		return fmt.Errorf("the adapter refused Configure(%s) with kind %s (%v); want kind invalid_request", s.opts.BadConfig, sdk.KindOf(err), err)
	}
	s.Logf("refused %s: %v", s.opts.BadConfig, err)
	if err := s.Configure(ctx, s.opts.Config); err != nil {
		return fmt.Errorf("Configure(Options.Config) after a refused configuration failed: %w", err)
	}
	return nil
}

func checkCapabilities(ctx context.Context, s *Session) error {
	caps, err := s.Capabilities(ctx)
	if err != nil {
		return err
	}
	reports := func(c string) bool { return slices.Contains(caps, c) }
	target, err := s.Target(ctx)
	if err != nil {
		return err
	}
	var problems []string
	for _, c := range caps {
		if !knownCapability(c) {
			problems = append(problems, fmt.Sprintf("reports unknown capability %q", c))
		}
	}

	targets, err := s.ListTargets(ctx)
	switch {
	case reports(sdk.CapListTargets) && err != nil:
		problems = append(problems, fmt.Sprintf("reports %s, but ListTargets failed: %v", sdk.CapListTargets, err))
	case reports(sdk.CapListTargets):
		s.Logf("ListTargets: %d target(s)", len(targets))
	case !errors.Is(err, sdk.ErrUnsupported):
		problems = append(problems, fmt.Sprintf("does not report %s, but ListTargets did not fail as unsupported: %v", sdk.CapListTargets, errText(err)))
	}

	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	h, err := s.Probe(pctx, target)
	cancel()
	switch {
	case reports(sdk.CapProbe) && err != nil:
		problems = append(problems, fmt.Sprintf("reports %s, but Probe(%q) failed: %v", sdk.CapProbe, target, err))
	case reports(sdk.CapProbe):
		s.Logf("Probe(%q): %s", target, h.Status)
	case !errors.Is(err, sdk.ErrUnsupported):
		problems = append(problems, fmt.Sprintf("does not report %s, but Probe did not fail as unsupported: %v", sdk.CapProbe, errText(err)))
	}

	if reports(sdk.CapTunnel) {
		if err := s.tunnelOnce(ctx, target); err != nil {
			problems = append(problems, fmt.Sprintf("reports %s, but %v", sdk.CapTunnel, err))
		}
	} else {
		err := s.Tunnel(ctx, s.tunnelRequest(target), &tunnelRecorder{})
		if !errors.Is(err, sdk.ErrUnsupported) {
			problems = append(problems, fmt.Sprintf("does not report %s, but Tunnel did not fail as unsupported: %v", sdk.CapTunnel, errText(err)))
		}
	}
	n, err := s.CountTokens(ctx, &sdk.Request{Target: target, Messages: []sdk.Message{{Role: "user", Content: "How many tokens is this?"}}})
	switch {
	case reports(sdk.CapCountTokens) && errors.Is(err, sdk.ErrUnsupported):
		// The adapter tokenizes through its server, and this one cannot.
		s.Logf("CountTokens: the server cannot tokenize (%v)", err)
	case reports(sdk.CapCountTokens) && err != nil:
		problems = append(problems, fmt.Sprintf("reports %s, but CountTokens failed: %v", sdk.CapCountTokens, err))
	case reports(sdk.CapCountTokens) && n <= 0:
		problems = append(problems, fmt.Sprintf("reports %s, but counted %d tokens in a prompt of five words", sdk.CapCountTokens, n))
	case reports(sdk.CapCountTokens):
		s.Logf("CountTokens: %d", n)
	case !errors.Is(err, sdk.ErrUnsupported):
		problems = append(problems, fmt.Sprintf("does not report %s, but CountTokens did not fail as unsupported: %v", sdk.CapCountTokens, errText(err)))
	}
	route, err := s.TunnelRoute(ctx)
	switch {
	case reports(sdk.CapTunnelRoute) && err != nil:
		problems = append(problems, fmt.Sprintf("reports %s, but TunnelRoute failed: %v", sdk.CapTunnelRoute, err))
	case reports(sdk.CapTunnelRoute):
		if err := s.routeOnce(ctx, target, route); err != nil {
			problems = append(problems, fmt.Sprintf("reports %s, but %v", sdk.CapTunnelRoute, err))
		}
	case !errors.Is(err, sdk.ErrUnsupported):
		problems = append(problems, fmt.Sprintf("does not report %s, but TunnelRoute did not fail as unsupported: %v", sdk.CapTunnelRoute, errText(err)))
	}
	// Close is checked by the restart check, which closes the plugin.
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func (s *Session) tunnelRequest(target string) *sdk.TunnelRequest {
	return &sdk.TunnelRequest{
		TunnelID:  s.newID("tunnel"),
		SessionID: sessionID,
		Target:    target,
		Method:    "GET",
		Path:      s.opts.TunnelPath,
	}
}

// tunnelOnce sends a GET of Options.TunnelPath through the tunnel: any HTTP
// status will do, but the relay must complete with its response head.
// (The plugin host itself refuses a tunnel with no terminal frame or two,
// with a second head, or with body before the head.)
func (s *Session) tunnelOnce(ctx context.Context, target string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := s.tunnelRequest(target)
	resp := &tunnelRecorder{}
	err := s.Tunnel(ctx, req, resp)
	what := "a tunnel GET of " + req.Path
	switch {
	case errors.Is(err, pluginhost.ErrProtocol):
		return fmt.Errorf("%s: %v", what, err)
	case ctx.Err() != nil || errors.Is(err, pluginhost.ErrPluginExited):
		return fmt.Errorf("%s did not end with an outcome: %v", what, err)
	case err != nil:
		return fmt.Errorf("%s failed (kind %s): %v (set Options.TunnelPath to a harmless path the server answers)", what, sdk.KindOf(err), err)
	}
	s.Logf("tunnel GET %s: status %d, %d body frame(s)", req.Path, resp.status, resp.writes)
	return nil
}

// routeOnce sends the GET of tunnelOnce along the adapter's route, as the
// Node does (sdk.RelayTunnel): the server must answer it.
func (s *Session) routeOnce(ctx context.Context, target string, route *sdk.TunnelRoute) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := s.tunnelRequest(target)
	req.Credential = s.opts.Credential
	resp := &tunnelRecorder{}
	client := &http.Client{
		Transport:     &http.Transport{DisableCompression: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer client.CloseIdleConnections()
	if err := sdk.RelayTunnel(ctx, client, route, req, resp); err != nil {
		return fmt.Errorf("a GET of %s along its route (%s) failed (kind %s): %v", req.Path, route.BaseURL, sdk.KindOf(err), err)
	}
	s.Logf("route %s: GET %s: status %d", route.BaseURL, req.Path, resp.status)
	return nil
}

// tunnelRecorder is the TunnelResponse of the kit's tunnels: it keeps the
// status and counts the body's writes.
type tunnelRecorder struct {
	status int
	writes int
}

func (r *tunnelRecorder) WriteHeader(status int, _ http.Header) error {
	r.status = status
	return nil
}

func (r *tunnelRecorder) Write(p []byte) (int, error) {
	r.writes++
	return len(p), nil
}

func knownCapability(c string) bool {
	switch c {
	case sdk.CapListTargets, sdk.CapTunnel, sdk.CapProbe, sdk.CapClose, sdk.CapComplete, sdk.CapEmbed, sdk.CapTunnelRoute, sdk.CapCountTokens:
		return true
	}
	return false
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// errText describes the outcome of a call that should have failed.
func errText(err error) string {
	if err == nil {
		return "it succeeded"
	}
	return fmt.Sprintf("kind %s: %v", sdk.KindOf(err), err)
}

// clip quotes b for a message, cut short.
func clip(b []byte) string {
	const limit = 300
	if len(b) > limit {
		return fmt.Sprintf("%q…", b[:limit])
	}
	return fmt.Sprintf("%q", b)
}
