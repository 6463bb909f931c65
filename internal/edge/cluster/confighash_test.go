package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/edge/cluster"
	"github.com/iop-dev/iop/internal/edge/edgeconfig"
	"github.com/iop-dev/iop/internal/pgtest"
)

// sharedFile is an Edge's configuration with every section the hash
// covers; edge writes the parts that are each Edge's own.
func sharedFile(edge string) string {
	return `
edge_id: ` + edge + `
identity: {mode: loopback}
listen: {quic: "127.0.0.1:7443", http: "0.0.0.0:8080"}
api:
  allowed_hosts: [` + edge + `.lan]
  allowed_origins: ["https://a.example", "https://b.example"]
  keys:
    - {principal: alice, sha256: "` + strings.Repeat("a", 64) + `"}
    - {principal: bob, sha256: "` + strings.Repeat("b", 64) + `"}
principals:
  - {name: alice, routes: [chat, code], admin: true}
  - {name: bob, routes: [chat]}
profiles:
  - {name: batch, queue_timeout: 30s}
routes:
  - {name: chat, model: llama3.2, targets: [{target: llama3.2:latest}, {target: llama3.1}]}
  - {name: code, model: qwen, profile: batch}
`
}

func parse(t *testing.T, file string) *edgeconfig.Config {
	t.Helper()
	c, err := edgeconfig.Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The hash covers what must agree across the cluster and only that: the
// same meaning in another order or case hashes the same, an Edge's own
// sections do not count, and any change to a shared one does.
func TestConfigHashCoversTheSharedSectionsOnly(t *testing.T) {
	base := cluster.ConfigHash(parse(t, sharedFile("edge-a")))
	if !strings.HasPrefix(base, "sha256:") || len(base) != len("sha256:")+64 {
		t.Fatalf("hash %q", base)
	}
	if other := cluster.ConfigHash(parse(t, sharedFile("edge-b"))); other != base {
		t.Errorf("edge_id and allowed_hosts changed the hash: they are each Edge's own")
	}
	reordered := strings.NewReplacer(
		`    - {principal: alice, sha256: "`+strings.Repeat("a", 64)+`"}
    - {principal: bob, sha256: "`+strings.Repeat("b", 64)+`"}`,
		`    - {principal: bob, sha256: "`+strings.Repeat("B", 64)+`"}
    - {principal: alice, sha256: "`+strings.Repeat("a", 64)+`"}`,
		"routes: [chat, code]", "routes: [code, chat]",
		`["https://a.example", "https://b.example"]`, `["https://b.example", "https://a.example"]`,
	).Replace(sharedFile("edge-a"))
	if got := cluster.ConfigHash(parse(t, reordered)); got != base {
		t.Errorf("the same configuration in another order hashes differently")
	}
	for name, change := range map[string]func(string) string{
		"a key": func(f string) string { return strings.Replace(f, strings.Repeat("b", 64), strings.Repeat("c", 64), 1) },
		"a principal": func(f string) string {
			return strings.Replace(f, "{name: bob, routes: [chat]}", "{name: bob, routes: [chat, code]}", 1)
		},
		"a route": func(f string) string { return strings.Replace(f, "{target: llama3.1}", "{target: llama3.1:8b}", 1) },
		"targets order": func(f string) string {
			return strings.Replace(f, "{target: llama3.2:latest}, {target: llama3.1}", "{target: llama3.1}, {target: llama3.2:latest}", 1)
		},
		"a profile": func(f string) string { return strings.Replace(f, "queue_timeout: 30s", "queue_timeout: 31s", 1) },
		"an origin": func(f string) string { return strings.Replace(f, `"https://b.example"`, `"https://c.example"`, 1) },
	} {
		if cluster.ConfigHash(parse(t, change(sharedFile("edge-a")))) == base {
			t.Errorf("changing %s left the hash as it was", name)
		}
	}
}

// Issue 22: the cluster view marks the Edge whose configuration differs
// from the others', and stops marking it once a reload makes it agree.
func TestTheViewMarksTheEdgeWhoseConfigurationDiffers(t *testing.T) {
	dsn := pgtest.Start(t)
	cfg := parse(t, sharedFile("x"))
	a := join(t, dsn, "edge-a", cluster.Options{})
	b := join(t, dsn, "edge-b", cluster.Options{})
	c := join(t, dsn, "edge-c", cluster.Options{})
	a.PublishConfig(cfg)
	b.PublishConfig(cfg)
	c.PublishConfig(parse(t, strings.Replace(sharedFile("x"), "queue_timeout: 30s", "queue_timeout: 1m", 1)))
	hashes := func(ms []cluster.Member) bool {
		return len(ms) == 3 && ms[0].ConfigHash != "" && ms[0].ConfigHash == ms[1].ConfigHash && ms[2].ConfigHash != "" && ms[2].ConfigHash != ms[0].ConfigHash
	}
	waitFor(t, a, 10*time.Second, "a sees every hash", hashes)
	v := a.View(context.Background())
	if v.ConfigAgreed {
		t.Error("the view says the configurations agree")
	}
	for _, e := range v.Edges {
		if want := e.ID == "edge-c"; e.ConfigDiffers != want {
			t.Errorf("%s: config_differs = %v, want %v", e.ID, e.ConfigDiffers, want)
		}
	}
	// edge-c reloads the others' file.
	c.PublishConfig(cfg)
	waitFor(t, a, 10*time.Second, "a sees edge-c agree", func(ms []cluster.Member) bool {
		return len(ms) == 3 && ms[2].ConfigHash == ms[0].ConfigHash
	})
	if v := a.View(context.Background()); !v.ConfigAgreed || v.Edges[2].ConfigDiffers {
		t.Errorf("after the reload: agreed %v, edges %+v", v.ConfigAgreed, v.Edges)
	}
}
