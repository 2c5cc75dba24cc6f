//go:build unix && !linux

package restart

import "syscall"

// setDeathSignal: only Linux can tie a child's life to its parent's.
func setDeathSignal(*syscall.SysProcAttr) {}
