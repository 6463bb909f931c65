package served

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An Edge without data_dir keeps its memory in a private file of the
// user's cache directory, one per Edge identity and address, and clears
// out the files of Edges that have not run for a week (issue 26).
func TestAnEdgeWithoutDataDirRemembersInTheCacheDirectory(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	p1, err := CachePath("edge-1", "127.0.0.1:7443")
	if err != nil {
		t.Fatal(err)
	}
	if dir := filepath.Join(cache, "iop", "served"); filepath.Dir(p1) != dir {
		t.Fatalf("memory at %s, want in %s", p1, dir)
	}
	if fi, err := os.Stat(filepath.Dir(p1)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("cache directory %v (%v), want 0700", fi.Mode(), err)
	}
	if p2, _ := CachePath("edge-1", "127.0.0.1:7443"); p2 != p1 {
		t.Errorf("the same Edge got %s, then %s", p1, p2)
	}
	if p3, _ := CachePath("edge-1", "127.0.0.1:7444"); p3 == p1 {
		t.Error("two Edges on one machine share a memory")
	}

	m := Open(Options{Path: p1})
	if _, grace := m.Grace(); grace {
		t.Error("a first start with a cache directory is in grace: every unknown model would be 503")
	}

	stale := filepath.Join(filepath.Dir(p1), "edge-0000000000000000.json")
	if err := os.WriteFile(stale, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-8 * 24 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := CachePath("edge-1", "127.0.0.1:7443"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a week-old memory of another Edge is still there: %v", err)
	}
}
