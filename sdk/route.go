package sdk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// TunnelRouter is implemented by adapters whose server the Node can reach
// itself for a raw tunnel. The adapter still decides how its server is
// reached (the base URL, the headers it adds, how a lent credential is
// presented); the Node then sends each relayed request and moves the bytes
// with RelayTunnel, so the answer's body does not cross the plugin
// boundary chunk by chunk. The Node asks for the route after every
// Configure. An adapter that is also a Tunneler keeps serving hosts that
// do not know routes.
type TunnelRouter interface {
	// TunnelRoute says how to reach the server as configured now.
	TunnelRoute(ctx context.Context) (*TunnelRoute, error)
}

// TunnelRoute is how a raw tunnel reaches an adapter's server.
type TunnelRoute struct {
	// BaseURL is the server's base URL, http or https. A relayed path (and
	// query) is appended to its path: with http://h:8000/v1, the path
	// /chat/completions reaches http://h:8000/v1/chat/completions.
	BaseURL string
	// Header is set on every relayed request, over the client's own
	// values: the adapter's configured static headers.
	Header http.Header
	// Bearer presents a lent credential as "Authorization: Bearer SECRET"
	// (its kind must be "" or "bearer"). Without it a lent credential is
	// refused: the server would not see it.
	Bearer bool
	// Loaded says how the Node learns what the server holds loaded, so
	// that the Edge can send a request where its model is already in
	// memory (issue 23). The Node reads it through this route itself,
	// without the plugin: a parked plugin process stays parked.
	Loaded LoadedReport
}

// LoadedReport is how a server tells which of its models it holds loaded.
type LoadedReport string

// The ways a server reports what it holds loaded.
const (
	// LoadedUnknown: it does not say; the Edge routes without knowing.
	LoadedUnknown LoadedReport = ""
	// LoadedOllamaPS: Ollama's GET /api/ps on the route lists the loaded
	// models with their sizes and expiry.
	LoadedOllamaPS LoadedReport = "ollama_ps"
	// LoadedAll: the server keeps every model it serves loaded (an
	// OpenAI-compatible server started with its models, such as vLLM or
	// llama.cpp's server).
	LoadedAll LoadedReport = "all"
)

// Validate reports whether the route can be used: an absolute http or
// https base URL without user info, query or fragment, and header names
// and values that HTTP can carry.
func (r *TunnelRoute) Validate() error {
	if r == nil {
		return errors.New("no route")
	}
	u, err := url.Parse(r.BaseURL)
	switch {
	case err != nil:
		return fmt.Errorf("base URL %q: %w", r.BaseURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("base URL %q: the scheme must be http or https", r.BaseURL)
	case u.Host == "":
		return fmt.Errorf("base URL %q has no host", r.BaseURL)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("base URL %q: no user info, query or fragment", r.BaseURL)
	}
	for k, vs := range r.Header {
		if !validHeaderName(k) {
			return fmt.Errorf("header name %q is not a valid HTTP header name", k)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("header %s has a value HTTP cannot carry", k)
			}
		}
	}
	return nil
}

// tunnelRead is the most RelayTunnel reads from the server before passing
// it on. Each read is written (and so flushed) as soon as it returns,
// whatever its size: a streamed line goes on when the server flushed it,
// and lines that arrived together go on together.
const tunnelRead = 32 << 10

// tunnelReadFirst is the buffer a relay starts with. A streamed answer's
// reads are a line or a few (a token's line is about 150 bytes), so most
// relays never need more; a read that fills it (a server that sends faster
// than the relay writes, a large answer) moves the relay to tunnelRead.
// Thousands of answers relayed at once each hold one (issue 25).
const tunnelReadFirst = 4 << 10

