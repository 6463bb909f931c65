//go:build unix

package netpeek

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// loopback returns both ends of a TCP connection.
func loopback(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// A peek tells an open, silent connection from one with bytes waiting and
// one its peer closed, and leaves the bytes for the read; a wait ends at
// the deadline, or when bytes come.
func TestPeekAndWait(t *testing.T) {
	c, peer := loopback(t)
	if r := Peek(c); r != Nothing {
		t.Errorf("silent: %v, want Nothing", r)
	}
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if err := WaitReadable(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("waiting past the deadline: %v", err)
	}
	_ = c.SetReadDeadline(time.Time{})

	if _, err := io.WriteString(peer, "hi"); err != nil {
		t.Fatal(err)
	}
	if err := WaitReadable(c); err != nil {
		t.Fatal(err)
	}
	if r := Peek(c); r != Bytes {
		t.Errorf("bytes sent: %v, want Bytes", r)
	}
	if b, err := io.ReadAll(io.LimitReader(c, 2)); err != nil || string(b) != "hi" {
		t.Errorf("the bytes after peeking: %q, %v", b, err)
	}

	peer.Close()
	if err := WaitReadable(c); err != nil {
		t.Fatal(err)
	}
	if r := Peek(c); r != Ended {
		t.Errorf("peer closed: %v, want Ended", r)
	}
	c.Close()
	if r := Peek(c); r != Ended {
		t.Errorf("closed: %v, want Ended", r)
	}
}
