package fakeollama

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// memoryFake is a fake that holds one model at a time and takes 2s to
// load another, served in-process (a synctest bubble's clock paces it).
func memoryFake(t *testing.T, maxLoaded int, models ...Model) *Server {
	t.Helper()
	s := newUnlistened(models...)
	s.SetLoading(Loading{MaxLoaded: maxLoaded, LoadTime: 2 * time.Second})
	t.Cleanup(s.Close)
	return s
}

// chatDone is one /api/chat in flight; done is closed when it answered.
type chatDone struct {
	done chan struct{}
	at   time.Time
	code int
}

// chatAt sends a chat for model with keep_alive ka ("" for the default)
// and returns at once.
func chatAt(s *Server, model, ka string) *chatDone {
	c := &chatDone{done: make(chan struct{})}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]`, model)
	if ka != "" {
		body += `,"keep_alive":` + ka
	}
	body += "}"
	go func() {
		defer close(c.done)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/api/chat", strings.NewReader(body)))
		c.at, c.code = time.Now(), w.Code
	}()
	return c
}

// took waits for c and returns how long it took from start.
func (c *chatDone) took(t *testing.T, start time.Time) time.Duration {
	t.Helper()
	<-c.done
	if c.code != http.StatusOK {
		t.Fatalf("chat answered %d", c.code)
	}
	return c.at.Sub(start)
}

func psNames(t *testing.T, s *Server) []string {
	t.Helper()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/ps", nil))
	var ps ProcessResponse
	if err := json.Unmarshal(w.Body.Bytes(), &ps); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ps.Models {
		names = append(names, m.Name)
	}
	return names
}

// Issue 23: a server that holds one model loads a model not loaded in its
// load time, evicting the idle one; a loaded model answers at once; /api/ps
// and the counts follow.
func TestLoadingOneModelAtATimeEvictsTheIdleOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memoryFake(t, 1, Model{Name: "a"}, Model{Name: "b"})
		start := time.Now()
		if d := chatAt(s, "a", "").took(t, start); d != 2*time.Second {
			t.Fatalf("the first request for a took %v, want the 2s load", d)
		}
		start = time.Now()
		if d := chatAt(s, "a", "").took(t, start); d != 0 {
			t.Fatalf("a loaded: took %v, want no wait", d)
		}
		if got := psNames(t, s); !slices.Equal(got, []string{"a:latest"}) {
			t.Fatalf("/api/ps lists %v, want [a:latest]", got)
		}
		start = time.Now()
		if d := chatAt(s, "b", "").took(t, start); d != 2*time.Second {
			t.Fatalf("b took %v, want the 2s load", d)
		}
		if got := psNames(t, s); !slices.Equal(got, []string{"b:latest"}) {
			t.Fatalf("/api/ps lists %v, want [b:latest] (a evicted)", got)
		}
		st := s.Loads()
		if st.Loads != 2 || st.Evictions != 1 || st.ByModel["a:latest"] != 1 || st.ByModel["b:latest"] != 1 {
			t.Errorf("loads %+v, want 2 (a, b) and 1 eviction", st)
		}
	})
}

// Issue 23, as Ollama's scheduler: with every loaded model in use, a
// request for another waits until one is free, and requests behind it
// wait too, even for the loaded model (one queue of pending requests).
// Two requests for a model being loaded share the one load.
func TestLoadingWaitsForAModelInUseAndHoldsTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memoryFake(t, 1, Model{Name: "a", Text: "x y z", TokenDelay: time.Second}, Model{Name: "b"})
		start := time.Now()
		first, second := chatAt(s, "a", ""), chatAt(s, "a", "")
		synctest.Wait()
		if d1, d2 := first.took(t, start), second.took(t, start); d1 != 4*time.Second || d2 != 4*time.Second {
			t.Fatalf("two requests for a took %v and %v, want one 2s load and 2s of tokens each", d1, d2)
		}
		start = time.Now()
		long := chatAt(s, "a", "") // a in use for 2s
		synctest.Wait()
		b := chatAt(s, "b", "")
		synctest.Wait()
		behind := chatAt(s, "a", "")
		if d := long.took(t, start); d != 2*time.Second {
			t.Fatalf("a took %v", d)
		}
		if d := b.took(t, start); d != 4*time.Second {
			t.Fatalf("b took %v, want a's 2s then its 2s load", d)
		}
		if d := behind.took(t, start); d != 8*time.Second {
			t.Fatalf("a behind b took %v, want b's load, a's load again and its 2s", d)
		}
		if st := s.Loads(); st.Loads != 3 || st.Evictions != 2 {
			t.Errorf("loads %+v, want a, b, a again", st)
		}
	})
}

// Issue 23: below MaxLoaded nothing is evicted; an idle model past its
// keep_alive is unloaded, and keep_alive 0 unloads it when its request
// ends.
func TestLoadingKeepsModelsUpToMaxAndFollowsKeepAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memoryFake(t, 2, Model{Name: "a"}, Model{Name: "b"}, Model{Name: "c"})
		start := time.Now()
		chatAt(s, "a", `"10s"`).took(t, start)
		chatAt(s, "b", "").took(t, start)
		if got := psNames(t, s); !slices.Equal(got, []string{"a:latest", "b:latest"}) {
			t.Fatalf("/api/ps lists %v, want [a:latest b:latest]", got)
		}
		time.Sleep(11 * time.Second) // a idle past its 10s
		start = time.Now()
		if d := chatAt(s, "c", "0").took(t, start); d != 2*time.Second {
			t.Fatalf("c took %v", d)
		}
		if got := psNames(t, s); !slices.Equal(got, []string{"b:latest"}) {
			t.Fatalf("/api/ps lists %v, want [b:latest]: a expired, c unloaded at once (keep_alive 0)", got)
		}
		if st := s.Loads(); st.Loads != 3 || st.Evictions != 0 {
			t.Errorf("loads %+v, want 3 and no eviction", st)
		}
	})
}

// The control API sets the loading and reads the counts.
func TestLoadingThroughTheControlAPI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newUnlistened(Model{Name: "a"})
		defer s.Close()
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/_fake/loading", strings.NewReader(`{"max_loaded":1,"load_time":1000000000}`)))
		if w.Code != http.StatusNoContent {
			t.Fatalf("PUT /_fake/loading: %d %s", w.Code, w.Body)
		}
		start := time.Now()
		if d := chatAt(s, "a", "").took(t, start); d != time.Second {
			t.Fatalf("took %v, want the 1s load", d)
		}
		w = httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/_fake/loads", nil))
		var st LoadStats
		if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Loads != 1 || !slices.Equal(st.Loaded, []string{"a:latest"}) {
			t.Fatalf("GET /_fake/loads: %s (%v)", w.Body, err)
		}
		w = httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/_fake/loading", strings.NewReader(`{"max_loaded":-1}`)))
		if w.Code != http.StatusBadRequest {
			t.Errorf("a negative max_loaded: %d", w.Code)
		}
	})
}
