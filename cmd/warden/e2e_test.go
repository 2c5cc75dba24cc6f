//go:build unix

package main

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/warden-go/warden/internal/testkit"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The end-to-end tests build the warden binary once and run it as
// processes, several at once. The commands they run under `lock run` are
// this test binary again, in a helper mode chosen by WARDEN_CLI_TEST_HELPER.

var (
	wardenBin string // the built binary
	selfBin   string // this test binary, run as the locked command
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("WARDEN_CLI_TEST_HELPER"); mode != "" {
		os.Exit(helperMain(mode))
	}
	dir, err := os.MkdirTemp("", "warden-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wardenBin = filepath.Join(dir, "warden")
	args := []string{"build", "-o", wardenBin}
	if raceEnabled {
		args = append(args, "-race") // the processes are checked too
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building warden: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if selfBin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// helperMain is the locked command of the end-to-end tests. Files it
// uses are named by HELPER_* environment variables.
func helperMain(mode string) int {
	// ready announces that the helper runs and has set up its signal
	// handling, with its pid.
	ready := func() {
		if p := os.Getenv("HELPER_READY"); p != "" {
			tmp := p + ".tmp"
			if os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644) != nil || os.Rename(tmp, p) != nil {
				os.Exit(97)
			}
		}
	}
	const limit = 60 * time.Second // never outlive a broken test for long
	switch mode {
	case "exclusive":
		// Fails if another holder's command runs at the same time.
		dir := os.Getenv("HELPER_DIR")
		marker := filepath.Join(dir, "marker")
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "overlap:", err)
			return 99
		}
		f.Close()
		log, err := os.OpenFile(filepath.Join(dir, "tokens"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return 96
		}
		fmt.Fprintln(log, os.Getenv("WARDEN_LOCK_KEY"), os.Getenv("WARDEN_FENCING_TOKEN"))
		log.Close()
		time.Sleep(20 * time.Millisecond) // the work, done under the lock
		if os.Remove(marker) != nil {
			return 95
		}
		return 0
	case "wait-term":
		// Waits for SIGTERM, records it, exits with HELPER_EXIT.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		ready()
		select {
		case <-sig:
			os.WriteFile(os.Getenv("HELPER_OUT"), []byte("terminated"), 0o644)
			code, _ := strconv.Atoi(os.Getenv("HELPER_EXIT"))
			return code
		case <-time.After(limit):
			return 98
		}
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		ready()
		time.Sleep(limit)
		return 98
	case "sleep":
		ready()
		time.Sleep(limit)
		return 98
	case "wait-file":
		// Holds on until HELPER_STOP exists.
		ready()
		deadline := time.Now().Add(limit)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(os.Getenv("HELPER_STOP")); err == nil {
				return 0
			}
			time.Sleep(10 * time.Millisecond)
		}
		return 98
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 90
}

// proc is a warden process started by a test.
type proc struct {
	cmd    *exec.Cmd
	stdout testkit.LogBuffer
	stderr testkit.LogBuffer
	done   chan struct{}
	code   int
}

// startWarden starts the binary with the test's environment plus env.
func startWarden(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(wardenBin, args...), done: make(chan struct{})}
	// The locked commands are this test binary: under -race it would
	// sleep a second at exit unless told not to.
	p.cmd.Env = append(append(testEnv(), "GORACE=atexit_sleep_ms=0"), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit, however long that takes: a process
// that never exits is reported by go test's -timeout (and killed by the
// test's cleanup).
func (p *proc) wait(t *testing.T) result {
	t.Helper()
	<-p.done
	return result{code: p.code, stdout: p.stdout.String(), stderr: p.stderr.String()}
}

// runWarden runs the binary to completion.
func runWarden(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return startWarden(t, env, args...).wait(t)
}

// waitFile waits until a file exists and returns its content.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	var b []byte
	testkit.Eventually(t, 30*time.Second, "file "+filepath.Base(path), func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil
	})
	return string(b)
}

func e2eStore(t *testing.T) (dir, url string) {
	dir = t.TempDir()
	url = "sqlite://" + filepath.Join(dir, "warden.db")
	want(t, runWarden(t, nil, "--store", url, "migrate"), 0)
	return dir, url
}

