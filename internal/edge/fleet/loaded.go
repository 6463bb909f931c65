package fleet

import (
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
)

// LoadedView is what a provider's model server holds loaded, as its Node
// last reported it (issue 23: the scheduler routes warm first by it).
type LoadedView struct {
	// All: the server keeps every model it serves loaded.
	All bool `json:"all,omitempty"`
	// Max is how many models it holds at once (the provider's
	// max_loaded_models); 0: not known.
	Max uint32 `json:"max,omitempty"`
	// Models are the loaded models, by name.
	Models []LoadedModelView `json:"models"`
}

// LoadedModelView is one loaded model.
type LoadedModelView struct {
	Name string `json:"name"`
	// Size and SizeVRAM are its bytes in memory, and of those in GPU memory.
	Size     uint64 `json:"size"`
	SizeVRAM uint64 `json:"size_vram"`
	// ExpiresAt is when the server unloads it if no request comes; absent:
	// never, or not known.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// InUse is how many runs and tunnels the Node serves on it now.
	InUse uint32 `json:"in_use"`
}

// loadedView is p's loaded list as the admin API shows it; nil when its
// Node does not know (or is too old to say).
func loadedView(p *wirepb.Provider) *LoadedView {
	if !p.GetLoadedKnown() {
		return nil
	}
	v := &LoadedView{All: p.GetAllLoaded(), Max: p.GetMaxLoaded(), Models: make([]LoadedModelView, 0, len(p.GetLoaded()))}
	for _, m := range p.GetLoaded() {
		mv := LoadedModelView{Name: m.GetName(), Size: m.GetSize(), SizeVRAM: m.GetSizeVram(), InUse: m.GetInUse()}
		if ms := m.GetExpiresUnixMs(); ms > 0 {
			at := time.UnixMilli(ms).UTC()
			mv.ExpiresAt = &at
		}
		v.Models = append(v.Models, mv)
	}
	return v
}
