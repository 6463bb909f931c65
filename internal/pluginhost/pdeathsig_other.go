//go:build !linux

package pluginhost

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; the plugin's parent watch in sdk.Serve ends it instead.
func setParentDeathSignal(*exec.Cmd) {}
