package execution

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// The magic packet is six 0xFF bytes and the MAC sixteen times (issue 23).
func TestMagicPacketBytes(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0x1a, 0x2b, 0x3c, 0x4d, 0x5e}
	p := MagicPacket(mac)
	if len(p) != 102 {
		t.Fatalf("%d bytes, want 102", len(p))
	}
	if !bytes.Equal(p[:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
		t.Fatalf("header % x", p[:6])
	}
	for i := range 16 {
		if got := p[6+6*i : 12+6*i]; !bytes.Equal(got, mac) {
			t.Fatalf("repetition %d is % x, want % x", i, got, mac)
		}
	}
}

// COMMAND_KIND_WAKE sends the packet for the named target as one UDP
// datagram to its address; a Node it does not list is a Failure naming it
// and the Node's list.
func TestWakeCommandSendsTheMagicPacket(t *testing.T) {
	ln, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x07}
	waker := NewWaker([]WakeTarget{{NodeID: "gpu-2", MAC: mac, Addr: ln.LocalAddr().String()}}, nil)
	h := NewHandler(NewSet(), nil, HandlerOptions{Waker: waker})

	res := h.command(nil, &wirepb.CommandRequest{CommandId: "c1", Kind: wirepb.CommandKind_COMMAND_KIND_WAKE, WakeNodeId: "gpu-2"})
	if res.GetFailure() != nil {
		t.Fatalf("wake failed: %v", res.GetFailure())
	}
	buf := make([]byte, 512)
	_ = ln.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := ln.ReadFromUDP(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], MagicPacket(mac)) {
		t.Fatalf("received % x", buf[:n])
	}

	res = h.command(nil, &wirepb.CommandRequest{CommandId: "c2", Kind: wirepb.CommandKind_COMMAND_KIND_WAKE, WakeNodeId: "gpu-9"})
	f := res.GetFailure()
	if f == nil || f.GetKind() != wirepb.FailureKind_FAILURE_KIND_INVALID_REQUEST ||
		!strings.Contains(f.GetMessage(), `"gpu-9"`) || !strings.Contains(f.GetMessage(), "gpu-2") {
		t.Fatalf("unknown target answered %v, want an invalid-request failure naming gpu-9 and the list", f)
	}
}

// A Node with no wake list refuses every wake and says so.
func TestWakeCommandWithoutTargets(t *testing.T) {
	h := NewHandler(NewSet(), nil, HandlerOptions{})
	res := h.command(nil, &wirepb.CommandRequest{Kind: wirepb.CommandKind_COMMAND_KIND_WAKE, WakeNodeId: "gpu-2"})
	if f := res.GetFailure(); f == nil || !strings.Contains(f.GetMessage(), "wake list: none") {
		t.Fatalf("got %v", f)
	}
}

// The targets travel to the Edge at registration as the wire's WakeTarget.
func TestWakeTargetsOnTheWire(t *testing.T) {
	got := WakeTargetsWire([]WakeTarget{{NodeID: "gpu-2", MAC: net.HardwareAddr{0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0x01}, Addr: "10.0.0.255:9"}})
	if len(got) != 1 || got[0].GetNodeId() != "gpu-2" || got[0].GetMac() != "aa:bb:cc:dd:ee:01" || got[0].GetBroadcast() != "10.0.0.255:9" {
		t.Fatalf("%v", got)
	}
}
