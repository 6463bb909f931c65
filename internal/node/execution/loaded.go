package execution

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/iop-dev/iop/quicwire/wirepb"
	"github.com/iop-dev/iop/sdk"
)

// What a provider's server holds loaded (issue 23, P9). An Ollama server
// loads a model on demand and evicts another to make room, which costs
// seconds to minutes; the Edge routes a request warm first (to a provider
// holding its model) when the Node says what is loaded. The adapter's
// route says how (sdk.TunnelRoute.Loaded):
//
//   - sdk.LoadedOllamaPS: the Node reads Ollama's GET /api/ps itself,
//     along the route and with its own relay client, as it relays raw
//     tunnels. Not through the plugin: a plugin parked after idle_stop
//     (idle.go) would otherwise be started again for every read, and the
//     reads follow the provider's traffic, tunnels included, which need no
//     plugin at all. The route is the adapter's word on how its server is
//     reached (base URL, static headers), so reading along it needs no
//     second configuration.
//   - sdk.LoadedAll: the server keeps every model it serves loaded (an
//     OpenAI-compatible server): every target is warm; nothing is read.
//   - otherwise the Node does not know, and says so (loaded_known false).
//
// The list is read when the plugin has started, every relist interval
// (with the inventory), shortly after the first loaded model expires (so
// that an unload is seen), and after a call on the provider ends; never
// more often than loadedMinInterval per provider, however many calls end:
// requests that end meanwhile are coalesced into one read after it. A
// failed read makes the list unknown until a read succeeds: the Edge then
// routes as it would without one, rather than on a stale list.
//
// LoadedModel.in_use is not read from the server: it is the Node's own
// count of the calls holding a slot on that model now (Provider.uses),
// filled in when the provider is reported (Wire), so it is exact and
// costs no read.

const (
	// loadedMinInterval is the least time between two reads of one
	// provider's loaded list: at most four a second, whatever the load.
	loadedMinInterval = 250 * time.Millisecond
	// loadedReadTimeout bounds one read: /api/ps is a small local call.
	loadedReadTimeout = 5 * time.Second
	// maxLoadedBody bounds /api/ps's answer: a few hundred bytes a model.
	maxLoadedBody = 1 << 20
	// loadedExpirySlack is how long after a loaded model's expiry the list
	// is read again, so that the server has unloaded it by then.
	loadedExpirySlack = time.Second
	// expiryChange is how far a loaded model's expiry must move to count
	// as a change worth a status update: Ollama moves it at every request,
	// and the Edge routes on what is loaded, not on when it expires.
	expiryChange = time.Minute
)

// errLoadedStatus is a /api/ps answer that is not 200.
var errLoadedStatus = errors.New("loaded models: the server answered")

// loadedList is what a provider's server holds loaded, as last read.
type loadedList struct {
	// known: the Node knows (all, or models as read).
	known bool
	// all: every target is loaded (sdk.LoadedAll).
	all bool
	// models are the loaded models, sorted by name, without in_use.
	models []*wirepb.LoadedModel
}

// kickLoaded asks for a read of the loaded list soon; kicks while one is
// pending are one read.
func (p *Provider) kickLoaded() {
	select {
	case p.loadedKick <- struct{}{}:
	default:
	}
}

// refreshLoaded keeps the provider's loaded list current until ctx is
// done (Supervise runs it): a read at each kick, every relist interval and
// after the first expiry, at most one per loadedMinInterval.
func (p *Provider) refreshLoaded(ctx context.Context) {
	interval := p.relistInterval()
	for {
		t := time.NewTimer(p.nextLoadedRead(interval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.loadedKick:
			t.Stop()
		case <-t.C:
		}
		p.readLoaded(ctx)
		// The rate bound: kicks meanwhile wait in loadedKick, and are one
		// read after it.
		pause := time.NewTimer(loadedMinInterval)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
	}
}

// nextLoadedRead is how long until the next read without a kick: the
// relist interval, or shortly after the first loaded model expires if
// that is sooner.
func (p *Provider) nextLoadedRead(interval time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := interval
	now := time.Now()
	for _, m := range p.loaded.models {
		if ms := m.GetExpiresUnixMs(); ms > 0 {
			wait = min(wait, max(time.UnixMilli(ms).Sub(now)+loadedExpirySlack, loadedMinInterval))
		}
	}
	return wait
}

// readLoaded reads the loaded list as the running plugin's route says,
// and reports a change.
func (p *Provider) readLoaded(ctx context.Context) {
	p.mu.Lock()
	route, online := p.route, p.state == wirepb.ProviderState_PROVIDER_STATE_ONLINE
	p.mu.Unlock()
	var next loadedList
	switch {
	case route == nil:
	case route.Loaded == sdk.LoadedAll:
		next = loadedList{known: true, all: true}
	case route.Loaded == sdk.LoadedOllamaPS && online:
		rctx, cancel := context.WithTimeout(ctx, loadedReadTimeout)
		models, err := readOllamaPS(rctx, p.relay, route)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.loadedFails.failed(p.log, "reading the model server's loaded models failed; the Edge routes without them", err)
		} else {
			p.loadedFails.recovered(p.log)
			next = loadedList{known: true, models: models}
		}
	case route.Loaded == sdk.LoadedOllamaPS:
		return // offline: no work is routed here; the next read after it comes online says
	}
	p.mu.Lock()
	changed := !sameLoaded(p.loaded, next)
	p.loaded = next
	p.mu.Unlock()
	if changed {
		p.notify()
	}
}

