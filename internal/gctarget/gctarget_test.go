package gctarget

import (
	"runtime/debug"
	"testing"
)

func TestApplySetsTheTargetUnlessGOGCIsSet(t *testing.T) {
	was := debug.SetGCPercent(100)
	defer debug.SetGCPercent(was)

	apply(func(string) (string, bool) { return "", false })
	if now := debug.SetGCPercent(100); now != Percent {
		t.Fatalf("without GOGC: the runtime's target is %d, want %d", now, Percent)
	}

	// With GOGC set, the target the runtime took from it stays, whatever
	// it is (here 100, as the runtime would have set it from GOGC=100).
	apply(func(k string) (string, bool) { return "100", k == "GOGC" })
	if now := debug.SetGCPercent(100); now != 100 {
		t.Fatalf("with GOGC=100: the runtime's target is %d, want 100 (left alone)", now)
	}

	debug.SetGCPercent(-1) // as GOGC=off leaves it
	apply(func(k string) (string, bool) { return "off", k == "GOGC" })
	if now := debug.SetGCPercent(100); now != -1 {
		t.Fatalf("with GOGC=off: the runtime's target is %d, want -1 (left alone)", now)
	}
}
