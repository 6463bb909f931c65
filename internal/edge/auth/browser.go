package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// Access without a key (a trusted network, anonymous access on a loopback listener, open admin
// reads) trusts where a request comes from. A web page the user opens comes from the user's
// machine too, and can send requests to the Edge in two ways:
//
//   - DNS rebinding: the page's own name (attacker.example) is made to resolve to the Edge's
//     address, so the browser treats the Edge as the page's own origin and lets it read the
//     answers. The request's Host is then the page's name, which is how it is told apart: a
//     request without a key must name the Edge by an IP address, localhost (or a name under
//     .localhost, which browsers resolve to loopback themselves), or a name in
//     api.allowed_hosts. (The class of Ollama's CVE-2024-28224.)
//   - Cross-site requests: a page of another site may send GETs, and POSTs of text/plain,
//     form and multipart bodies, without asking (no CORS preflight); it cannot read the answer,
//     but the model runs. Browsers say where such a request comes from (Sec-Fetch-Site, and
//     Origin); a request without a key from another site is refused unless its origin is in
//     api.allowed_origins. A body must also declare JSON (or declare nothing, as some
//     programs do), which no page can send elsewhere without a preflight: a backstop for
//     browsers that send neither header.
//
// A request with a valid key is not checked: a page cannot know a key, and a browser sends an
// Authorization or x-api-key header across sites only after a preflight this Edge answers for
// the listed origins alone.

// Errors Boundary refuses a request without a key with: the first two are 403, the last 415.
var (
	// ErrHostNotAllowed is a Host that is not an IP address, localhost or a name in
	// api.allowed_hosts.
	ErrHostNotAllowed = errors.New("host not allowed without an API key")
	// ErrCrossSite is a request from another site's page (Sec-Fetch-Site cross-site or
	// same-site, or an Origin that is not the request's own) whose origin is not in
	// api.allowed_origins, or a CORS preflight from such an origin.
	ErrCrossSite = errors.New("cross-site request without an API key")
	// ErrContentType is a body whose Content-Type is not JSON (application/json or a +json
	// type).
	ErrContentType = errors.New("request body is not JSON")
)

// Kinds of the refusals Boundary reports (the label of iop_edge_refusals_total).
const (
	RefusedHost        = "browser_host"
	RefusedCrossSite   = "browser_cross_site"
	RefusedContentType = "browser_content_type"
)

// BoundaryOptions say which paths Boundary leaves alone or always checks, and where its
// refusals are reported.
type BoundaryOptions struct {
	// Public are the http.ServeMux patterns ("GET /healthz") of what anyone may fetch from
	// anywhere because it reveals nothing: health, readiness, a static page. Not checked.
	Public []string
	// Reads are the patterns of the reads of the Edge's state that api.admin_reads may open
	// to anyone ("GET /admin/", "GET /metrics"). They do not authenticate when open, so
	// Boundary checks every one without a valid key, open or not: a reload that opens them
	// never finds one unchecked.
	Reads []string
	// Refuse reports a refusal: its kind (RefusedHost...), a message and its details
	// (frontdoor.Refusals.Refuse). Nil reports nothing.
	Refuse func(kind, msg string, args ...any)
}

// Boundary wraps next, the whole HTTP listener, with the checks of requests let in without a
// key (see the comment at the top of this file) and with CORS for the listed origins:
//
//   - A request let in without a key (as a trusted network's principal or as anonymous, or
//     reaching a Reads pattern without a valid key) is refused when its Host is not allowed
//     (ErrHostNotAllowed, 403), when it comes from another site's page whose origin is not
//     listed (ErrCrossSite, 403), or when it has a body whose type is not JSON
//     (ErrContentType, 415). A refusal is answered in the error shape of the API of its path.
//   - A request with a valid key, a Public one, and one that needs a key and has none (the
//     handler answers it 401) go to next unchecked.
//   - A request from an origin in api.allowed_origins gets Access-Control-Allow-Origin (and
//     Vary: Origin), whatever its answer; its preflight is answered here (204). A preflight
//     from any other origin is refused (403), and no other response carries a CORS header.
//
// Each request reads the configuration once; next authenticates it under that same one.
// The patterns must be valid http.ServeMux patterns that do not conflict (Boundary panics
// otherwise, like ServeMux.Handle).
func (a *Authenticator) Boundary(next http.Handler, opts BoundaryOptions) http.Handler {
	refuse := opts.Refuse
	if refuse == nil {
		refuse = func(string, string, ...any) {}
	}
	return &boundary{a: a, next: next, public: newPatterns(opts.Public), reads: newPatterns(opts.Reads), refuse: refuse}
}

type boundary struct {
	a             *Authenticator
	next          http.Handler
	public, reads patterns
	refuse        func(kind, msg string, args ...any)
}

// snapshotKey is the context key of the state a request went through Boundary with.
type snapshotKey struct{ a *Authenticator }

