// Package openai is the adapter for OpenAI-compatible model servers: vLLM,
// llama.cpp's server, LM Studio, hosted APIs.
//
// Normalized runs go through streaming chat completions (POST
// {base_url}/chat/completions with stream and stream_options.include_usage),
// parsed incrementally from server-sent events into text, reasoning,
// tool-call and usage events; raw completions through streaming text
// completions ({base_url}/completions, with suffix), read the same way;
// embeddings through {base_url}/embeddings (complete.go). The raw tunnel relays any request to base_url;
// the probe and the target list read {base_url}/models. Token counts use
// the server's own tokenizer, vLLM's or llama.cpp's, at the server's root
// (tokenize.go). A system message inside the conversation, which strict
// chat templates refuse, is folded into a user turn at its place unless
// configured otherwise (systemturns.go).
//
// Credentials never rest on the Node: the key is presented only when a run
// or tunnel carries one (Request.Credential), as `Authorization: Bearer`,
// and configuration may not name an Authorization header. Nothing here logs
// prompts, outputs or credentials.
package openai

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// Version is the adapter's version, reported in its Info.
const Version = "0.1.0"

// Adapter talks to one OpenAI-compatible server. Create it with New; it is
// safe for concurrent runs once configured.
type Adapter struct {
	cfg    atomic.Pointer[config]
	client *http.Client
}

var (
	_ sdk.Adapter      = (*Adapter)(nil)
	_ sdk.TargetLister = (*Adapter)(nil)
	_ sdk.Tunneler     = (*Adapter)(nil)
	_ sdk.Prober       = (*Adapter)(nil)
	_ sdk.Closer       = (*Adapter)(nil)
	_ sdk.Completer    = (*Adapter)(nil)
	_ sdk.Embedder     = (*Adapter)(nil)
	_ sdk.TunnelRouter = (*Adapter)(nil)
	_ sdk.TokenCounter = (*Adapter)(nil)
)

// Config is the adapter's configuration, decoded strictly from the
// provider's `config` map.
type Config struct {
	// BaseURL is the server's OpenAI API root, including its version
	// path, e.g. "http://127.0.0.1:8000/v1". Required.
	BaseURL string `json:"base_url"`
	// Headers are sent with every request (e.g. an organization or a
	// routing header). They may not carry credentials: Authorization is
	// refused here and comes only from a run's credential.
	Headers map[string]string `json:"headers,omitempty"`
	// SystemTurns is what becomes of a system message inside the
	// conversation (after its first message that is not one): "fold" (the
	// default) folds it into a user turn at its place and joins the
	// leading ones, as strict chat templates need; "keep" sends them as
	// they are (systemturns.go).
	SystemTurns string `json:"system_turns,omitempty"`
}

// config is a validated Config, and what the adapter learns of its server.
type config struct {
	base        *url.URL
	headers     http.Header
	systemTurns systemTurns
	// tokenizer is how the server counts tokens (a tokenizer), learnt
	// from its first count and kept until the next Configure.
	tokenizer atomic.Int32
}

// New returns an unconfigured adapter.
func New() *Adapter {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// A relay passes the client's own Accept-Encoding and the server's
	// encoded body through untouched; the transport must not add its own.
	t.DisableCompression = true
	// No timeouts here: a long prompt prefill may keep a healthy server
	// silent for minutes (R8). The run's context and the Node's stall
	// watchdog bound every call.
	return &Adapter{client: &http.Client{Transport: t}}
}

// Info describes the adapter.
func (a *Adapter) Info() sdk.Info {
	return sdk.Info{
		Name:        "openai",
		Version:     Version,
		Description: "OpenAI-compatible servers (vLLM, llama.cpp server, LM Studio, hosted APIs) via streaming chat completions, text completions (with suffix) and embeddings; token counts through vLLM's or llama.cpp's /tokenize",
		ConfigFields: map[string]string{
			"base_url": "required: the server's OpenAI API root including the version path, e.g. http://127.0.0.1:8000/v1",
			"headers":  "optional: extra HTTP headers for every request (no Authorization: credentials come from the run's lease)",
			"system_turns": `optional: "fold" (default) sends a system message that comes after the conversation's start as text of a user turn at its place ` +
				`(in <system-reminder> tags) and joins the leading ones into one, which strict chat templates (Qwen's, Gemma's) need; "keep" sends them as they are`,
		},
	}
}

