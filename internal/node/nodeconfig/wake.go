package nodeconfig

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/iop-dev/iop/internal/yamlconf"
)

// DefaultWakePort is where a wake-on-LAN magic packet goes when a wake target's broadcast names no
// port: UDP 9 (discard), where network cards listen for it; 7 is the other common choice.
const DefaultWakePort = 9

// Wake is one entry of `wake` (issue 23): a machine on this Node's LAN that the Node can wake
// with a wake-on-LAN magic packet, and the Node that runs there. The Edge learns the list at
// registration; when a request needs a model that only a sleeping Node served, it asks a Node
// that lists it to send the packet.
type Wake struct {
	// NodeID is the node_id of the Node running on that machine; required.
	NodeID string `yaml:"node_id"`
	// MAC is the address of that machine's network card that wakes it, as aa:bb:cc:dd:ee:ff
	// or aa-bb-cc-dd-ee-ff; required.
	MAC string `yaml:"mac"`
	// Broadcast is where the packet is sent: the broadcast address of the LAN the machine is on
	// (192.168.1.255), as host or host:port; the port defaults to 9. A unicast address works
	// too where the switch still knows the sleeping machine's port.
	Broadcast string `yaml:"broadcast"`
}

// HardwareAddr is the MAC as bytes; valid after Validate.
func (w Wake) HardwareAddr() net.HardwareAddr {
	mac, _ := net.ParseMAC(w.MAC)
	return mac
}

// Addr is the packet's destination as host:port, the port DefaultWakePort when Broadcast names
// none; valid after Validate.
func (w Wake) Addr() string {
	if _, _, err := net.SplitHostPort(w.Broadcast); err == nil {
		return w.Broadcast
	}
	return net.JoinHostPort(w.Broadcast, strconv.Itoa(DefaultWakePort))
}

// validateWake checks the `wake` list: each entry a valid target, each Node named once, and not
// this Node itself (a machine cannot wake itself from sleep).
func (c *Config) validateWake() []*yamlconf.Error {
	var es yamlconf.Errors
	seen := make(map[string]int, len(c.Wake))
	for i, w := range c.Wake {
		path := "wake[" + strconv.Itoa(i) + "]"
		if err := yamlconf.CheckID(path+".node_id", w.NodeID); err != nil {
			es.Append(err)
		} else if first, dup := seen[w.NodeID]; dup {
			es.Add(path+".node_id", "duplicate wake target %q (also wake[%d])", w.NodeID, first)
		} else if w.NodeID == c.NodeID {
			es.Add(path+".node_id", "is this Node's own id: a machine cannot wake itself")
		}
		seen[w.NodeID] = i
		es.Append(checkMAC(path+".mac", w.MAC)...)
		es.Append(checkBroadcast(path+".broadcast", w.Broadcast)...)
	}
	return es
}

// checkMAC accepts a 6-byte MAC written with colons or dashes.
func checkMAC(path, s string) []*yamlconf.Error {
	var es yamlconf.Errors
	mac, err := net.ParseMAC(s)
	switch {
	case s == "":
		es.Add(path, "required, as aa:bb:cc:dd:ee:ff")
	case err != nil || len(mac) != 6 || strings.Contains(s, "."):
		es.Add(path, "must be a MAC address as aa:bb:cc:dd:ee:ff or aa-bb-cc-dd-ee-ff, got %q", s)
	case mac.String() == "00:00:00:00:00:00" || mac[0]&1 == 1:
		es.Add(path, "must be a network card's own (unicast) address, got %q", s)
	}
	return es
}

// checkBroadcast accepts an IPv4 address or a host name, with an optional port from 1 to 65535.
// Wake-on-LAN is an IPv4 broadcast: an IPv6 address has no broadcast to send it to.
func checkBroadcast(path, s string) []*yamlconf.Error {
	var es yamlconf.Errors
	if s == "" {
		es.Add(path, "required: the LAN's broadcast address, as host or host:port (port %d by default)", DefaultWakePort)
		return es
	}
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		host = h
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			es.Add(path, "port must be a number from 1 to 65535, got %q", p)
		}
	} else if strings.Count(s, ":") == 1 {
		es.Add(path, "must be host or host:port, got %q", s)
		return es
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.Is4() {
			es.Add(path, "must be an IPv4 address or a host name (wake-on-LAN is an IPv4 broadcast), got %q", host)
		}
	} else if !validHostName(host) {
		es.Add(path, "must be an IPv4 address or a host name, got %q", host)
	}
	return es
}

// validHostName reports whether h is a DNS name: labels of letters, digits and '-', dot-separated.
func validHostName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
