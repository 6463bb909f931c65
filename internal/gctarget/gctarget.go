// Package gctarget sets the garbage collector's target of the IOP daemons.
//
// Go starts a collection when the heap has grown by GOGC percent (100 by
// default) over what the last one left live, and never below 4 MiB times
// GOGC/100. A relay's live heap is small and its allocation slow: at 64
// streams the Edge and the Node each keep 1.5 to 3 MiB live and allocate
// about a hundred bytes per relayed token, so at 100 most of each daemon's
// heap is garbage waiting for a collection that the 4 MiB floor puts off.
// At 50 the floor is 2 MiB and the heap peaks at 1.5 times what is live:
// issue 25 measured 2.9 MiB less resident at 64 streams, summed over the
// two daemons, for no CPU per token that the benchmark could tell apart.
//
// GOGC in the environment (or GOGC=off) still decides when it is set: the
// runtime reads it at start, and Apply leaves it alone. The target in
// force shows in /metrics as go_gc_gogc_percent.
package gctarget

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC the daemons run with when the environment sets none.
const Percent = 50

// Apply sets the collector's target to Percent unless GOGC is set in the
// environment.
func Apply() { apply(os.LookupEnv) }

func apply(lookup func(string) (string, bool)) {
	if _, set := lookup("GOGC"); !set {
		debug.SetGCPercent(Percent)
	}
}
