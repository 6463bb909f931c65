package wake

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/iop-dev/iop/internal/edge/datadir"
)

// FileName is the memory's file in data_dir.
const FileName = "wake.json"

// fileVersion is the version of the file's shape; another is not read.
const fileVersion = 1

// file is the memory's shape: every Node some Node can wake, what it
// served when last connected, and who can wake it.
type file struct {
	Version int         `json:"version"`
	Nodes   []fileEntry `json:"nodes"`
}

type fileEntry struct {
	Node   string      `json:"node"`
	Offers []Offer     `json:"offers"`
	Wakers []fileWaker `json:"wakers"`
}

type fileWaker struct {
	Node string `json:"node"`
	Target
}

// fileLocked is the memory as the file holds it.
func (t *Tracker) fileLocked() []byte {
	f := file{Version: fileVersion, Nodes: []fileEntry{}}
	for _, id := range slices.Sorted(maps.Keys(t.nodes)) {
		n := t.nodes[id]
		if len(n.wakers) == 0 {
			continue
		}
		e := fileEntry{Node: id, Offers: n.offers, Wakers: []fileWaker{}}
		if e.Offers == nil {
			e.Offers = []Offer{}
		}
		for _, w := range slices.Sorted(maps.Keys(n.wakers)) {
			e.Wakers = append(e.Wakers, fileWaker{Node: w, Target: n.wakers[w]})
		}
		f.Nodes = append(f.Nodes, e)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil { // only our own types: a bug
		panic("wake: marshal: " + err.Error())
	}
	return append(b, '\n')
}

// read reads the memory at path: none for a missing file; the bytes read,
// so an unchanged memory is not written again.
func read(path string) (map[string]*node, []byte, error) {
	nodes := map[string]*node{}
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nodes, nil, nil
	}
	if err := datadir.Check(filepath.Dir(path), filepath.Base(path)); err != nil {
		return nodes, nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nodes, nil, err
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nodes, nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Version != fileVersion {
		return nodes, nil, fmt.Errorf("%s: version %d, this Edge reads version %d", path, f.Version, fileVersion)
	}
	for _, e := range f.Nodes {
		if e.Node == "" {
			continue
		}
		n := &node{offers: e.Offers, wakers: map[string]Target{}}
		for _, w := range e.Wakers {
			if w.Node != "" {
				n.wakers[w.Node] = w.Target
			}
		}
		nodes[e.Node] = n
	}
	return nodes, b, nil
}

// writeFile writes the memory atomically, with the data_dir file mode.
func writeFile(path string, b []byte) error { return datadir.WriteFile(path, b) }