// Configure validates and installs cfg.
func (a *Adapter) Configure(_ context.Context, raw sdk.Config) error {
	var c Config
	if err := sdk.DecodeConfig(raw, &c); err != nil {
		return err
	}
	parsed, err := c.validate()
	if err != nil {
		return err
	}
	a.cfg.Store(parsed)
	return nil
}

func (c Config) validate() (*config, error) {
	if c.BaseURL == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: base_url is required")
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: base_url %q is not an absolute http(s) URL", c.BaseURL)
	}
	if u.User != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: base_url may not carry user information (credentials come from the run's lease)")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: base_url may not have a query or fragment")
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	h := http.Header{}
	for k, v := range c.Headers {
		if !validHeaderName(k) {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers.%s: not a valid header name", k)
		}
		switch http.CanonicalHeaderKey(k) {
		case "Authorization", "Proxy-Authorization":
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers.%s: credentials may not rest in the Node's config; they come from the run's lease", k)
		case "Host", "Content-Length", "Content-Type", "Connection", "Transfer-Encoding":
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers.%s: set by the adapter", k)
		}
		if strings.ContainsAny(v, "\r\n") {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers.%s: value contains a line break", k)
		}
		h.Set(k, v)
	}
	turns, err := parseSystemTurns(c.SystemTurns)
	if err != nil {
		return nil, err
	}
	return &config{base: u, headers: h, systemTurns: turns}, nil
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

func (a *Adapter) config() (*config, error) {
	c := a.cfg.Load()
	if c == nil {
		return nil, sdk.Errorf(sdk.KindInternal, "openai: not configured")
	}
	return c, nil
}

// endpoint returns base_url joined with path (which starts with "/" and
// may carry a query).
func (c *config) endpoint(path string) string {
	return c.base.String() + path
}

// rootEndpoint returns the server's root (base_url without a trailing
// version path "/v1") joined with path: where vLLM and llama.cpp's server
// serve their own endpoints, such as /tokenize, beside the OpenAI API.
func (c *config) rootEndpoint(path string) string {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/v1")
	return u.String() + path
}

// newRequest builds a request to path under base_url with the configured
// headers and, when cred is given, its bearer key.
func (c *config) newRequest(ctx context.Context, method, path string, cred *sdk.Credential) (*http.Request, error) {
	return c.newRequestTo(ctx, method, c.endpoint(path), cred)
}

// newRequestTo is newRequest for an absolute URL on the server.
func (c *config) newRequestTo(ctx context.Context, method, url string, cred *sdk.Credential) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInvalidRequest, "openai: bad request path: %w", err)
	}
	for k, v := range c.headers {
		req.Header[k] = append([]string(nil), v...)
	}
	if err := setCredential(req.Header, cred); err != nil {
		return nil, err
	}
	return req, nil
}

// setCredential presents cred as a bearer key. The secret never appears in
// an error.
func setCredential(h http.Header, cred *sdk.Credential) error {
	if cred == nil {
		return nil
	}
	if cred.Kind != "" && cred.Kind != "bearer" {
		return sdk.Errorf(sdk.KindInvalidRequest, "openai: credential kind %q is not supported (only bearer)", cred.Kind)
	}
	if cred.Secret == "" || strings.ContainsAny(cred.Secret, "\r\n") {
		return sdk.Errorf(sdk.KindInvalidRequest, "openai: the credential is empty or malformed")
	}
	h.Set("Authorization", "Bearer "+cred.Secret)
	return nil
}

// transportError classifies a failure to get a response. The run's own
// cancellation is returned as the context's error; anything else means the
// server could not be reached.
func transportError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("openai: %w", ctxErr)
	}
	return &sdk.Error{Kind: sdk.KindUnavailable, Message: "openai: server unreachable: " + describeNetError(err), Retryable: true, Err: err}
}

// describeNetError names a network failure without echoing URLs that might
// carry more than the host.
func describeNetError(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "cannot resolve " + dnsErr.Name
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr.Op + ": " + opErr.Err.Error()
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return urlErr.Err.Error()
	}
	return err.Error()
}

// Close releases idle connections.
func (a *Adapter) Close(context.Context) error {
	a.client.CloseIdleConnections()
	return nil
}

// probeTimeout bounds a probe when the caller's context has no deadline.
const probeTimeout = 10 * time.Second
