package registrar

import (
	"net"
	"net/netip"
	"testing"
)

// Issue 24 gap 6: a join slot is counted against the peer's IPv4 address,
// or the /64 of its IPv6 one (an IPv4 address in IPv6 form counts as
// itself).
func TestJoinSourceIsTheAddressOrItsSlash64(t *testing.T) {
	for _, tt := range []struct {
		addr net.Addr
		want string
	}{
		{&net.UDPAddr{IP: net.ParseIP("192.0.2.7"), Port: 4000}, "192.0.2.7/32"},
		{&net.UDPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 4000}, "192.0.2.7/32"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 4000}, "2001:db8:1:2::/64"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9"), Port: 4001}, "2001:db8:1:2::/64"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8:1:3::1"), Port: 4000}, "2001:db8:1:3::/64"},
		{&net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 4000, Zone: "eth0"}, "fe80::/64"},
	} {
		if got := joinSource(tt.addr); got.String() != tt.want {
			t.Errorf("joinSource(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
	if got := joinSource(&net.UnixAddr{Name: "/x", Net: "unix"}); got != (netip.Prefix{}) {
		t.Errorf("an address that does not parse counts as %s, want the zero prefix", got)
	}
}

// Each source gets maxJoinsPerSource slots; a slot given back can be
// taken again; Services keep apart; the table holds only sources in use.
func TestJoinSlotsPerSource(t *testing.T) {
	a, b := &Service{}, &Service{}
	src := netip.MustParsePrefix("192.0.2.7/32")
	other := netip.MustParsePrefix("192.0.2.8/32")
	for i := range maxJoinsPerSource {
		if !a.sources.take(src) {
			t.Fatalf("slot %d of %d refused", i+1, maxJoinsPerSource)
		}
	}
	if a.sources.take(src) {
		t.Fatal("one slot more than maxJoinsPerSource from one source")
	}
	if !a.sources.take(other) || !b.sources.take(src) {
		t.Fatal("another source, or another Service, was refused")
	}
	a.sources.release(src)
	if !a.sources.take(src) {
		t.Fatal("a slot given back could not be taken again")
	}
	for range maxJoinsPerSource {
		a.sources.release(src)
	}
	a.sources.release(other)
	b.sources.release(src)
	for _, s := range []*Service{a, b} {
		for k, n := range s.sources.n {
			t.Errorf("source %s still counted %d after every slot was given back", k, n)
		}
	}
}
