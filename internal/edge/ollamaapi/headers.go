package ollamaapi

import (
	"mime"
	"net/textproto"
	"strings"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The raw tunnel passes an Ollama server's content, not its policy (issue
// 24 gap 8). The answer reaches the client on the Edge's origin, so
// whatever header the server sets would be the Edge's word to a browser:
// a cookie set for the Edge's host, CORS that lets the server's own site
// read the Edge's answers with the user's credentials, a content security
// policy, an HTML page with a script. Neither the model server nor the
// Node in front of it is trusted with that (either may be hostile), so the
// filter is here, at the Edge, on every tunnelled head.
//
// What passes:
//
//   - Content-Type, when it is one the Ollama API answers with on the
//     tunnelled endpoints (POST /api/chat, generate, embed, embeddings,
//     show): application/json and application/x-ndjson, and text/plain
//     for the router's own 404 and 405 ("404 page not found"). Its only
//     parameter kept is charset=utf-8. Any other type, a malformed one,
//     two of them or none becomes application/octet-stream, which no
//     browser renders (Ollama's text/event-stream is only on its /v1/
//     routes, which the Edge serves itself, never through the tunnel).
//   - Retry-After, which a busy server may send with its 503.
//   - Extension headers (X-...), which carry a request id or a rate limit,
//     except those that are policy to a browser (X-Frame-Options,
//     X-XSS-Protection, ...) or instructions to a proxy in front of the
//     Edge (X-Accel-Redirect makes nginx serve one of its own files), and
//     the Edge's own X-IOP-... headers, which a server must not forge.
//
// Everything else is dropped: hop-by-hop headers, Set-Cookie, every
// Access-Control-*, Content-Security-Policy, Strict-Transport-Security,
// Permissions-Policy, the Cross-Origin-*-Policy headers, Referrer-Policy,
// Alt-Svc, Clear-Site-Data, Refresh, Link, Location, Server-Timing,
// WWW-Authenticate (a login prompt under the Edge's name), caching
// headers, Content-Disposition, and whatever a standard adds later. An
// allowlist, so that a new policy header is dropped before anyone has
// heard of it.
//
// Two headers are the Edge's own on every tunnelled answer:
// X-Content-Type-Options: nosniff, so that no browser guesses a type, and
// a Content-Security-Policy that forbids everything (a relayed answer is
// data, never a page).

// tunnelCSP is the policy of every tunnelled answer: nothing loads,
// nothing runs, nothing frames it.
const tunnelCSP = "default-src 'none'; frame-ancestors 'none'; sandbox"

// opaqueType replaces a content type the Ollama API does not answer with.
const opaqueType = "application/octet-stream"

// ollamaTypes are the media types the Ollama API answers the tunnelled
// endpoints with (its server/routes.go: gin's c.JSON, the streaming
// handlers' application/x-ndjson, and gin's text/plain 404 and 405).
var ollamaTypes = map[string]bool{
	"application/json":     true,
	"application/x-ndjson": true,
	"text/plain":           true,
}

// passedStandard are the registered headers that pass besides
// Content-Type (checked apart).
var passedStandard = map[string]bool{
	"Retry-After": true,
}

// deniedExtension are extension headers that are policy to a browser or
// instructions to a proxy, not information for a client.
var deniedExtension = map[string]bool{
	"X-Frame-Options":                   true,
	"X-Xss-Protection":                  true,
	"X-Content-Type-Options":            true, // the Edge sets its own
	"X-Content-Security-Policy":         true,
	"X-Webkit-Csp":                      true,
	"X-Permitted-Cross-Domain-Policies": true,
	"X-Dns-Prefetch-Control":            true,
	"X-Download-Options":                true,
	"X-Ua-Compatible":                   true,
	"X-Robots-Tag":                      true,
	"X-Sendfile":                        true,
	"X-Lighttpd-Send-File":              true,
	"X-Real-Ip":                         true,
}

// deniedExtensionPrefixes are families of extension headers dropped
// whole: the Edge's own, nginx's and LiteSpeed's internal redirects and
// buffering controls, and forwarding headers.
var deniedExtensionPrefixes = []string{"X-Iop-", "X-Accel-", "X-Sendfile-", "X-Litespeed-", "X-Forwarded-"}

// tunnelHead is what passes of a tunnelled head, as filterHead found it.
type tunnelHead struct {
	headers []*wirepb.Header
	// refusedType is the provider's Content-Type when it was replaced
	// with opaqueType ("" when it passed, or none was sent), for the log.
	refusedType string
}

// filterHead returns the headers of hs that reach the client, and the
// Edge's own; see the comment above.
func filterHead(hs []*wirepb.Header) tunnelHead {
	var out tunnelHead
	var types []string
	hop := connectionNamed(hs)
	for _, kv := range hs {
		name := textproto.CanonicalMIMEHeaderKey(kv.GetName())
		if hop[name] || !validName(name) || !validValue(kv.GetValue()) {
			continue
		}
		switch {
		case name == "Content-Type":
			types = append(types, kv.GetValue())
		case passedStandard[name], passedExtension(name):
			out.headers = append(out.headers, &wirepb.Header{Name: name, Value: kv.GetValue()})
		}
	}
	ct, ok := "", false
	if len(types) == 1 {
		ct, ok = ollamaType(types[0])
	}
	if !ok {
		ct = opaqueType
		out.refusedType = strings.Join(types, ", ")
		if len(types) == 0 {
			out.refusedType = "(none)"
		}
	}
	out.headers = append(out.headers,
		&wirepb.Header{Name: "Content-Type", Value: ct},
		&wirepb.Header{Name: "X-Content-Type-Options", Value: "nosniff"},
		&wirepb.Header{Name: "Content-Security-Policy", Value: tunnelCSP},
	)
	return out
}

// connectionNamed is the set of headers hs's Connection header names:
// hop by hop (RFC 9110 7.6.1), whatever their names.
func connectionNamed(hs []*wirepb.Header) map[string]bool {
	named := map[string]bool{}
	for _, kv := range hs {
		if textproto.CanonicalMIMEHeaderKey(kv.GetName()) != "Connection" {
			continue
		}
		for name := range strings.SplitSeq(kv.GetValue(), ",") {
			named[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	return named
}

// ollamaType returns v, normalised, when it names one of ollamaTypes with
// no parameter but charset=utf-8.
func ollamaType(v string) (string, bool) {
	mt, params, err := mime.ParseMediaType(v)
	if err != nil || !ollamaTypes[mt] {
		return "", false
	}
	keep := map[string]string{}
	for k, p := range params {
		if k != "charset" || !strings.EqualFold(p, "utf-8") {
			return "", false
		}
		keep["charset"] = "utf-8"
	}
	return mime.FormatMediaType(mt, keep), true
}

// passedExtension reports whether name is an extension header that
// passes.
func passedExtension(name string) bool {
	if !strings.HasPrefix(name, "X-") || deniedExtension[name] {
		return false
	}
	for _, p := range deniedExtensionPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

// validName reports whether name is an HTTP field name (RFC 9110 5.1: a
// token), so that a hostile head cannot write a line of its own.
func validName(name string) bool {
	if name == "" {
		return false
	}
	for i := range len(name) {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether v is an HTTP field value: no control
// characters but tab (RFC 9110 5.5).
func validValue(v string) bool {
	for i := range len(v) {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