// snapshot is the state r is authenticated under: the one Boundary decided with, else the
// current one.
func (a *Authenticator) snapshot(r *http.Request) *state {
	if st, ok := r.Context().Value(snapshotKey{a}).(*state); ok {
		return st
	}
	return a.state.Load()
}

func (b *boundary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := b.a.state.Load()
	// Whatever authenticates r from here on does so under st, and checks an Ollama key
	// signature once (see verdict).
	r = r.WithContext(context.WithValue(context.WithValue(r.Context(), snapshotKey{b.a}, st), verdictKey{st.sigs}, new(verdict)))
	origin := r.Header.Get("Origin")
	listed := origin != "" && st.origins[strings.ToLower(origin)]
	if listed {
		// Before anything is decided, so that the page can read a refusal's message too.
		w.Header().Set("Access-Control-Allow-Origin", origin)
		w.Header().Add("Vary", "Origin")
	}
	if r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != "" {
		if !listed {
			b.refused(w, r, crossSiteError(origin, r))
			return
		}
		preflight(w, r)
		return
	}
	if !b.public.match(r) && b.keyless(st, r) {
		if err := st.checkBrowser(r); err != nil {
			b.refused(w, r, err)
			return
		}
	}
	b.next.ServeHTTP(w, r)
}

// keyless reports whether r is let in without a valid key: authenticated as a trusted
// network's principal or as anonymous, or a read of the Edge's state without a valid key.
func (b *boundary) keyless(st *state, r *http.Request) bool {
	_, how, err := st.authenticate(r)
	if err != nil {
		return b.reads.match(r)
	}
	return how != viaKey
}

// checkBrowser returns why r, let in without a key, is refused: ErrHostNotAllowed,
// ErrCrossSite or ErrContentType, wrapped with the fix; nil when it is not.
func (st *state) checkBrowser(r *http.Request) error {
	if !st.hostAllowed(r.Host) {
		h := clip(r.Host)
		if name, _, err := net.SplitHostPort(h); err == nil {
			h = name
		}
		return fmt.Errorf("%w: %q is not an IP address, localhost or a name in api.allowed_hosts, and a web page can point its own name at "+
			"this Edge's address (DNS rebinding); add %q to api.allowed_hosts if clients reach the Edge by that name, or send an API key",
			ErrHostNotAllowed, clip(r.Host), h)
	}
	if st.crossSite(r) {
		return crossSiteError(r.Header.Get("Origin"), r)
	}
	if r.ContentLength != 0 && !isJSON(r.Header.Get("Content-Type")) {
		return fmt.Errorf("%w: Content-Type %q, which a page of any site may send without asking; send Content-Type: application/json "+
			"(curl: --json, or -H 'Content-Type: application/json'), or an API key", ErrContentType, clip(r.Header.Get("Content-Type")))
	}
	return nil
}

// hostAllowed reports whether host (a Host header: name or address, and maybe a port) names
// the Edge in a way no web page can choose: an IP address, localhost or a name under
// .localhost (browsers resolve those to loopback themselves), or a name in api.allowed_hosts.
// An empty Host (HTTP/1.0) is allowed: browsers always send one.
func (st *state) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")), ".")
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	return name == "" || name == "localhost" || strings.HasSuffix(name, ".localhost") || st.hosts[name]
}

// crossSite reports whether r comes from a page of another origin whose origin is not listed,
// as Go's http.CrossOriginProtection decides it, for every method: Sec-Fetch-Site when the
// browser sends it (same-origin and none are not cross-site), else an Origin whose host is not
// the request's Host. A request with neither header is not a browser's cross-origin one.
func (st *state) crossSite(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return false
	case "":
		if origin == "" {
			return false
		}
		if u, err := url.Parse(origin); err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return !st.origins[strings.ToLower(origin)]
}

// crossSiteError is ErrCrossSite for a request from origin ("" when the browser said only
// Sec-Fetch-Site).
func crossSiteError(origin string, r *http.Request) error {
	if origin == "" {
		return fmt.Errorf("%w: a page of another site (Sec-Fetch-Site: %s) may not use this Edge; add its origin to api.allowed_origins "+
			"to let that site's pages call it, or send an API key", ErrCrossSite, clip(r.Header.Get("Sec-Fetch-Site")))
	}
	return fmt.Errorf("%w: a page of %s may not use this Edge; add %q to api.allowed_origins to let that site's pages call it, "+
		"or send an API key", ErrCrossSite, clip(origin), clip(origin))
}

// isJSON reports whether a request body of Content-Type ct is declared JSON: application/json
// or a +json type, with any parameters, or no Content-Type at all.
func isJSON(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	typ, sub, ok := strings.Cut(mt, "/")
	return ok && typ != "" && (mt == "application/json" || strings.HasSuffix(sub, "+json"))
}

