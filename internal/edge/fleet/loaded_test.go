package fleet_test

import (
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/fleet"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// Issue 23: the admin view shows what each provider's server holds loaded,
// as the Node's last status update said, and nothing for a Node that does
// not say.
func TestSnapshotShowsWhatProvidersHoldLoaded(t *testing.T) {
	r := fleet.New(fleet.Options{})
	c, _ := register(r, "n1")
	old := &wirepb.Provider{Name: "old", State: wirepb.ProviderState_PROVIDER_STATE_ONLINE}
	if err := r.MarkReady(c, c.Generation(), []*wirepb.Provider{old}); err != nil {
		t.Fatal(err)
	}
	exp := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	r.UpdateProviders(c, []*wirepb.Provider{old, {Name: "ollama", LoadedKnown: true, MaxLoaded: 1, Loaded: []*wirepb.LoadedModel{
		{Name: "m:latest", Size: 5 << 30, SizeVram: 4 << 30, ExpiresUnixMs: exp.UnixMilli(), InUse: 2},
	}}}, 1)
	ps := r.Snapshot()[0].Providers
	if ps[0].Loaded != nil {
		t.Errorf("a provider whose Node does not say: %+v", ps[0].Loaded)
	}
	l := ps[1].Loaded
	if l == nil || l.All || l.Max != 1 || len(l.Models) != 1 {
		t.Fatalf("loaded %+v", l)
	}
	if m := l.Models[0]; m.Name != "m:latest" || m.Size != 5<<30 || m.SizeVRAM != 4<<30 || m.InUse != 2 || m.ExpiresAt == nil || !m.ExpiresAt.Equal(exp) {
		t.Errorf("model %+v", m)
	}
}
