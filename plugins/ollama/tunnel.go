package ollama

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/iop-dev/iop/sdk"
)

// tunnelChunk is the most a tunnel reads from Ollama before passing it on.
// Each read is written (and so flushed) as soon as it returns, whatever its
// size: a streamed line reaches the host when Ollama flushed it.
const tunnelChunk = 32 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, tunnelChunk); return &b }}

// hopByHop are the headers that belong to one connection (RFC 9110 7.6.1)
// and are never relayed, in either direction.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

func isHopByHop(canonical string) bool { return hopByHop[canonical] }

// Tunnel relays one raw HTTP request to Ollama and streams its answer back:
// the status and headers first, then the body read by read, each read
// written to resp at once (no whole-body buffering, so NDJSON lines arrive
// as Ollama flushed them). Ollama's error statuses are relayed like any
// answer; Tunnel fails only when no answer came (the server could not be
// reached: KindUnavailable) or the answer broke off.
//
// Hop-by-hop headers are dropped both ways. The client's own Authorization
// is dropped too (it authenticated the client to the Edge, it is not
// Ollama's); Authorization is sent only from the request's Credential (as
// Bearer) or the configured static headers.
func (a *Adapter) Tunnel(ctx context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	s := a.cfg.Load()
	target, err := tunnelURL(s, req.Path)
	if err != nil {
		return err
	}
	if !validHeaderName(req.Method) || req.Method == http.MethodConnect {
		return sdk.Errorf(sdk.KindInvalidRequest, "ollama tunnel: method %q cannot be relayed", req.Method)
	}
	header := relayHeader(req.Header)
	header.Del("Authorization")
	header.Del("Host")
	header.Del("Content-Length") // written from hreq.ContentLength
	body, length, err := tunnelBody(req)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, req.Method, target, body)
	if err != nil {
		return sdk.Errorf(sdk.KindInvalidRequest, "ollama tunnel: %w", err)
	}
	hreq.ContentLength = length
	if _, ok := header["User-Agent"]; !ok {
		header["User-Agent"] = []string{""} // relay as is: no Go default
	}
	for k, vs := range s.headers {
		header[k] = append([]string(nil), vs...)
	}
	if err := setCredential(header, req.Credential); err != nil {
		return err
	}
	hreq.Header = header

	r, err := a.client.Do(hreq)
	if err != nil {
		var be *bodyError
		if errors.As(err, &be) {
			return fmt.Errorf("ollama tunnel: reading the request body: %w", be.err)
		}
		return sendError(ctx, "tunnel", err)
	}
	defer r.Body.Close()
	if err := resp.WriteHeader(r.StatusCode, relayHeader(r.Header)); err != nil {
		return fmt.Errorf("ollama tunnel: %w", err)
	}
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	for {
		n, rerr := r.Body.Read(buf)
		if n > 0 {
			if _, werr := resp.Write(buf[:n]); werr != nil {
				return fmt.Errorf("ollama tunnel: %w", werr)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return readError(ctx, "tunnel", rerr)
		}
	}
}

// tunnelURL joins the base URL and a relayed path. Only a path (with an
// optional query) is accepted: no scheme, host or ".." segment can steer
// the request away from the configured server.
func tunnelURL(s *settings, p string) (string, error) {
	ref, err := url.Parse(p)
	if err != nil || !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") ||
		ref.Scheme != "" || ref.Host != "" || ref.User != nil {
		return "", sdk.Errorf(sdk.KindInvalidRequest, "ollama tunnel: path must be an absolute path on the server")
	}
	for seg := range strings.SplitSeq(ref.Path, "/") {
		if seg == ".." {
			return "", sdk.Errorf(sdk.KindInvalidRequest, "ollama tunnel: path must not contain \"..\"")
		}
	}
	u := *s.base
	u.Path = s.base.Path + ref.Path
	if ref.RawPath != "" {
		u.RawPath = s.base.EscapedPath() + ref.RawPath
	}
	u.RawQuery = ref.RawQuery
	u.Fragment = ""
	return u.String(), nil
}

// relayHeader copies h without hop-by-hop headers, including those the
// Connection header names.
func relayHeader(h http.Header) http.Header {
	out := make(http.Header, len(h))
	drop := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			drop[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	for k, vs := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if isHopByHop(ck) || drop[ck] {
			continue
		}
		out[ck] = append([]string(nil), vs...)
	}
	return out
}

// tunnelBody decides how the relayed body is sent: with its declared
// Content-Length, not at all for methods without a body (unless the client
// declared one), or streamed with unknown length (chunked).
func tunnelBody(req *sdk.TunnelRequest) (io.Reader, int64, error) {
	cl := req.Header.Get("Content-Length")
	if req.Body == nil {
		return http.NoBody, 0, nil
	}
	if cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return nil, 0, sdk.Errorf(sdk.KindInvalidRequest, "ollama tunnel: bad Content-Length %q", cl)
		}
		if n == 0 {
			return http.NoBody, 0, nil
		}
		return &bodyReader{r: req.Body}, n, nil
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		if req.Header.Get("Transfer-Encoding") == "" {
			return http.NoBody, 0, nil
		}
	}
	return &bodyReader{r: req.Body}, -1, nil
}

// bodyReader marks errors of the relayed request body, so that a failure
// on the host's side is not taken for an unreachable server.
type bodyReader struct{ r io.Reader }

type bodyError struct{ err error }

// Error returns the body's read error.
func (e *bodyError) Error() string { return e.err.Error() }

// Unwrap returns the body's read error.
func (e *bodyError) Unwrap() error { return e.err }

// Read reads the relayed body, marking its errors.
func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = &bodyError{err}
	}
	return n, err
}
