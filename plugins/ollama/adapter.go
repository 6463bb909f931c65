// Package ollama is the IOP adapter for Ollama. It runs normalized runs
// through Ollama's streaming /api/chat and raw completions through its
// /api/generate (generate.go), computes embeddings with /api/embed, lists
// the server's models (/api/tags), probes one exact model (listed and
// answering), and relays Ollama's own HTTP API raw for the tunnel.
//
// How a run's options, reasoning effort and the client's other fields
// reach Ollama is told in options.go; how a forced tool call, which Ollama
// cannot force, is made with a schema-constrained answer, in forced.go;
// how a system message inside the conversation, which most models'
// templates move to the top, drop or refuse, is folded into a user turn
// where it stands, in systemturns.go.
//
// The adapter owns no timers: the Node's stall watchdog and the run's hard
// deadline reach it through ctx, and every upstream request is bound to its
// ctx, so cancelling a run closes its HTTP request at once. It logs nothing,
// so no prompt, output or credential can leak through it.
package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/iop-dev/iop/sdk"
)

// Version is the adapter's own version.
const Version = "0.1.0"

// DefaultBaseURL is where Ollama listens unless configured otherwise.
const DefaultBaseURL = "http://127.0.0.1:11434"

// Interface guards: the capabilities the adapter reports are the ones it
// implements.
var (
	_ sdk.Adapter      = (*Adapter)(nil)
	_ sdk.TargetLister = (*Adapter)(nil)
	_ sdk.Prober       = (*Adapter)(nil)
	_ sdk.Tunneler     = (*Adapter)(nil)
	_ sdk.Closer       = (*Adapter)(nil)
	_ sdk.Completer    = (*Adapter)(nil)
	_ sdk.Embedder     = (*Adapter)(nil)
)

// Config is the adapter's configuration, decoded strictly.
type Config struct {
	// BaseURL is Ollama's address (default DefaultBaseURL). A path prefix
	// is kept, for an Ollama behind a reverse proxy.
	BaseURL string `json:"base_url"`
	// KeepAlive is sent as keep_alive on runs and probes: a duration ("5m",
	// "-1s") or a number of seconds ("300", "-1" for forever). Empty leaves
	// Ollama's default, or a run's own keep_alive (from Options.Extra);
	// set, it wins over a run's: the operator owns the server's memory.
	KeepAlive string `json:"keep_alive"`
	// Headers are added to every upstream request (e.g. for a proxy in
	// front of Ollama). A run's credential, when given, sets Authorization
	// over them.
	Headers map[string]string `json:"headers"`
	// SystemTurns is what becomes of a system message inside the
	// conversation (after its first message that is not one): "fold" (the
	// default) folds it into a user turn at its place and joins the
	// leading ones, which most models' templates would move to the top,
	// drop or refuse; "keep" sends them as they are (systemturns.go).
	SystemTurns string `json:"system_turns"`
}

// settings is a validated Config, swapped whole by Configure.
type settings struct {
	base        *url.URL
	keepAlive   json.RawMessage // nil: not sent
	headers     http.Header
	systemTurns systemTurns
}

// Adapter talks to one Ollama server. It is safe for concurrent use.
type Adapter struct {
	cfg       atomic.Pointer[settings]
	transport *http.Transport
	client    *http.Client
}

