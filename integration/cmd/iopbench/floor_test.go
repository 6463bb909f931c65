package main

import (
	"strings"
	"testing"
	"time"
)

// A wait for a daemon's line gives up as soon as a process it depends on
// exits (the floor's edge half waits on its node half), and the error
// names that process and ends with its log.
func TestWaitLineGivesUpWhenAnotherExits(t *testing.T) {
	dir := t.TempDir()
	d, err := startDaemon(dir, "waiter", "/bin/sh", "-c", "echo starting; exec sleep 30")
	if err != nil {
		t.Fatal(err)
	}
	defer d.stop(time.Second)
	other, err := startDaemon(dir, "other", "/bin/sh", "-c", "echo 'cannot reach the edge' >&2; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.waitLine(t.Context(), "listening on ", other)
	if err == nil || !strings.Contains(err.Error(), "other exited") || !strings.Contains(err.Error(), "cannot reach the edge") {
		t.Fatalf("err = %v, want other's exit and its log", err)
	}
	if d.exited() {
		t.Error("the waiter was stopped by the wait")
	}
	if got, err := d.waitLine(t.Context(), "start"); err != nil || got != "ing" {
		t.Errorf("a line it logged: %q, %v", got, err)
	}
}
