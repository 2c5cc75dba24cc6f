//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// forwardedSignals are the signals warden handles: they interrupt a
// command, and `lock run` forwards them to its command.
var forwardedSignals = []os.Signal{os.Interrupt}

// termSignal asks a command to stop; where signals cannot be sent it is
// delivered as a kill.
var termSignal = os.Interrupt

// setProcessGroup does nothing on systems without process groups.
func setProcessGroup(*exec.Cmd) {}

// signalGroup sends sig to the command, or kills it if the system cannot
// deliver sig.
func signalGroup(p *os.Process, sig os.Signal) {
	if p.Signal(sig) != nil {
		_ = p.Kill()
	}
}

// killGroup kills the command.
func killGroup(p *os.Process) { _ = p.Kill() }

// exitStatus is a finished command's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