// holder starts `lock run KEY` whose command holds on until stop() is
// called, and waits until it runs.
func holder(t *testing.T, url, key string) (p *proc, stop func()) {
	t.Helper()
	dir := t.TempDir()
	env := []string{"WARDEN_CLI_TEST_HELPER=wait-file", "HELPER_READY=" + filepath.Join(dir, "ready"), "HELPER_STOP=" + filepath.Join(dir, "stop")}
	p = startWarden(t, env, "--store", url, "lock", "run", key, "--", selfBin)
	waitFile(t, filepath.Join(dir, "ready"))
	return p, func() {
		if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestE2EConcurrentLockRunNeverOverlaps(t *testing.T) {
	dir, url := e2eStore(t)
	concurrentLockRuns(t, dir, url)
}

// concurrentLockRuns runs 8 `warden lock run` processes at once on one lock
// of the store at url, with exclusive-marker commands that use dir: the
// commands must run one at a time, in order of increasing fencing token,
// and the lock must be free afterwards.
func concurrentLockRuns(t *testing.T, dir, url string) {
	t.Helper()
	const n = 8
	env := []string{"WARDEN_CLI_TEST_HELPER=exclusive", "HELPER_DIR=" + dir}
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = startWarden(t, env, "--store", url, "lock", "run", "nightly-report", "--ttl", "10s", "--", selfBin)
	}
	for i, p := range procs {
		r := p.wait(t)
		if r.code != 0 {
			t.Fatalf("process %d: %s", i, r)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != n {
		t.Fatalf("want %d runs, got %d:\n%s", n, len(lines), b)
	}
	var last int64
	for _, l := range lines {
		key, tok, _ := strings.Cut(l, " ")
		v, err := strconv.ParseInt(tok, 10, 64)
		if key != "nightly-report" || err != nil || v <= last {
			t.Fatalf("runs in lock order must carry increasing fencing tokens:\n%s", b)
		}
		last = v
	}
	if _, err := os.Stat(filepath.Join(dir, "marker")); !os.IsNotExist(err) {
		t.Fatalf("a run left its marker: %v", err)
	}
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "nightly-report"), exitNotFound)
}

func TestE2EForceReleaseStopsCommand(t *testing.T) {
	dir, url := e2eStore(t)
	env := []string{"WARDEN_CLI_TEST_HELPER=wait-term", "HELPER_READY=" + filepath.Join(dir, "ready"), "HELPER_OUT=" + filepath.Join(dir, "out")}
	p := startWarden(t, env, "--store", url, "lock", "run", "job", "--ttl", "1s", "--grace", "20s", "--", selfBin)
	waitFile(t, filepath.Join(dir, "ready"))

	r := runWarden(t, nil, "--store", url, "lock", "release", "job", "--force")
	want(t, r, 0)

	r = p.wait(t)
	want(t, r, exitLeaseLost)
	if !strings.Contains(r.stderr, `warden: lock "job" lost`) || !strings.Contains(r.stderr, "SIGTERM") {
		t.Fatalf("lease-lost message: %s", r)
	}
	if out, _ := os.ReadFile(filepath.Join(dir, "out")); string(out) != "terminated" {
		t.Fatalf("the command was not sent SIGTERM (out %q)", out)
	}
}

func TestE2ELeaseLostKillsAfterGrace(t *testing.T) {
	dir, url := e2eStore(t)
	env := []string{"WARDEN_CLI_TEST_HELPER=ignore-term", "HELPER_READY=" + filepath.Join(dir, "ready")}
	p := startWarden(t, env, "--store", url, "lock", "run", "job", "--ttl", "1s", "--grace", "300ms", "--", selfBin)
	pid, err := strconv.Atoi(waitFile(t, filepath.Join(dir, "ready")))
	if err != nil {
		t.Fatal(err)
	}
	want(t, runWarden(t, nil, "--store", url, "lock", "release", "job", "--force"), 0)
	r := p.wait(t)
	want(t, r, exitLeaseLost)
	if !strings.Contains(r.stderr, "SIGKILL after 300ms") {
		t.Fatalf("message: %s", r)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the command (pid %d) still runs: %v", pid, err)
	}
}

func TestE2ENoWaitWhileHeld(t *testing.T) {
	_, url := e2eStore(t)
	h, stop := holder(t, url, "job")

	r := runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true")
	want(t, r, exitHeld)
	oneErrorLine(t, r)
	if !strings.Contains(r.stderr, `lock "job" is held by `) || !strings.Contains(r.stderr, " until ") {
		t.Fatalf("--no-wait message: %s", r)
	}
	r = runWarden(t, nil, "--store", url, "-o", "json", "lock", "run", "job", "--wait", "300ms", "--", "true")
	want(t, r, exitHeld)
	if !strings.Contains(r.stderr, "not acquired within 300ms") {
		t.Fatalf("--wait message: %s", r)
	}

	// The holder is listed by lock ls from another process.
	r = runWarden(t, nil, "--store", url, "lock", "ls")
	want(t, r, 0)
	wantLines(t, r, `KEY +OWNER +TOKEN +ACQUIRED +EXPIRES`, `job +\S+:\d+#[0-9a-f]{12} +\d+ +`+rfc3339ms+` +`+rfc3339ms)

	stop()
	want(t, h.wait(t), 0)
	want(t, runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true"), 0)
}

func TestE2ESignalsAreForwarded(t *testing.T) {
	dir, url := e2eStore(t)
	// The command catches SIGTERM and exits 7: warden exits 7.
	env := []string{"WARDEN_CLI_TEST_HELPER=wait-term", "HELPER_READY=" + filepath.Join(dir, "ready"), "HELPER_OUT=" + filepath.Join(dir, "out"), "HELPER_EXIT=7"}
	p := startWarden(t, env, "--store", url, "lock", "run", "job", "--", selfBin)
	waitFile(t, filepath.Join(dir, "ready"))
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != 7 || r.stderr != "" {
		t.Fatalf("want the command's exit code 7, got %s", r)
	}
	if out, _ := os.ReadFile(filepath.Join(dir, "out")); string(out) != "terminated" {
		t.Fatalf("SIGTERM was not forwarded (out %q)", out)
	}
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "job"), exitNotFound)

	// The command dies of the signal: 128+15.
	env = []string{"WARDEN_CLI_TEST_HELPER=sleep", "HELPER_READY=" + filepath.Join(dir, "ready2")}
	p = startWarden(t, env, "--store", url, "lock", "run", "job", "--", selfBin)
	waitFile(t, filepath.Join(dir, "ready2"))
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := p.wait(t); r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("want 143, got %s", r)
	}
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "job"), exitNotFound)
}

