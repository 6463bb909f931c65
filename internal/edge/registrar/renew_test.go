package registrar

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Issue 24 gap 7: renewal is rate-limited per Node: a second renewal
// within the spacing (renewSpacing: ten minutes, or a tenth of the
// lifetime if shorter) is refused with a typed error saying when to try
// again, and issues nothing. Other Nodes are not held back.
func TestRenewalsAreRateLimitedPerNode(t *testing.T) {
	f := newFixture(t)
	f.svc.opts.Lifetime = 24 * time.Hour
	if _, err := f.svc.Renew("gpu-1", csr(t)); err != nil {
		t.Fatal(err)
	}
	renewed := f.now
	_, err := f.svc.Renew("gpu-1", csr(t))
	var later *RenewLaterError
	if !errors.As(err, &later) || !errors.Is(err, ErrRenewTooSoon) {
		t.Fatalf("second renewal at once: %v, want a RenewLaterError", err)
	}
	if want := renewed.Add(10 * time.Minute); !later.RetryAt.Equal(want) || !strings.Contains(err.Error(), want.UTC().Format(time.RFC3339)) {
		t.Errorf("retry at %s (%q), want %s", later.RetryAt, err, want)
	}
	if _, err := f.svc.Renew("gpu-2", csr(t)); err != nil {
		t.Errorf("another node: %v", err)
	}
	f.now = renewed.Add(10*time.Minute - time.Second)
	if _, err := f.svc.Renew("gpu-1", csr(t)); !errors.Is(err, ErrRenewTooSoon) {
		t.Errorf("a second before the spacing ends: %v", err)
	}
	f.now = renewed.Add(10 * time.Minute)
	if _, err := f.svc.Renew("gpu-1", csr(t)); err != nil {
		t.Errorf("once the spacing ended: %v", err)
	}
	content, _ := f.backend.Contents(t.Context())
	if n := countCerts(content, "gpu-1"); n != 2 {
		t.Errorf("gpu-1 has %d certificates recorded, want 2", n)
	}

	// A short lifetime: a tenth of it. A join counts as an issue too.
	f.svc.opts.Lifetime = time.Minute
	tok, _, _ := f.svc.NewToken("gpu-3", time.Hour)
	f.joinLeaf(tok)
	joined := f.now
	if _, err := f.svc.Renew("gpu-3", csr(t)); !errors.As(err, &later) || !later.RetryAt.Equal(joined.Add(6*time.Second)) {
		t.Errorf("renewal just after the join, 1m lifetime: %v, want retry at +6s", err)
	}
	f.now = joined.Add(6 * time.Second)
	if _, err := f.svc.Renew("gpu-3", csr(t)); err != nil {
		t.Errorf("6s after the join: %v", err)
	}
}

func countCerts(c Contents, nodeID string) int {
	n := 0
	for _, r := range c.Certs {
		if r.NodeID == nodeID {
			n++
		}
	}
	return n
}

// Issue 24 gap 7: records end. A certificate superseded by a renewal is
// pruned once it expired; the Node's newest certificate and used tokens
// are kept for keepAfterExpiry after they end (so that `node list` still
// names them), then pruned.
func TestPruneDropsExpiredAndSupersededRecords(t *testing.T) {
	f := newFixture(t) // 1h certificates
	t0 := f.now
	tok, _, _ := f.svc.NewToken("gpu-1", time.Hour)
	a := f.joinLeaf(tok)
	f.now = t0.Add(50 * time.Minute)
	if _, err := f.svc.Renew("gpu-1", csr(t)); err != nil {
		t.Fatal(err)
	}
	f.now = t0.Add(100 * time.Minute)
	chain, err := f.svc.Renew("gpu-1", csr(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.svc.NewToken("gpu-2", time.Minute); err != nil {
		t.Fatal(err)
	}

	pruned, err := f.backend.Prune(t.Context(), f.now)
	content, _ := f.backend.Contents(t.Context())
	if err != nil || pruned != 1 || countCerts(content, "gpu-1") != 2 {
		t.Fatalf("prune at +100m: %d pruned (%v), certificates %+v; want the join's (expired, superseded) alone pruned", pruned, err, content.Certs)
	}
	for _, c := range content.Certs {
		if c.Serial == Serial(a) {
			t.Errorf("the expired, superseded certificate %s is kept", c.Serial)
		}
	}
	if len(content.Tokens) != 2 {
		t.Errorf("tokens: %+v, want both (ended less than %s ago)", content.Tokens, keepAfterExpiry)
	}

	// The newest certificate is kept until keepAfterExpiry after its end.
	newest := chainLeaf(t, chain)
	f.now = newest.NotAfter.Add(keepAfterExpiry - time.Second)
	if _, err := f.backend.Prune(t.Context(), f.now); err != nil {
		t.Fatal(err)
	}
	content, _ = f.backend.Contents(t.Context())
	if len(content.Certs) != 1 || content.Certs[0].Serial != Serial(newest) {
		t.Errorf("before its margin ends: %+v, want the newest certificate alone", content.Certs)
	}
	f.now = newest.NotAfter.Add(keepAfterExpiry + time.Second)
	if _, err := f.backend.Prune(t.Context(), f.now); err != nil {
		t.Fatal(err)
	}
	content, _ = f.backend.Contents(t.Context())
	if len(content.Certs)+len(content.Tokens) != 0 {
		t.Errorf("past every margin: %+v", content)
	}
	if len(content.Nodes) != 1 {
		t.Errorf("node records: %+v, want gpu-1's kept", content.Nodes)
	}
}

// Issue 24 gap 7: a running Edge prunes the store every pruneEvery, not
// only when it opens it.
func TestARunningEdgePrunesTheStorePeriodically(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t)
		f.svc.opts.Now = time.Now // the bubble's clock
		if _, err := f.svc.Renew("gpu-1", csr(t)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { f.svc.keepPruned(ctx, pruneEvery) })
		defer func() { cancel(); wg.Wait() }()

		time.Sleep(time.Hour + keepAfterExpiry + pruneEvery + time.Minute)
		synctest.Wait()
		content, err := f.backend.Contents(t.Context())
		if err != nil || len(content.Certs) != 0 {
			t.Errorf("a week after the certificate ended: %+v %v, want it pruned", content.Certs, err)
		}
	})
}
