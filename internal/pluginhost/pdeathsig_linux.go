package pluginhost

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks the kernel to SIGKILL the plugin when the host
// dies, so a killed Node takes its plugins with it. (The kernel sends it
// when the OS thread that started the child exits; the Go runtime does not
// retire threads that started processes unless they were locked with
// runtime.LockOSThread, which the host does not do. The plugin's own parent
// watch in sdk.Serve is the second line.)
func setParentDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