var (
	tunnelBufs      = sync.Pool{New: func() any { b := make([]byte, tunnelRead); return &b }}
	tunnelFirstBufs = sync.Pool{New: func() any { b := make([]byte, tunnelReadFirst); return &b }}
)

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1)
// and are never relayed, in either direction.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// RelayTunnel sends req to the server of route with client and streams its
// answer to resp: the status and headers first, then the body read by
// read, each read written to resp at once (nothing waits to fill a
// buffer). It is the one raw relay: the Node runs it for adapters that
// give a route, and an adapter's own Tunnel may call it too.
//
// The server's error statuses are relayed like any answer. RelayTunnel
// fails only when no answer came (the server could not be reached:
// KindUnavailable, retryable), the answer broke off (KindUnavailable, not
// retryable: part of it may have been used), the request cannot be
// relayed (KindInvalidRequest), or ctx ended (its error).
//
// Hop-by-hop headers are dropped both ways. The client's Authorization is
// dropped too (it authenticated the client to the Edge); the server's comes
// only from the route (Header, Bearer). The relayed path must be an
// absolute path on the server: no scheme, host or ".." segment can steer
// the request elsewhere. client must not follow redirects (they are the
// client's to follow) and should not decompress (DisableCompression): the
// body is relayed byte for byte.
func RelayTunnel(ctx context.Context, client *http.Client, route *TunnelRoute, req *TunnelRequest, resp TunnelResponse) error {
	return relayTunnel(ctx, client.Do, route, req, resp)
}

// RelayTunnelTransport is RelayTunnel over a RoundTripper called directly,
// as a relay wants it: no redirect is followed (a 3xx is relayed to the
// client as it is), and no client timeout or cookie jar applies. A call
// that waits for its answer, as through a long silent prefill, holds a
// stack shallower by net/http.Client's frames (about 1 KiB), which lets
// the runtime shrink it to 8 KiB while it waits (issue 25: the Node's
// cost per waiting run).
func RelayTunnelTransport(ctx context.Context, rt http.RoundTripper, route *TunnelRoute, req *TunnelRequest, resp TunnelResponse) error {
	return relayTunnel(ctx, rt.RoundTrip, route, req, resp)
}

func relayTunnel(ctx context.Context, do func(*http.Request) (*http.Response, error), route *TunnelRoute, req *TunnelRequest, resp TunnelResponse) error {
	hreq, err := tunnelHTTPRequest(ctx, route, req)
	if err != nil {
		return err
	}
	r, err := do(hreq)
	if err != nil {
		if be := (*relayBodyError)(nil); errors.As(err, &be) {
			return fmt.Errorf("tunnel: reading the request body: %w", be.err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("tunnel: %w", ctx.Err())
		}
		return &Error{Kind: KindUnavailable, Retryable: true, Err: err, Message: "tunnel: server unreachable: " + describeNetError(err)}
	}
	defer r.Body.Close()
	if err := resp.WriteHeader(r.StatusCode, relayHeader(r.Header)); err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	bp, pool := tunnelFirstBufs.Get().(*[]byte), &tunnelFirstBufs
	defer func() { pool.Put(bp) }()
	for {
		buf := *bp
		n, rerr := r.Body.Read(buf)
		if n > 0 {
			if _, werr := resp.Write(buf[:n]); werr != nil {
				return fmt.Errorf("tunnel: %w", werr)
			}
		}
		if n == len(buf) && pool == &tunnelFirstBufs { // more was ready: read more at once
			pool.Put(bp)
			bp, pool = tunnelBufs.Get().(*[]byte), &tunnelBufs
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("tunnel: %w", ctx.Err())
			}
			return &Error{Kind: KindUnavailable, Err: rerr, Message: "tunnel: connection lost mid-answer: " + describeNetError(rerr)}
		}
	}
}

// tunnelHTTPRequest is the request RelayTunnel sends for req.
func tunnelHTTPRequest(ctx context.Context, route *TunnelRoute, req *TunnelRequest) (*http.Request, error) {
	if err := route.Validate(); err != nil {
		return nil, &Error{Kind: KindInternal, Message: "tunnel: the adapter's route: " + err.Error()}
	}
	target, err := routeURL(route.BaseURL, req.Path)
	if err != nil {
		return nil, err
	}
	if !validHeaderName(req.Method) || req.Method == http.MethodConnect {
		return nil, Errorf(KindInvalidRequest, "tunnel: method %q cannot be relayed", req.Method)
	}
	header := relayHeader(req.Header)
	header.Del("Authorization")
	header.Del("Host")
	header.Del("Content-Length") // written from ContentLength
	body, length, err := relayBody(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, req.Method, target, body)
	if err != nil {
		return nil, Errorf(KindInvalidRequest, "tunnel: %w", err)
	}
	hreq.ContentLength = length
	if _, ok := header["User-Agent"]; !ok {
		header["User-Agent"] = []string{""} // relay as is: no Go default
	}
	for k, vs := range route.Header {
		header[textproto.CanonicalMIMEHeaderKey(k)] = append([]string(nil), vs...)
	}
	if c := req.Credential; c != nil && c.Secret != "" {
		switch {
		case !route.Bearer:
			return nil, Errorf(KindInvalidRequest, "tunnel: the adapter presents no credential, and one was lent")
		case c.Kind != "" && !strings.EqualFold(c.Kind, "bearer"):
			return nil, Errorf(KindInvalidRequest, "tunnel: credential kind %q is not supported (only bearer)", c.Kind)
		case strings.ContainsAny(c.Secret, "\r\n\x00"):
			return nil, Errorf(KindInvalidRequest, "tunnel: the credential is malformed")
		}
		header.Set("Authorization", "Bearer "+c.Secret)
	}
	hreq.Header = header
	return hreq, nil
}

