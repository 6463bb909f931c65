package ollamaapi

// Which Nodes a management call goes to (see manage.go).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/iop-dev/iop/internal/edge/dispatch"
	"github.com/iop-dev/iop/internal/edge/sched"
)

// selection is the Nodes a request names.
type selection struct {
	nodes  []string
	labels map[string]string
}

// selectionOf reads the Nodes the request names from the body's "nodes"
// and "labels", else from the X-IOP-Nodes and X-IOP-Labels headers.
func selectionOf(fields map[string]json.RawMessage, h http.Header) (selection, error) {
	var s selection
	if raw, ok := fields["nodes"]; ok {
		if err := json.Unmarshal(raw, &s.nodes); err != nil {
			return s, fmt.Errorf(`"nodes" must be a list of Node ids: %w`, err)
		}
	} else if v := h.Get(NodesHeader); v != "" {
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				s.nodes = append(s.nodes, n)
			}
		}
	}
	if raw, ok := fields["labels"]; ok {
		if err := json.Unmarshal(raw, &s.labels); err != nil {
			return s, fmt.Errorf(`"labels" must be an object of label values: %w`, err)
		}
	} else if v := h.Get(LabelsHeader); v != "" {
		s.labels = map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || strings.TrimSpace(k) == "" {
				return s, fmt.Errorf("%s: %q is not key=value", LabelsHeader, kv)
			}
			s.labels[strings.TrimSpace(k)] = strings.TrimSpace(val)
		}
	}
	return s, nil
}

// none reports whether the request names no Nodes at all.
func (s selection) none() bool { return len(s.nodes) == 0 && len(s.labels) == 0 }

// String describes the selection for a message: "" for none.
func (s selection) String() string {
	var b strings.Builder
	if len(s.nodes) > 0 {
		fmt.Fprintf(&b, " among Nodes %s", strings.Join(s.nodes, ", "))
	}
	if len(s.labels) > 0 {
		kv := make([]string, 0, len(s.labels))
		for k, v := range s.labels {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		fmt.Fprintf(&b, " with labels %s", strings.Join(kv, ","))
	}
	return b.String()
}

// matches reports whether labels has every label s asks for.
func (s selection) matches(labels map[string]string) bool {
	for k, v := range s.labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// choose is the parts of a call among nodes: every online provider of each
// Node s names (a Node named that cannot take it is a part failed with the
// reason); with no Node named, those of every ready Node, restricted to the
// providers that list held when it is set.
func (s selection) choose(nodes []dispatch.ManagedNode, held string) []*part {
	var parts []*part
	named := map[string]bool{}
	for _, n := range s.nodes {
		named[n] = true
	}
	refuse := func(id, why string) { parts = append(parts, &part{node: id, label: id, err: why}) }
	for _, n := range nodes {
		byID := named[n.ID]
		delete(named, n.ID)
		switch {
		case len(s.nodes) > 0 && !byID:
			continue
		case !s.matches(n.Labels):
			if byID {
				refuse(n.ID, "its labels do not match"+selection{labels: s.labels}.String())
			}
			continue
		case n.Unavailable != "":
			if !s.none() {
				refuse(n.ID, n.Unavailable)
			}
			continue
		}
		var provs []dispatch.ManagedProvider
		for _, p := range n.Providers {
			if held == "" || !s.none() || slices.ContainsFunc(p.Targets, func(t string) bool { return sched.SameModel(t, held) }) {
				provs = append(provs, p)
			}
		}
		if len(provs) == 0 {
			if !s.none() {
				refuse(n.ID, "it has no online Ollama provider")
			}
			continue
		}
		for _, p := range provs {
			label := n.ID
			if len(provs) > 1 {
				label = n.ID + "/" + p.Name
			}
			parts = append(parts, &part{node: n.ID, provider: p.Name, label: label})
		}
	}
	for _, id := range s.nodes {
		if named[id] {
			refuse(id, "not connected to this Edge")
			delete(named, id)
		}
	}
	return parts
}
