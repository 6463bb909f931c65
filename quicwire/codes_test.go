package quicwire_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/quic-go/quic-go"

	"github.com/iop-dev/iop/quicwire"
)

// Close and stream codes travel on the wire, so the peer learns why a
// connection or stream ended; R9 names heartbeat_timeout.

var closeCodes = map[string]quicwire.CloseCode{
	"CloseNormal":           quicwire.CloseNormal,
	"CloseHeartbeatTimeout": quicwire.CloseHeartbeatTimeout,
	"CloseSuperseded":       quicwire.CloseSuperseded,
	"CloseShutdown":         quicwire.CloseShutdown,
	"CloseProtocolError":    quicwire.CloseProtocolError,
	"CloseUnauthenticated":  quicwire.CloseUnauthenticated,
	"CloseRefused":          quicwire.CloseRefused,
	"CloseInternal":         quicwire.CloseInternal,
}

var streamCodes = map[string]quicwire.StreamCode{
	"StreamDone":          quicwire.StreamDone,
	"StreamCancelled":     quicwire.StreamCancelled,
	"StreamProtocolError": quicwire.StreamProtocolError,
	"StreamRefused":       quicwire.StreamRefused,
	"StreamShutdown":      quicwire.StreamShutdown,
	"StreamTooLarge":      quicwire.StreamTooLarge,
	"StreamBusy":          quicwire.StreamBusy,
}

// declaredConsts lists the constants of the given type declared in
// codes.go, so a code added later without a name (or without a place in
// these tests) fails here.
func declaredConsts(t *testing.T, typeName string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "codes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == typeName {
				for _, n := range vs.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

func TestEveryCodeConstantIsCovered(t *testing.T) {
	for _, tc := range []struct {
		typ   string
		known func(string) bool
	}{
		{"CloseCode", func(n string) bool { _, ok := closeCodes[n]; return ok }},
		{"StreamCode", func(n string) bool { _, ok := streamCodes[n]; return ok }},
	} {
		declared := declaredConsts(t, tc.typ)
		if len(declared) == 0 {
			t.Fatalf("found no %s constants in codes.go", tc.typ)
		}
		for _, n := range declared {
			if !tc.known(n) {
				t.Errorf("%s %s is not listed in codes_test.go", tc.typ, n)
			}
		}
	}
}

func TestEveryCloseCodeHasADistinctName(t *testing.T) {
	byValue := map[quicwire.CloseCode]string{}
	byName := map[string]string{}
	for constName, c := range closeCodes {
		if prev, dup := byValue[c]; dup {
			t.Errorf("%s and %s share the value %#x", constName, prev, uint64(c))
		}
		byValue[c] = constName
		name := c.String()
		if name == "" || strings.HasPrefix(name, "close_code_") {
			t.Errorf("%s (%#x) has no name: %q", constName, uint64(c), name)
		}
		if prev, dup := byName[name]; dup {
			t.Errorf("%s and %s share the name %q", constName, prev, name)
		}
		byName[name] = constName
	}
	for _, want := range []string{"heartbeat_timeout", "superseded", "shutdown", "protocol_error", "unauthenticated"} {
		if _, ok := byName[want]; !ok {
			t.Errorf("no close code is named %q", want)
		}
	}
	if got := quicwire.CloseHeartbeatTimeout.String(); got != "heartbeat_timeout" {
		t.Errorf("CloseHeartbeatTimeout = %q, want heartbeat_timeout (R9)", got)
	}
}

func TestEveryStreamCodeHasADistinctName(t *testing.T) {
	byValue := map[quicwire.StreamCode]string{}
	byName := map[string]string{}
	for constName, c := range streamCodes {
		if prev, dup := byValue[c]; dup {
			t.Errorf("%s and %s share the value %#x", constName, prev, uint64(c))
		}
		byValue[c] = constName
		name := c.String()
		if name == "" || strings.HasPrefix(name, "stream_code_") {
			t.Errorf("%s (%#x) has no name: %q", constName, uint64(c), name)
		}
		if prev, dup := byName[name]; dup {
			t.Errorf("%s and %s share the name %q", constName, prev, name)
		}
		byName[name] = constName
	}
}

// A code from a newer peer still prints as something a person can look up.
func TestUnknownCodesPrintTheirValue(t *testing.T) {
	if got := quicwire.CloseCode(0x1ab).String(); !strings.Contains(got, "0x1ab") || !strings.Contains(got, "close") {
		t.Errorf("unknown close code prints %q, want it to say close code 0x1ab", got)
	}
	if got := quicwire.StreamCode(0x2cd).String(); !strings.Contains(got, "0x2cd") || !strings.Contains(got, "stream") {
		t.Errorf("unknown stream code prints %q, want it to say stream code 0x2cd", got)
	}
}

func TestCloseReasonReadsTheApplicationCloseCode(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		code       quicwire.CloseCode
		remote     bool
		detail     string
		detailText string // what Error() must contain
	}{
		{
			name:   "remote_heartbeat_timeout",
			err:    &quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(quicwire.CloseHeartbeatTimeout), ErrorMessage: "no ack for 45s"},
			code:   quicwire.CloseHeartbeatTimeout,
			remote: true, detail: "no ack for 45s", detailText: "heartbeat_timeout",
		},
		{
			name: "local_superseded_wrapped",
			err:  fmt.Errorf("recv: %w", &quic.ApplicationError{ErrorCode: quic.ApplicationErrorCode(quicwire.CloseSuperseded), ErrorMessage: "generation 8"}),
			code: quicwire.CloseSuperseded, detail: "generation 8", detailText: "superseded",
		},
		{
			name: "unknown_code_from_a_newer_peer",
			err:  &quic.ApplicationError{Remote: true, ErrorCode: 0x1ff},
			code: quicwire.CloseCode(0x1ff), remote: true, detailText: "0x1ff",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc, ok := quicwire.CloseReason(tc.err)
			if !ok {
				t.Fatalf("CloseReason(%v) = false, want a connection end", tc.err)
			}
			if cc.Code != tc.code || cc.Remote != tc.remote || cc.Detail != tc.detail || cc.Transport != nil {
				t.Fatalf("CloseReason = %+v, want code %v remote %v detail %q and no transport error", cc, tc.code, tc.remote, tc.detail)
			}
			if !errors.Is(cc, quicwire.ErrDisconnected) {
				t.Fatal("a connection end does not match ErrDisconnected (R9)")
			}
			if !strings.Contains(cc.Error(), tc.detailText) {
				t.Fatalf("Error() = %q, want it to contain %q", cc.Error(), tc.detailText)
			}
		})
	}
}

