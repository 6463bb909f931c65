package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// floor is quicfloor's two halves, relaying to the main stack's fake
// (issue 25): the "floor" side of workloads 1 and 2. Its figures are what
// a relay over quic-go costs on this machine with no IOP code on the path,
// so that a run shows which part of IOP's figures is its own.
type floor struct {
	edge, node *daemon
	base       string // http://127.0.0.1:PORT of the edge half
}

// floorWorkloads are the workloads the floor runs: the warm-up, one
// stream and the concurrent streams. The others measure what a relay of
// bytes has no part in (a prefill's heartbeat, a cancel's way to the
// provider) or only repeat workload 1's figure.
var floorWorkloads = map[string]bool{"warm-up": true, "1": true, "2": true}

// startFloor starts quicfloor's edge half, then its node half relaying to
// target (the fake's URL), and waits until the edge half serves clients.
func startFloor(ctx context.Context, dir, bin, target string) (_ *floor, err error) {
	if bin == "" {
		return nil, fmt.Errorf("quicfloor was not built")
	}
	f := &floor{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	cert := filepath.Join(dir, "quicfloor.pem")
	if f.edge, err = startDaemon(dir, "quicfloor-edge", bin, "edge", "-http", "127.0.0.1:0", "-quic", "127.0.0.1:0", "-cert", cert); err != nil {
		return nil, err
	}
	quicAddr, err := f.edge.waitLine(ctx, "quic on ")
	if err != nil {
		return nil, err
	}
	if f.node, err = startDaemon(dir, "quicfloor-node", bin, "node", "-edge", quicAddr, "-cert", cert,
		"-target", strings.TrimPrefix(target, "http://")); err != nil {
		return nil, err
	}
	if f.base, err = f.edge.waitLine(ctx, "listening on ", f.node); err != nil {
		return nil, err
	}
	return f, nil
}

// procs are the floor's processes, named apart from IOP's in the tables.
func (f *floor) procs() []proc {
	return []proc{{"quicfloor edge", f.edge.cmd.Process.Pid}, {"quicfloor node", f.node.cmd.Process.Pid}}
}

// checkAlive reports a half that exited.
func (f *floor) checkAlive() error { return checkAlive(f.edge, f.node) }

// close stops both halves; a nil floor or half is a no-op.
func (f *floor) close() {
	if f == nil {
		return
	}
	f.node.stop(5 * time.Second)
	f.edge.stop(5 * time.Second)
}