// psResponse is the part of Ollama's GET /api/ps answer the Node reads.
type psResponse struct {
	Models []struct {
		Name      string    `json:"name"`
		Model     string    `json:"model"`
		Size      int64     `json:"size"`
		SizeVRAM  int64     `json:"size_vram"`
		ExpiresAt time.Time `json:"expires_at"`
	} `json:"models"`
}

// readOllamaPS reads Ollama's loaded models along route, with the Node's
// relay client (sdk.RelayTunnel: the route's URL and headers, as a raw
// tunnel would reach the server).
func readOllamaPS(ctx context.Context, client *http.Client, route *sdk.TunnelRoute) ([]*wirepb.LoadedModel, error) {
	var body limitedBody
	err := sdk.RelayTunnel(ctx, client, route, &sdk.TunnelRequest{Method: http.MethodGet, Path: "/api/ps", Header: http.Header{}}, &body)
	switch {
	case err != nil:
		return nil, err
	case body.status != http.StatusOK:
		return nil, fmt.Errorf("%w %d", errLoadedStatus, body.status)
	}
	var ps psResponse
	if err := json.Unmarshal(body.buf.Bytes(), &ps); err != nil {
		return nil, fmt.Errorf("loaded models: /api/ps: %w", err)
	}
	out := make([]*wirepb.LoadedModel, 0, len(ps.Models))
	for _, m := range ps.Models {
		name := cmp.Or(m.Name, m.Model)
		if name == "" || slices.ContainsFunc(out, func(o *wirepb.LoadedModel) bool { return o.GetName() == name }) {
			continue
		}
		lm := &wirepb.LoadedModel{Name: name, Size: uint64(max(m.Size, 0)), SizeVram: uint64(max(m.SizeVRAM, 0))}
		if !m.ExpiresAt.IsZero() && m.ExpiresAt.Year() < 9999 { // keep_alive -1: Ollama's far future
			lm.ExpiresUnixMs = m.ExpiresAt.UnixMilli()
		}
		out = append(out, lm)
	}
	slices.SortFunc(out, func(a, b *wirepb.LoadedModel) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

// limitedBody is the sdk.TunnelResponse of a /api/ps read: the status
// and at most maxLoadedBody bytes of the body.
type limitedBody struct {
	status int
	buf    bytes.Buffer
}

// WriteHeader keeps the status.
func (b *limitedBody) WriteHeader(status int, _ http.Header) error {
	b.status = status
	return nil
}

// Write keeps p, refusing a body past maxLoadedBody.
func (b *limitedBody) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > maxLoadedBody {
		return 0, fmt.Errorf("loaded models: /api/ps answered more than %d bytes", maxLoadedBody)
	}
	return b.buf.Write(p)
}

// sameLoaded reports whether two lists say the same to the Edge: the
// same models with the same sizes, their expiry moved by less than
// expiryChange.
func sameLoaded(a, b loadedList) bool {
	return a.known == b.known && a.all == b.all && slices.EqualFunc(a.models, b.models, func(x, y *wirepb.LoadedModel) bool {
		d := time.Duration(x.GetExpiresUnixMs()-y.GetExpiresUnixMs()) * time.Millisecond
		return x.GetName() == y.GetName() && x.GetSize() == y.GetSize() && x.GetSizeVram() == y.GetSizeVram() &&
			(x.GetExpiresUnixMs() == 0) == (y.GetExpiresUnixMs() == 0) && d.Abs() < expiryChange
	})
}

// wireLoaded fills w's loaded fields from p's list and its calls in
// flight. Callers hold p.mu.
func (p *Provider) wireLoadedLocked(w *wirepb.Provider) {
	w.MaxLoaded = uint32(max(p.cfg.MaxLoaded, 0))
	w.LoadedKnown, w.AllLoaded = p.loaded.known, p.loaded.all
	for _, m := range p.loaded.models {
		lm := &wirepb.LoadedModel{Name: m.GetName(), Size: m.GetSize(), SizeVram: m.GetSizeVram(), ExpiresUnixMs: m.GetExpiresUnixMs()}
		for target, n := range p.uses {
			if sameModel(target, m.GetName()) {
				lm.InUse += uint32(n)
			}
		}
		w.Loaded = append(w.Loaded, lm)
	}
}

// sameModel reports whether a target and a loaded model's name are one
// model: the same name, or one without a tag and the other with Ollama's
// implicit ":latest".
func sameModel(a, b string) bool {
	return a == b || a+":latest" == b || a == b+":latest"
}