func TestCloseReasonMapsTransportEndsToInternal(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"idle_timeout", &quic.IdleTimeoutError{}},
		{"idle_timeout_wrapped", fmt.Errorf("read: %w", &quic.IdleTimeoutError{})},
		{"handshake_timeout", &quic.HandshakeTimeoutError{}},
		{"stateless_reset", &quic.StatelessResetError{}},
		{"transport_error", &quic.TransportError{ErrorCode: quic.FlowControlError, Remote: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc, ok := quicwire.CloseReason(tc.err)
			if !ok {
				t.Fatalf("CloseReason(%v) = false, want a connection end", tc.err)
			}
			if cc.Code != quicwire.CloseInternal || cc.Transport != tc.err {
				t.Fatalf("CloseReason = %+v, want CloseInternal with Transport set to the quic error", cc)
			}
			if !errors.Is(cc, quicwire.ErrDisconnected) {
				t.Fatal("a transport end does not match ErrDisconnected (R9)")
			}
			if !errors.Is(cc, tc.err) {
				t.Fatal("the transport error is not reachable with errors.Is")
			}
		})
	}
	// The quic-go error chain stays intact (an idle timeout is net.ErrClosed).
	cc, _ := quicwire.CloseReason(&quic.IdleTimeoutError{})
	if !errors.Is(cc, net.ErrClosed) {
		t.Fatal("an idle timeout's chain no longer reaches net.ErrClosed")
	}
}

func TestCloseReasonIgnoresErrorsThatAreNotConnectionEnds(t *testing.T) {
	for _, err := range []error{
		nil,
		io.EOF,
		context.Canceled,
		errors.New("adapter crashed"),
		net.ErrClosed,
		&quic.StreamError{ErrorCode: quic.StreamErrorCode(quicwire.StreamCancelled)},
		errors.New("protocol error on run stream: frame does not parse"),
	} {
		if cc, ok := quicwire.CloseReason(err); ok || cc != nil {
			t.Errorf("CloseReason(%v) = %+v, true; want false", err, cc)
		}
	}
}

func TestConnClosedErrorAlreadyClassifiedPassesThrough(t *testing.T) {
	orig := &quicwire.ConnClosedError{Code: quicwire.CloseShutdown, Remote: true}
	cc, ok := quicwire.CloseReason(fmt.Errorf("dispatch: %w", orig))
	if !ok || cc != orig {
		t.Fatalf("CloseReason = %v, %v; want the same *ConnClosedError", cc, ok)
	}
}

func TestErrDisconnectedMatchesEveryConnectionEnd(t *testing.T) {
	for _, cc := range []*quicwire.ConnClosedError{
		{Code: quicwire.CloseNormal},
		{Code: quicwire.CloseHeartbeatTimeout, Remote: true},
		{Code: quicwire.CloseInternal, Transport: &quic.IdleTimeoutError{}},
	} {
		wrapped := fmt.Errorf("run 1: %w", cc)
		if !errors.Is(wrapped, quicwire.ErrDisconnected) {
			t.Errorf("%v does not match ErrDisconnected", cc)
		}
		if errors.Is(wrapped, io.EOF) {
			t.Errorf("%v matches io.EOF", cc)
		}
	}
}
