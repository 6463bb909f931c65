package nodeconfig

import (
	"strings"
	"testing"
)

// A Node's wake list (issue 23) is read with its defaults: a MAC in either
// spelling and a broadcast address without a port mean port 9.
func TestWakeTargetsParseWithDefaultPort(t *testing.T) {
	c, err := Parse([]byte(loopbackFile + `wake:
  - node_id: gpu-2
    mac: AA-BB-CC-DD-EE-01
    broadcast: 192.168.1.255
  - node_id: gpu-3
    mac: aa:bb:cc:dd:ee:02
    broadcast: lan-broadcast.example:7
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Wake) != 2 {
		t.Fatalf("wake: %+v", c.Wake)
	}
	if got := c.Wake[0].HardwareAddr().String(); got != "aa:bb:cc:dd:ee:01" {
		t.Errorf("mac %s, want aa:bb:cc:dd:ee:01", got)
	}
	if got := c.Wake[0].Addr(); got != "192.168.1.255:9" {
		t.Errorf("addr %s, want the default port 9", got)
	}
	if got := c.Wake[1].Addr(); got != "lan-broadcast.example:7" {
		t.Errorf("addr %s, want the port given", got)
	}
}

func TestWakeTargetsAreValidated(t *testing.T) {
	for _, tc := range []struct {
		name, entry, want string
	}{
		{"no node", "mac: aa:bb:cc:dd:ee:01\n    broadcast: 10.0.0.255", "wake[0].node_id"},
		{"itself", "node_id: node-test\n    mac: aa:bb:cc:dd:ee:01\n    broadcast: 10.0.0.255", "this Node's own id"},
		{"no mac", "node_id: gpu-2\n    broadcast: 10.0.0.255", "wake[0].mac (line 13): required"},
		{"short mac", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee\n    broadcast: 10.0.0.255", "must be a MAC address"},
		{"dotted mac", "node_id: gpu-2\n    mac: aabb.ccdd.ee01\n    broadcast: 10.0.0.255", "must be a MAC address"},
		{"infiniband mac", "node_id: gpu-2\n    mac: 00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01\n    broadcast: 10.0.0.255", "must be a MAC address"},
		{"multicast mac", "node_id: gpu-2\n    mac: ff:ff:ff:ff:ff:ff\n    broadcast: 10.0.0.255", "unicast"},
		{"no broadcast", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee:01", "wake[0].broadcast (line 13): required"},
		{"port zero", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee:01\n    broadcast: 10.0.0.255:0", "port must be a number from 1"},
		{"bad port", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee:01\n    broadcast: 10.0.0.255:nine", "port must be"},
		{"ipv6", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee:01\n    broadcast: \"[ff02::1]:9\"", "IPv4"},
		{"bad host", "node_id: gpu-2\n    mac: aa:bb:cc:dd:ee:01\n    broadcast: lan_bcast!", "IPv4 address or a host name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(loopbackFile + "wake:\n  - " + tc.entry + "\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestWakeTargetNamedTwiceIsRefused(t *testing.T) {
	_, err := Parse([]byte(loopbackFile + `wake:
  - {node_id: gpu-2, mac: "aa:bb:cc:dd:ee:01", broadcast: 10.0.0.255}
  - {node_id: gpu-2, mac: "aa:bb:cc:dd:ee:02", broadcast: 10.0.0.255}
`))
	if err == nil || !strings.Contains(err.Error(), `wake[1].node_id`) || !strings.Contains(err.Error(), "also wake[0]") {
		t.Fatalf("got %v, want the duplicate named", err)
	}
}
