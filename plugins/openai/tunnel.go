package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/iop-dev/iop/sdk"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1, never relayed.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// dropHopHeaders removes the hop-by-hop headers of h, including those the
// Connection header names.
func dropHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// tunnelBuffer is the read size of the relay; every read is passed on (and
// so flushed by the host) at once, whatever its size.
const tunnelBuffer = 32 << 10

// Tunnel relays req to the server: its Path (path and query) is appended
// to base_url, so with base_url http://h:8000/v1 the path /chat/completions
// reaches http://h:8000/v1/chat/completions. Hop-by-hop headers are dropped
// both ways. The caller's Authorization is never forwarded (it is the
// client's key to the Edge, not the server's): the bearer key comes only
// from req.Credential. The answer is streamed to resp as the server sends
// it; a non-2xx status is relayed, not an error. The returned error says
// the relay itself failed: the server was unreachable, the connection broke
// mid-body, or the host went away.
func (a *Adapter) Tunnel(ctx context.Context, req *sdk.TunnelRequest, resp sdk.TunnelResponse) error {
	c, err := a.config()
	if err != nil {
		return err
	}
	if !strings.HasPrefix(req.Path, "/") || strings.HasPrefix(req.Path, "//") {
		return sdk.Errorf(sdk.KindInvalidRequest, "openai: tunnel path %q must start with a single /", req.Path)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hreq, err := c.newRequest(ctx, req.Method, req.Path, req.Credential)
	if err != nil {
		return err
	}
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	dropHopHeaders(header)
	header.Del("Authorization")
	header.Del("Host")
	header.Del("Content-Length")
	for k, v := range hreq.Header { // configured headers and the credential win
		header[k] = v
	}
	hreq.Header = header
	if err := setTunnelBody(hreq, req); err != nil {
		return err
	}

	hresp, err := a.client.Do(hreq)
	if err != nil {
		return transportError(ctx, err)
	}
	defer hresp.Body.Close()
	rh := hresp.Header.Clone()
	dropHopHeaders(rh)
	if err := resp.WriteHeader(hresp.StatusCode, rh); err != nil {
		return err
	}
	buf := make([]byte, tunnelBuffer)
	for {
		n, rerr := hresp.Body.Read(buf)
		if n > 0 {
			if _, werr := resp.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return readError(ctx, rerr)
		}
	}
}

// setTunnelBody attaches the streamed body. With a Content-Length from the
// caller it is kept; without one, an empty body is sent as none (so a GET
// does not turn into a chunked upload) and any other as chunked.
func setTunnelBody(hreq *http.Request, req *sdk.TunnelRequest) error {
	if req.Body == nil {
		hreq.Body = http.NoBody
		return nil
	}
	if cl := req.Header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return sdk.Errorf(sdk.KindInvalidRequest, "openai: tunnel Content-Length %q is not a length", cl)
		}
		hreq.ContentLength = n
		if n == 0 {
			hreq.Body = http.NoBody
			return nil
		}
		hreq.Body = io.NopCloser(req.Body)
		return nil
	}
	br := bufio.NewReader(req.Body)
	if _, err := br.Peek(1); err != nil {
		if errors.Is(err, io.EOF) {
			hreq.Body = http.NoBody
			return nil
		}
		return fmt.Errorf("openai: reading the tunnel body: %w", err)
	}
	hreq.Body = io.NopCloser(br)
	hreq.ContentLength = -1
	return nil
}
