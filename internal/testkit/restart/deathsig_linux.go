package restart

import "syscall"

// setDeathSignal has the kernel kill the server if the test process dies
// without running its cleanups (a test binary killed by its -timeout).
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
