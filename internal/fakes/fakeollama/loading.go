package fakeollama

import (
	"context"
	"time"
)

// Model memory (issue 23: warm-first routing is measured against it). By
// default the fake answers every model at once and /api/ps lists what was
// used. With a Loading set (SetLoading, the cmd's -max-loaded and
// -load-time flags), it holds models the way Ollama's scheduler does:
//
//   - a generation request (/api/chat, /api/generate) for a model that is
//     loaded, or being loaded, uses it (waiting for the load to finish);
//   - one that is not loaded is loaded, which takes LoadTime; at
//     MaxLoaded models, the least recently used model that no request is
//     using is evicted first;
//   - when every loaded model is in use, the request waits until one is
//     free, and so does every request that came after it, for any model:
//     Ollama's scheduler takes its pending requests one at a time
//     (server/sched.go, processPending), and the one at the head waits for
//     a runner to unload before the next is looked at;
//   - a model idle past its keep_alive is unloaded; keep_alive 0 unloads
//     it as soon as its last request ends.
//
// /api/ps lists the loaded models (not those still loading), and Loads
// counts the loads and evictions. Embeddings do not go through it: they
// mark their model used as before.

// Loading is how a fake holds models in memory.
type Loading struct {
	// MaxLoaded is how many models it holds loaded at once (Ollama's
	// OLLAMA_MAX_LOADED_MODELS); 0: no bound.
	MaxLoaded int `json:"max_loaded"`
	// LoadTime is how long loading a model that is not loaded takes (in
	// JSON, nanoseconds).
	LoadTime time.Duration `json:"load_time"`
}

// LoadStats counts what the fake loaded.
type LoadStats struct {
	// Loads counts the models loaded (each load of a model not loaded);
	// ByModel the same by model name.
	Loads   int64            `json:"loads"`
	ByModel map[string]int64 `json:"by_model"`
	// Evictions counts the idle models unloaded to make room.
	Evictions int64 `json:"evictions"`
	// Loaded are the models loaded or loading now.
	Loaded []string `json:"loaded"`
}

// resident is a model loaded or being loaded.
type resident struct {
	key     string
	users   int           // requests using it, or waiting for its load
	ready   chan struct{} // closed once loaded
	lastUse time.Time
}

// SetLoading sets how the fake holds models; the zero Loading is the
// default (no bound, no load time). Models already loaded stay loaded.
func (s *Server) SetLoading(l Loading) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loading = l
}

// Loads returns the loads and evictions so far and what is loaded now.
func (s *Server) Loads() LoadStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := LoadStats{Loads: s.loads.Loads, Evictions: s.loads.Evictions, ByModel: make(map[string]int64, len(s.loads.ByModel)), Loaded: []string{}}
	for k, n := range s.loads.ByModel {
		st.ByModel[k] = n
	}
	for k := range s.resident {
		st.Loaded = append(st.Loaded, k)
	}
	return st
}

// use holds m in memory for one generation request, loading it as the
// Loading says (waiting its turn, evicting, waiting for a free model),
// and returns the function that ends the use; keepAlive is the request's.
// ok is false when the client went away or the server closed first.
func (s *Server) use(ctx context.Context, m Model, keepAlive time.Duration) (release func(), ok bool) {
	s.mu.Lock()
	l := s.loading
	s.mu.Unlock()
	if l == (Loading{}) {
		s.markLoaded(m, keepAlive)
		return func() {}, true
	}
	key := baseName(m.Name)
	// One request decides at a time, in arrival order.
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, false
	case <-s.quit:
		return nil, false
	}
	r, ok := s.placeLocked(ctx, key)
	<-s.turn
	if !ok {
		return nil, false
	}
	release = func() { s.leave(r, keepAlive) }
	select {
	case <-r.ready:
		return release, true
	case <-ctx.Done():
	case <-s.quit:
	}
	release()
	return nil, false
}

// placeLocked finds key in memory or starts loading it, evicting the least
// recently used idle model at MaxLoaded, or waiting for one to be idle. It
// is called with the turn held and returns the resident, used once more.
func (s *Server) placeLocked(ctx context.Context, key string) (*resident, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		s.unloadExpiredLocked(time.Now())
		if r := s.resident[key]; r != nil {
			r.users++
			return r, true
		}
		if s.loading.MaxLoaded <= 0 || len(s.resident) < s.loading.MaxLoaded {
			break
		}
		if v := s.leastRecentIdleLocked(); v != nil {
			s.unloadLocked(v)
			s.loads.Evictions++
			continue
		}
		freed := s.freed
		s.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
		case <-s.quit:
		}
		s.mu.Lock()
		if ctx.Err() != nil || s.closed {
			return nil, false
		}
	}
	r := &resident{key: key, users: 1, ready: make(chan struct{})}
	s.resident[key] = r
	s.loads.Loads++
	if s.loads.ByModel == nil {
		s.loads.ByModel = make(map[string]int64)
	}
	s.loads.ByModel[key]++
	s.loadsWG.Add(1)
	go s.load(r, s.loading.LoadTime)
	return r, true
}

// load takes d to load r, then lists it in /api/ps with the default
// keep_alive until its requests end.
func (s *Server) load(r *resident, d time.Duration) {
	defer s.loadsWG.Done()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-s.quit:
		t.Stop()
	}
	s.mu.Lock()
	if s.resident[r.key] == r {
		s.loaded[r.key] = time.Now().Add(5 * time.Minute).UTC()
	}
	s.mu.Unlock()
	close(r.ready)
}

// leave ends one use of r: the model's keep_alive starts again (0 unloads
// it once idle), and a request waiting for an idle model looks again.
func (s *Server) leave(r *resident, keepAlive time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.users--
	r.lastUse = time.Now()
	if s.resident[r.key] != r {
		return
	}
	switch {
	case keepAlive == 0 && r.users == 0:
		s.unloadLocked(r)
	case isClosed(r.ready):
		s.loaded[r.key] = r.lastUse.Add(keepAlive).UTC()
	}
	close(s.freed)
	s.freed = make(chan struct{})
}

// leastRecentIdleLocked is the loaded model no request uses that was used
// least recently, or nil.
func (s *Server) leastRecentIdleLocked() *resident {
	var v *resident
	for _, r := range s.resident {
		if r.users == 0 && isClosed(r.ready) && (v == nil || r.lastUse.Before(v.lastUse)) {
			v = r
		}
	}
	return v
}

// unloadExpiredLocked unloads the idle models past their keep_alive.
func (s *Server) unloadExpiredLocked(now time.Time) {
	for key, r := range s.resident {
		if exp, ok := s.loaded[key]; ok && r.users == 0 && exp.Before(now) {
			s.unloadLocked(r)
		}
	}
}

// unload unloads m now (a load request with keep_alive 0) if no request
// uses it.
func (s *Server) unload(m Model) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := baseName(m.Name)
	if r := s.resident[key]; r != nil {
		if r.users == 0 {
			s.unloadLocked(r)
		}
		return
	}
	delete(s.loaded, key)
}

func (s *Server) unloadLocked(r *resident) {
	delete(s.resident, r.key)
	delete(s.loaded, r.key)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