// routeURL joins the base URL and a relayed path. Only a path (with an
// optional query) is accepted: no scheme, host or ".." segment can steer
// the request away from the server.
func routeURL(baseURL, p string) (string, error) {
	base, err := url.Parse(baseURL)
	if err != nil {
		return "", &Error{Kind: KindInternal, Message: "tunnel: the adapter's base URL: " + err.Error()}
	}
	ref, err := url.Parse(p)
	if err != nil || !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") ||
		ref.Scheme != "" || ref.Host != "" || ref.User != nil {
		return "", Errorf(KindInvalidRequest, "tunnel: path must be an absolute path on the server")
	}
	for seg := range strings.SplitSeq(ref.Path, "/") {
		if seg == ".." {
			return "", Errorf(KindInvalidRequest, "tunnel: path must not contain \"..\"")
		}
	}
	basePath := strings.TrimSuffix(base.Path, "/")
	u := *base
	u.Path = basePath + ref.Path
	if ref.RawPath != "" {
		u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + ref.RawPath
	}
	u.RawQuery = ref.RawQuery
	u.Fragment = ""
	return u.String(), nil
}

// relayHeader copies h without hop-by-hop headers, including those the
// Connection header names.
func relayHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	var drop map[string]bool
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if drop == nil {
				drop = map[string]bool{}
			}
			drop[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	for k, vs := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if hopByHop[ck] || drop[ck] {
			continue
		}
		out[ck] = append([]string(nil), vs...)
	}
	return out
}

// relayBody decides how the relayed body is sent: with its declared
// Content-Length; as none when it turns out empty (a GET does not become a
// chunked upload); otherwise streamed with unknown length (chunked).
func relayBody(req *TunnelRequest) (io.Reader, int64, error) {
	if req.Body == nil {
		return http.NoBody, 0, nil
	}
	if cl := req.Header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return nil, 0, Errorf(KindInvalidRequest, "tunnel: bad Content-Length %q", cl)
		}
		if n == 0 {
			return http.NoBody, 0, nil
		}
		// The body is its Content-Length: the request is written whole
		// once that much has been read, without waiting for the body's
		// end to prove nothing follows (the Node's body ends with the
		// stream's FIN, which may cross in a packet of its own). A shorter
		// body still fails the request; a longer one is cut where its
		// length says, as an HTTP intermediary forwards it.
		return &relayBodyReader{r: io.LimitReader(req.Body, n)}, n, nil
	}
	br := bufio.NewReader(req.Body)
	if _, err := br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			return http.NoBody, 0, nil
		}
		return nil, 0, fmt.Errorf("tunnel: reading the request body: %w", err)
	}
	return &relayBodyReader{r: br}, -1, nil
}

// relayBodyReader marks errors of the relayed request body, so that a
// failure on the host's side is not taken for an unreachable server.
type relayBodyReader struct{ r io.Reader }

type relayBodyError struct{ err error }

// Error returns the body's read error.
func (e *relayBodyError) Error() string { return e.err.Error() }

// Unwrap returns the body's read error.
func (e *relayBodyError) Unwrap() error { return e.err }

// Read reads the relayed body, marking its errors.
func (b *relayBodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &relayBodyError{err}
	}
	return n, err
}

// describeNetError names a network failure without echoing the URL, which
// may carry more than the host.
func describeNetError(err error) string {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.As(err, &dnsErr):
		return "cannot resolve " + dnsErr.Name
	case errors.As(err, &opErr) && opErr.Timeout():
		return "timed out"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
