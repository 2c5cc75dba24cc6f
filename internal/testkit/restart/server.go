//go:build unix

// Package restart runs the server-restart test of a warden store: the test
// owns a private database server process on a spare loopback port (in a
// temporary directory, killed when the test ends), opens stores on it,
// kills the server while a lock is held, waited for and watched, starts
// it again on the same port with the same data directory, and checks that
// the clients reconnect without being reopened, the waiter resumes, the
// watch stream reports the gap as EventsLost (or, where it is read back
// from the database, misses nothing) and then delivers events again, and
// that nothing is left running once everything is closed (see [Run]).
//
// Server is the process side; Scenario and Run are the test. The package
// is imported only from _test.go files.
package restart

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden/drivertest"
)

// Hang guards: how long a server may take to start or to stop before the
// test fails. They bound waits; they never time an assertion.
const (
	startWithin = 60 * time.Second
	stopWithin  = 30 * time.Second
)

// Server is a database server process a test owns. Fill in the exported
// fields, then Start it; the process (and every process of its group) is
// killed when the test ends.
type Server struct {
	// Name names the server in messages ("redis-server").
	Name string
	// Dir is the server's directory (data, sockets, logs).
	Dir string
	// Port is the loopback TCP port it listens on (SparePort).
	Port int
	// Cmd returns a new command that runs the server in the foreground;
	// it is called for every start. Its output goes to a log in Dir.
	Cmd func() *exec.Cmd
	// Ready reports nil once the server answers requests.
	Ready func(ctx context.Context) error
	// Stop is the signal Kill sends to the server process: 0 sends
	// SIGKILL to its whole process group. PostgreSQL gets SIGQUIT, its
	// immediate shutdown: every backend is killed at once, nothing is
	// checkpointed, and the next start recovers from the WAL, as after a
	// crash (a SIGKILL of the postmaster alone would leave its backends
	// holding the data directory).
	Stop syscall.Signal
	// Cred, if set, runs the server as that user (PostgreSQL refuses to
	// run as root).
	Cred *syscall.Credential

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // the process's exit status, once exited is closed
	log    string
	starts int
}

// SparePort returns a loopback TCP port that was free a moment ago.
func SparePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Missing skips the test because what it needs is not installed — or
// fails it when drivertest.RequireEnv asks for the store's server.
func Missing(t testing.TB, store, what string) {
	t.Helper()
	msg := "the " + store + " restart test needs " + what + " (testenv/up.sh installs it)"
	if drivertest.Required(store) {
		t.Fatal(msg + "; " + drivertest.RequireEnv + " requires it")
	}
	t.Skip(msg)
}

// Binary returns the path of the executable name, looked up in PATH and
// then in the directories matching each glob of dirs; if there is none it
// calls Missing.
func Binary(t testing.TB, store, name string, dirs ...string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, g := range dirs {
		ms, _ := filepath.Glob(filepath.Join(g, name))
		for i := len(ms) - 1; i >= 0; i-- { // the last: the newest version
			if fi, err := os.Stat(ms[i]); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return ms[i]
			}
		}
	}
	Missing(t, store, "the executable "+name)
	return ""
}

// Start starts the server and waits until Ready answers. The first start
// registers the cleanup that kills it when the test ends.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if s.cmd != nil {
		t.Fatalf("%s: Start while it runs", s.Name)
	}
	s.starts++
	s.log = filepath.Join(s.Dir, fmt.Sprintf("%s-%d.log", s.Name, s.starts))
	f, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if s.Cred != nil {
		_ = f.Chown(int(s.Cred.Uid), int(s.Cred.Gid))
	}
	cmd := s.Cmd()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.Cred}
	setDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", s.Name, err)
	}
	if s.starts == 1 {
		t.Cleanup(s.cleanup)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() {
		s.err = cmd.Wait()
		close(exited)
	}()
	s.waitReady(t)
}

// waitReady polls Ready until it answers nil, failing the test if the
// process exits or does not answer within startWithin.
func (s *Server) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(startWithin)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last = s.Ready(ctx)
		cancel()
		if last == nil {
			return
		}
		select {
		case <-s.exited:
			t.Fatalf("%s exited while starting (%v): %s", s.Name, s.err, s.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within %v (last error: %v): %s", s.Name, startWithin, last, s.Log())
		}
	}
}

// Kill stops the server abruptly (Stop, default SIGKILL to its process
// group) and waits until the process has exited.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		t.Fatalf("%s: Kill while it is not running", s.Name)
	}
	if err := s.signal(); err != nil {
		t.Fatalf("%s: %v", s.Name, err)
	}
	select {
	case <-s.exited:
	case <-time.After(stopWithin):
		t.Fatalf("%s did not exit within %v of being killed: %s", s.Name, stopWithin, s.Log())
	}
	s.cmd = nil
}

func (s *Server) signal() error {
	pid := s.cmd.Process.Pid
	var err error
	if s.Stop == 0 {
		err = syscall.Kill(-pid, syscall.SIGKILL)
	} else {
		err = syscall.Kill(pid, s.Stop)
	}
	if errors.Is(err, syscall.ESRCH) {
		return nil // gone already; exited is (or will be) closed
	}
	return err
}

// cleanup kills a server still running when the test ends, whatever Stop
// says, and waits for it.
func (s *Server) cleanup() {
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	if s.Stop != 0 {
		_ = syscall.Kill(pid, s.Stop) // let it stop its own children
		select {
		case <-s.exited:
		case <-time.After(stopWithin):
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(stopWithin):
	}
	s.cmd = nil
}

// Log returns the end of the current run's log, for failure messages.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "the end of " + s.log + ":\n" + strings.Join(lines, "\n")
}

// PrivateDir returns a new directory for a server that runs as cred (or
// as this process if cred is nil), removed when the test ends. It is made
// under os.TempDir rather than t.TempDir because another user must be
// able to reach it.
func PrivateDir(t testing.TB, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "warden-restart-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Unprivileged returns nil when the test does not run as root, and
// otherwise the credential of the system user name, for servers that
// refuse to run as root; Missing if there is no such user.
func Unprivileged(t testing.TB, store, name string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		Missing(t, store, "the system user "+name+" to run the server as (the test runs as root)")
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("user %s: uid %q, gid %q", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// RunOnce runs a setup command (initdb, mariadb-install-db) as cred (nil:
// as this process), failing the test with its output if it fails.
func RunOnce(t testing.TB, cred *syscall.Credential, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	setDeathSignal(cmd.SysProcAttr)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}