// The CORS answer of a listed origin's preflight.
const (
	corsMethods = "GET, HEAD, POST"
	// corsHeaders are what the OpenAI, Anthropic and Ollama clients send; a preflight's other
	// requested headers are allowed too, since the origin is trusted by configuration.
	corsHeaders = "Authorization, Content-Type, X-Api-Key, Anthropic-Version, Anthropic-Beta, " +
		"Anthropic-Dangerous-Direct-Browser-Access, OpenAI-Beta, OpenAI-Organization, OpenAI-Project"
	corsMaxAge = "600"
	// maxRequestedHeaders bounds the requested header names a preflight's answer repeats.
	maxRequestedHeaders = 64
)

// preflight answers the CORS preflight of a listed origin (Allow-Origin is set already).
// Credentials (cookies) are not allowed: the Edge uses none, and a key travels in a header.
func preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	allowed := corsHeaders
	known := strings.ToLower(corsHeaders)
	var n int
	for name := range strings.SplitSeq(r.Header.Get("Access-Control-Request-Headers"), ",") {
		name = strings.TrimSpace(name)
		if n++; n > maxRequestedHeaders {
			break
		}
		if isToken(name) && !strings.Contains(known, strings.ToLower(name)) {
			allowed += ", " + name
		}
	}
	h.Set("Access-Control-Allow-Methods", corsMethods)
	h.Set("Access-Control-Allow-Headers", allowed)
	h.Set("Access-Control-Max-Age", corsMaxAge)
	// Chromium asks before a page of a public site reaches a private or loopback address
	// (Private Network Access); the origin is listed, so the answer is yes.
	if r.Header.Get("Access-Control-Request-Private-Network") == "true" {
		h.Set("Access-Control-Allow-Private-Network", "true")
	}
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	w.WriteHeader(http.StatusNoContent)
}

// isToken reports whether s is an HTTP header name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// refused reports err and answers it in the shape of the API of r's path.
func (b *boundary) refused(w http.ResponseWriter, r *http.Request, err error) {
	status, kind, code := http.StatusForbidden, RefusedHost, "host_not_allowed"
	switch {
	case errors.Is(err, ErrCrossSite):
		kind, code = RefusedCrossSite, "cross_site_request"
	case errors.Is(err, ErrContentType):
		status, kind, code = http.StatusUnsupportedMediaType, RefusedContentType, "unsupported_content_type"
	}
	b.refuse(kind, "client request without a key refused", "reason", errors.Unwrap(err).Error(), "method", r.Method, "path", clip(r.URL.Path),
		"host", clip(r.Host), "origin", clip(r.Header.Get("Origin")), "content_type", clip(r.Header.Get("Content-Type")), "remote", r.RemoteAddr)
	writeRefusal(w, r, status, code, err.Error())
}

// writeRefusal writes msg in the error shape of the API r's path belongs to: OpenAI's under
// /v1/, Anthropic's for its Messages API (and its model list, told by anthropic-version), and
// {"error": msg} for Ollama's API, the admin API and /metrics.
func writeRefusal(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	var body any = struct {
		Error string `json:"error"`
	}{msg}
	path := r.URL.Path
	switch {
	case path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/") ||
		((path == "/v1/models" || strings.HasPrefix(path, "/v1/models/")) && r.Header.Get("Anthropic-Version") != ""):
		typ := "permission_error"
		if status != http.StatusForbidden {
			typ = "invalid_request_error"
		}
		type detail struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		body = struct {
			Type  string `json:"type"`
			Error detail `json:"error"`
		}{"error", detail{typ, msg}}
	case strings.HasPrefix(path, "/v1/"):
		type detail struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		}
		body = struct {
			Error detail `json:"error"`
		}{detail{Message: sentence(msg), Type: "invalid_request_error", Code: code}}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// sentence capitalizes m and ends it with a period, as OpenAI writes its messages.
func sentence(m string) string {
	if m == "" {
		return m
	}
	m = strings.ToUpper(m[:1]) + m[1:]
	if !strings.HasSuffix(m, ".") {
		m += "."
	}
	return m
}

// clip bounds what a refusal repeats of a request's header to 200 bytes.
func clip(s string) string {
	const limit = 200
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

// patterns is a set of http.ServeMux patterns, matched as a ServeMux matches them.
type patterns struct{ mux *http.ServeMux }

// matched is the handler of every pattern: a request matches when the mux picks it (not a
// redirect to a cleaned path, a 404 or a 405).
var matched http.Handler = new(matchedHandler)

type matchedHandler struct{}

func (*matchedHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

func newPatterns(ps []string) patterns {
	if len(ps) == 0 {
		return patterns{}
	}
	mux := http.NewServeMux()
	for _, p := range ps {
		mux.Handle(p, matched)
	}
	return patterns{mux}
}

func (p patterns) match(r *http.Request) bool {
	if p.mux == nil {
		return false
	}
	h, _ := p.mux.Handler(r)
	return h == matched
}