// New returns an adapter for Ollama at DefaultBaseURL, until Configure says
// otherwise.
func New() *Adapter {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// The tunnel relays bodies byte for byte: no transparent gzip.
	t.DisableCompression = true
	// Runs are concurrent up to the provider's capacity; keep their
	// connections warm rather than dialling per run.
	t.MaxIdleConnsPerHost = 128
	// Each run holds a connection with both buffers for as long as it
	// runs: sized for a request head and an answer's line, not throughput
	// (a larger read or write goes past the buffer).
	t.ReadBufferSize, t.WriteBufferSize = 1<<10, 1<<10
	a := &Adapter{
		transport: t,
		// No Timeout: a prefill may last minutes, and the Node's watchdog,
		// not the adapter, decides when a silent provider has stalled.
		client: &http.Client{
			Transport: t,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
	}
	s, err := parseConfig(Config{})
	if err != nil {
		panic(err) // the defaults are valid
	}
	a.cfg.Store(s)
	return a
}

// Info describes the adapter.
func (a *Adapter) Info() sdk.Info {
	return sdk.Info{
		Name:        "ollama",
		Version:     Version,
		Description: "Ollama: streaming /api/chat runs (forced tool calls by a schema-constrained answer), raw completions (/api/generate, with suffix), embeddings (/api/embed), model listing, exact-model probe, raw API tunnel",
		ConfigFields: map[string]string{
			"base_url":   "Ollama's base URL (default " + DefaultBaseURL + ")",
			"keep_alive": `optional keep_alive sent to Ollama: a duration ("5m") or seconds ("-1" keeps the model loaded)`,
			"headers":    "optional static headers added to every upstream request",
			"system_turns": `optional: "fold" (default) sends a system message that comes after the conversation's start as text of a user turn at its place ` +
				`(in <system-reminder> tags) and joins the leading ones into one, where most models' templates would move it to the top, drop or refuse it; "keep" sends them as they are`,
		},
	}
}

// Configure validates and applies the provider's configuration. Unknown keys
// are rejected.
func (a *Adapter) Configure(_ context.Context, cfg sdk.Config) error {
	var c Config
	if err := sdk.DecodeConfig(cfg, &c); err != nil {
		return err
	}
	s, err := parseConfig(c)
	if err != nil {
		return err
	}
	a.cfg.Store(s)
	return nil
}

// Close releases idle upstream connections.
func (a *Adapter) Close(context.Context) error {
	a.transport.CloseIdleConnections()
	return nil
}

func parseConfig(c Config) (*settings, error) {
	raw := c.BaseURL
	if raw == "" {
		raw = DefaultBaseURL
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		return nil, sdk.Errorf(sdk.KindInvalidRequest,
			"config: base_url %q: want http(s)://host[:port][/prefix], without credentials or query", raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	s := &settings{base: u, headers: http.Header{}}
	if s.systemTurns, err = parseSystemTurns(c.SystemTurns); err != nil {
		return nil, err
	}

	if c.KeepAlive != "" {
		if s.keepAlive, err = keepAliveJSON(c.KeepAlive); err != nil {
			return nil, err
		}
	}
	for k, v := range c.Headers {
		if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers: invalid header %q", k)
		}
		if isHopByHop(textproto.CanonicalMIMEHeaderKey(k)) || strings.EqualFold(k, "Host") || strings.EqualFold(k, "Content-Length") {
			return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: headers: %q is managed by the adapter", k)
		}
		s.headers.Set(k, v)
	}
	return s, nil
}

// keepAliveJSON encodes a configured keep_alive the way Ollama reads it: a
// duration string stays a string, a number of seconds becomes a number
// (Ollama does not accept "-1" as a string).
func keepAliveJSON(v string) (json.RawMessage, error) {
	if _, err := time.ParseDuration(v); err == nil {
		b, _ := json.Marshal(v)
		return b, nil
	}
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return json.RawMessage(strconv.FormatFloat(n, 'f', -1, 64)), nil
	}
	return nil, sdk.Errorf(sdk.KindInvalidRequest, "config: keep_alive %q: want a duration such as \"5m\" or a number of seconds", v)
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if c > 0x7e || c <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

// endpoint is base URL + path (which starts with "/").
func (s *settings) endpoint(path string) string {
	u := *s.base
	u.Path += path
	return u.String()
}

// newRequest builds an upstream request bound to ctx with the configured
// headers and, when given, the run's credential.
func (a *Adapter) newRequest(ctx context.Context, s *settings, method, path string, body []byte, cred *sdk.Credential) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.endpoint(path), rd)
	if err != nil {
		return nil, sdk.Errorf(sdk.KindInternal, "ollama: build request: %w", err)
	}
	for k, vs := range s.headers {
		req.Header[k] = append([]string(nil), vs...)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if err := setCredential(req.Header, cred); err != nil {
		return nil, err
	}
	return req, nil
}

// setCredential presents cred as Authorization: Bearer. Without one, the
// header is left as it is: the adapter never invents a credential.
func setCredential(h http.Header, cred *sdk.Credential) error {
	if cred == nil || cred.Secret == "" {
		return nil
	}
	if cred.Kind != "" && !strings.EqualFold(cred.Kind, "bearer") {
		return sdk.Errorf(sdk.KindInvalidRequest, "ollama: credential kind %q is not supported (only bearer)", cred.Kind)
	}
	h.Set("Authorization", "Bearer "+cred.Secret)
	return nil
}