func TestE2EInterruptedWhileWaiting(t *testing.T) {
	_, url := e2eStore(t)
	h, stop := holder(t, url, "job")
	p := startWarden(t, nil, "--store", url, "lock", "run", "job", "--", "true")
	testkit.Eventually(t, 30*time.Second, "the waiting message", func() bool { return strings.Contains(p.stderr.String(), `waiting for lock "job"`) })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(t)
	if r.code != exitInterrupted || !strings.HasSuffix(r.stderr, "warden: interrupted\n") {
		t.Fatalf("want 130, got %s", r)
	}
	stop()
	want(t, h.wait(t), 0)
}

func TestE2EExitCodes(t *testing.T) {
	dir, url := e2eStore(t)
	r := runWarden(t, nil, "--help")
	want(t, r, 0)
	if !strings.Contains(r.stdout, "Exit codes:") {
		t.Fatalf("--help: %s", r)
	}
	want(t, runWarden(t, nil, "--store", url, "lock"), exitUsage)
	want(t, runWarden(t, nil, "--store", url, "cache", "get"), exitUsage)
	want(t, runWarden(t, nil, "--store", url, "--nope", "ping"), exitUsage)
	want(t, runWarden(t, nil, "--store", url, "cache", "get", "missing"), exitNotFound)
	r = runWarden(t, nil, "--store", url, "lock", "run", "k", "--", "sh", "-c", "exit 42")
	if r.code != 42 {
		t.Fatalf("want the command's code 42, got %s", r)
	}

	// Unreachable: a directory that does not exist, at once.
	r = runWarden(t, nil, "--store", "sqlite://"+filepath.Join(dir, "missing", "w.db"), "--timeout", "2s", "lock", "ls")
	want(t, r, exitUnreachable)
	// A store that does not answer: within --timeout.
	holdWriteLock(t, filepath.Join(dir, "warden.db"))
	r = runWarden(t, nil, "--store", url, "--timeout", "500ms", "cache", "set", "k", "v")
	want(t, r, exitUnreachable)
	// The --timeout path answered, not SQLite's own busy timeout.
	if !strings.Contains(r.stderr, "within 500ms") {
		t.Fatalf("timeout message: %s", r)
	}
}

// TestE2ERunFromRepositoryRoot checks the README's promise that `go run
// ./cmd/warden --help` works from the repository root.
func TestE2ERunFromRepositoryRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command again")
	}
	cmd := exec.Command("go", "run", "./cmd/warden", "--help")
	cmd.Dir = filepath.Join("..", "..")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run ./cmd/warden --help: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Exit codes:") {
		t.Fatalf("go run ./cmd/warden --help:\n%s", out.String())
	}
}
