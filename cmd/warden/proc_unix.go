//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// forwardedSignals are the signals warden handles: they interrupt a
// command, and `lock run` forwards them to its command.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// termSignal asks a command to stop.
var termSignal os.Signal = syscall.SIGTERM

// setProcessGroup starts the command in a process group of its own, so
// that warden can signal it and everything it started, and so that a
// terminal's Ctrl-C reaches it once (forwarded by warden), not twice.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to the command's process group.
func signalGroup(p *os.Process, sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok || syscall.Kill(-p.Pid, s) != nil {
		_ = p.Signal(sig)
	}
}

// killGroup kills the command's process group.
func killGroup(p *os.Process) {
	if syscall.Kill(-p.Pid, syscall.SIGKILL) != nil {
		_ = p.Kill()
	}
}

// exitStatus is a finished command's exit code, 128+N if signal N killed
// it (as shells report it).
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
