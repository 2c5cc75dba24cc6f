//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
)

// End-to-end checks of the messages and exit codes a newcomer meets first,
// through the built binary.

// TestE2ELongKeysCutInMessages: a 10 KB key is refused (exit 2) in one short
// line that names the key's length instead of echoing it.
func TestE2ELongKeysCutInMessages(t *testing.T) {
	_, url := e2eStore(t)
	key := strings.Repeat("k", 10240)
	for _, args := range [][]string{
		{"cache", "set", key, "v"},
		{"cache", "get", key},
		{"lock", "run", key, "--", "true"},
		{"breaker", "open", key},
	} {
		r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
		want(t, r, exitUsage)
		oneErrorLine(t, r)
		if len(r.stderr) > 300 || !strings.Contains(r.stderr, "…(10240 bytes)") || !strings.Contains(r.stderr, strings.Repeat("k", maxShown)) {
			t.Fatalf("%s %s: want one short line naming the key's length, got %d bytes: %.400s", args[0], args[1], len(r.stderr), r.stderr)
		}
	}
}

// TestE2ELockRunCommandNotStarted: the README's table — 127 when the command
// is not found, 126 when it cannot be executed.
func TestE2ELockRunCommandNotStarted(t *testing.T) {
	dir, url := e2eStore(t)
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  string
		code int
	}{
		{"/nonexistent/cmd", 127},
		{"warden-no-such-command-in-path", 127},
		{notExec, 126},
	} {
		r := runWarden(t, nil, "--store", url, "lock", "run", "x", "--", c.cmd)
		if r.code != c.code {
			t.Fatalf("lock run -- %s: want exit %d, got %s", c.cmd, c.code, r)
		}
		oneErrorLine(t, r)
	}
	// The lock was released each time.
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "x"), exitNotFound)
}

// TestE2ETTLTooShort: a --ttl under lock.MinTTL (100ms) is refused before
// anything runs, naming the minimum — 10ms too, which lock.MinTTL once
// allowed and which lost its lease most of the time.
func TestE2ETTLTooShort(t *testing.T) {
	_, url := e2eStore(t)
	for _, ttl := range []string{"1ms", "10ms", (lock.MinTTL - time.Millisecond).String()} {
		r := runWarden(t, nil, "--store", url, "lock", "run", "--ttl", ttl, "x", "--", "true")
		want(t, r, exitUsage)
		oneErrorLine(t, r)
		if !strings.Contains(r.stderr, "--ttl "+ttl+": want at least "+lock.MinTTL.String()) {
			t.Fatalf("--ttl %s: want the minimum %v named: %s", ttl, lock.MinTTL, r)
		}
	}
	// The help says the minimum too.
	r := runWarden(t, nil, "lock", "run", "--help")
	if !strings.Contains(r.stdout, "--ttl (at least "+lock.MinTTL.String()+")") || !strings.Contains(r.stdout, "(at least "+lock.MinTTL.String()+"); renewed") {
		t.Fatalf("lock run --help does not give the minimum TTL %v:\n%s", lock.MinTTL, r.stdout)
	}
}

// TestE2ELockRunAtMinTTL: `lock run --ttl` at the minimum it accepts keeps
// its lease while the command runs for many TTLs: the command finds the
// lock still held with its own fencing token at the end, and warden exits
// 0 having released it. (At the former minimum of 10ms the lease was lost
// — exit 6 — most of the time.)
//
// A refresh of a 100ms lease has about 63ms to be sent and answered; on a
// machine oversubscribed by the rest of the test run an fsync can take
// longer, and then losing the lease (exit 6, the command stopped) is the
// right outcome, not a defect. So a run that ends in exactly that outcome
// is tried again on a fresh key, up to attempts times; the test fails when
// every attempt loses the lease (what the former 10ms minimum did) or any
// attempt ends in anything else.
func TestE2ELockRunAtMinTTL(t *testing.T) {
	_, url := e2eStore(t)
	ttl := lock.MinTTL.String()
	const attempts = 3
	for i := 1; i <= attempts; i++ {
		key := fmt.Sprintf("x%d", i)
		script := `echo "token $WARDEN_FENCING_TOKEN"; sleep 1; exec "$WARDEN" --store "$STORE" -o json lock show "$KEY"`
		r := runWarden(t, []string{"WARDEN=" + wardenBin, "STORE=" + url, "KEY=" + key}, "--store", url, "lock", "run", "--ttl", ttl, key, "--", "sh", "-c", script)
		if r.code == exitLeaseLost && strings.HasPrefix(r.stderr, "warden: lock \""+key+"\" lost: ") {
			t.Logf("attempt %d of %d lost its %s lease (a refresh answered too late on a loaded machine): %s", i, attempts, ttl, r)
			continue
		}
		want(t, r, 0)
		if r.stderr != "" {
			t.Fatalf("lock run --ttl %s wrote to stderr: %s", ttl, r)
		}
		first, rest, _ := strings.Cut(r.stdout, "\n")
		var rec struct {
			Key   string `json:"key"`
			Token int64  `json:"token"`
		}
		if err := json.Unmarshal([]byte(rest), &rec); err != nil {
			t.Fatalf("lock show from the command: %v: %s", err, r)
		}
		if first != fmt.Sprintf("token %d", rec.Token) || rec.Key != key || rec.Token == 0 {
			t.Fatalf("after 1s (%d TTLs) the lock is not the command's own holding: %s", time.Second/lock.MinTTL, r)
		}
		want(t, runWarden(t, nil, "--store", url, "lock", "show", key), exitNotFound)
		return
	}
	t.Fatalf("lock run --ttl %s lost its lease in all %d attempts", ttl, attempts)
}

// TestE2EInvalidPortIsUsage: a port no store can dial is a bad store URL
// (2), not an unreachable store (5); no server is needed to tell.
func TestE2EInvalidPortIsUsage(t *testing.T) {
	for _, url := range []string{
		"mysql://root@127.0.0.1:99999/x",
		"mysql://root@127.0.0.1:0/x",
		"mongodb://127.0.0.1:27017,127.0.0.1:70000/db",
		"dynamodb://table?endpoint=http://127.0.0.1:99999",
	} {
		r := runWarden(t, nil, "--store", url, "--timeout", "5s", "ping")
		want(t, r, exitUsage)
		oneErrorLine(t, r)
		if !strings.Contains(r.stderr, "invalid port") || strings.Contains(r.stderr, "unreachable") {
			t.Fatalf("%s: %s", url, r)
		}
	}
}

// TestE2ENestedPasswordNeverPrinted: the password of a URL given as a query
// parameter (DynamoDB's endpoint) is masked in errors and in --help.
func TestE2ENestedPasswordNeverPrinted(t *testing.T) {
	for _, url := range []string{
		"dynamodb://t?endpoint=http://u:s3cret@127.0.0.1:1",
		"dynamodb://table?endpoint=http%3A%2F%2Fu%3As3cret%40127.0.0.1%3A1&bogus=1",
	} {
		for _, args := range [][]string{{"ping"}, {"--help"}, {"lock", "ls", "--help"}} {
			r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
			if strings.Contains(r.stdout+r.stderr, "s3cret") {
				t.Fatalf("%s %q printed the password: %s", url, args, r)
			}
		}
		r := runWarden(t, []string{"WARDEN_STORE=" + url}, "--help")
		if strings.Contains(r.stdout+r.stderr, "s3cret") || !strings.Contains(r.stdout, "xxxxx") {
			t.Fatalf("--help with WARDEN_STORE=%s: %s", url, r)
		}
	}
}

// TestE2EUnreachableStoreOneLine: a store nobody answers for is reported
// once, as warden's error line with exit 5 — no driver's own log lines
// (go-redis logs every failed dial to the standard logger unless told not
// to), and no password.
func TestE2EUnreachableStoreOneLine(t *testing.T) {
	for _, url := range []string{
		"redis://:s3cret@127.0.0.1:1/0",
		"postgres://u:s3cret@127.0.0.1:1/db?sslmode=disable",
		"mysql://u:s3cret@127.0.0.1:1/app?timeout=2s",
	} {
		r := runWarden(t, nil, "--store", url, "ping")
		want(t, r, exitUnreachable)
		oneErrorLine(t, r)
		if strings.Contains(r.stdout+r.stderr, "s3cret") {
			t.Fatalf("%s printed the password: %s", url, r)
		}
	}
}

// TestE2EStoreURLMessages: a store URL without a scheme says so and lists the
// registered schemes; a URL ending in a colon is quoted, not followed by
// a second colon.
func TestE2EStoreURLMessages(t *testing.T) {
	r := runWarden(t, nil, "--store", "not a url", "ping")
	want(t, r, exitUsage)
	oneErrorLine(t, r)
	if !strings.Contains(r.stderr, "needs a scheme") || !strings.Contains(r.stderr, "registered schemes are dynamodb, memory, mongodb, mongodb+srv, mysql, postgres, postgresql, redis, rediss, sqlite, unix") || strings.Contains(r.stderr, `scheme ""`) {
		t.Fatalf("no scheme: %s", r)
	}
	dir := t.TempDir()
	for _, url := range []string{
		"sqlite:",
		"sqlite://" + filepath.Join(dir, "missing", "w.db") + "?prefix=billing:",
	} {
		r := runWarden(t, nil, "--store", url, "--timeout", "5s", "lock", "ls")
		oneErrorLine(t, r)
		if strings.Contains(r.stderr, "::") || !strings.Contains(r.stderr, `open "`+url+`": `) {
			t.Fatalf("%s: %s", url, r)
		}
	}
}

// TestE2EBreakerCloseUnknown: closing a circuit without a record exits 4 and
// creates nothing; closing an existing one still forces it closed.
func TestE2EBreakerCloseUnknown(t *testing.T) {
	_, url := e2eStore(t)
	r := runWarden(t, nil, "--store", url, "breaker", "close", "TYPO")
	want(t, r, exitNotFound)
	oneErrorLine(t, r)
	// A circuit without a record is closed: show exits 0.
	r = runWarden(t, nil, "--store", url, "breaker", "show", "TYPO")
	want(t, r, 0)
	if !strings.Contains(r.stdout, "closed (no record)") {
		t.Fatalf("breaker show TYPO: %s", r)
	}
	r = runWarden(t, nil, "--store", url, "-o", "json", "breaker", "show", "TYPO")
	want(t, r, 0)
	if !strings.Contains(r.stdout, `"state": "closed"`) || !strings.Contains(r.stdout, `"recorded": false`) {
		t.Fatalf("breaker show -o json TYPO: %s", r)
	}
	r = runWarden(t, nil, "--store", url, "-o", "json", "breaker", "ls")
	want(t, r, 0)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("breaker close TYPO created a record: %s", r)
	}

	want(t, runWarden(t, nil, "--store", url, "breaker", "open", "payments"), 0)
	want(t, runWarden(t, nil, "--store", url, "breaker", "show", "payments"), exitHeld)
	r = runWarden(t, nil, "--store", url, "breaker", "close", "payments")
	want(t, r, 0)
	if !regexp.MustCompile(`(?m)^state: +closed$`).MatchString(r.stdout) {
		t.Fatalf("breaker close payments: %s", r)
	}
	want(t, runWarden(t, nil, "--store", url, "breaker", "show", "payments"), 0)
}

// TestE2EUnknownFlagNamedAsTyped: an unknown flag is named as it was typed,
// "--bogus", wherever it stands, and is a usage error.
func TestE2EUnknownFlagNamedAsTyped(t *testing.T) {
	_, url := e2eStore(t)
	for _, args := range [][]string{
		{"--bogus", "ping"},
		{"ping", "--bogus"},
		{"lock", "run", "--bogus", "k", "--", "true"},
		{"lock", "run", "k", "--bogus", "--", "true"},
	} {
		r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
		want(t, r, exitUsage)
		if !strings.Contains(r.stderr, "unknown flag: --bogus") {
			t.Fatalf("%q: %s", args, r)
		}
	}
}

// TestE2ECacheClearNeedsYes: without a terminal, cache clear deletes
// nothing and exits 2 unless --yes is given.
func TestE2ECacheClearNeedsYes(t *testing.T) {
	_, url := e2eStore(t)
	want(t, runWarden(t, nil, "--store", url, "cache", "set", "k", "v"), 0)
	r := runWarden(t, nil, "--store", url, "cache", "clear")
	want(t, r, exitUsage)
	if !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("cache clear without --yes: %s", r)
	}
	want(t, runWarden(t, nil, "--store", url, "cache", "get", "k"), 0)
	r = runWarden(t, nil, "--store", url, "cache", "clear", "--yes")
	want(t, r, 0)
	wantLines(t, r, `deleted 1 cache entry`)
	want(t, runWarden(t, nil, "--store", url, "cache", "get", "k"), exitNotFound)
}

// readCommands are commands that only read the store, with the exit code
// each has on the store readOnlyStore seeds.
var readCommands = []struct {
	args []string
	code int
}{
	{[]string{"ping"}, 0},
	{[]string{"lock", "ls"}, 0},
	{[]string{"lock", "show", "nobody-holds-this"}, exitNotFound},
	{[]string{"breaker", "ls"}, 0},
	{[]string{"breaker", "show", "pay"}, exitHeld},
	{[]string{"cache", "get", "k"}, 0},
	{[]string{"cache", "keys"}, 0},
	{[]string{"idem", "ls"}, 0},
	{[]string{"checkpoint", "ls"}, 0},
	{[]string{"lock", "watch", "--count", "1", "--timeout", "1s"}, -1}, // interrupted below
}

// TestE2EMistypedSQLitePathCreatesNothing: a command that only reads, given
// a SQLite path where no file is, exits 5 naming the path, and creates no
// file; a command that writes creates the database.
func TestE2EMistypedSQLitePathCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "typo.db")
	for _, rc := range readCommands {
		if rc.code < 0 {
			continue
		}
		r := runWarden(t, nil, append([]string{"--store", "sqlite://" + path}, rc.args...)...)
		want(t, r, exitUnreachable)
		if !strings.Contains(r.stderr, `"`+path+`"`) || !strings.Contains(r.stderr, "never create") {
			t.Fatalf("%q: want the path named: %s", rc.args, r)
		}
	}
	// The default store too (sqlite://warden.db in the working directory).
	cmd := exec.Command(wardenBin, "lock", "ls")
	cmd.Dir, cmd.Env = dir, testEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	var ee *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != exitUnreachable || !strings.Contains(stderr.String(), "warden.db") {
		t.Fatalf("lock ls on the default store in an empty directory: %v %s", err, stderr.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("read commands created %v", entries)
	}
	want(t, runWarden(t, nil, "--store", "sqlite://"+path, "cache", "set", "k", "v"), 0)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("cache set did not create the database: %v", err)
	}
}

// TestE2EReadOnlySQLiteFile: on a SQLite file this process may only read
// (in a directory it cannot write, so that SQLite cannot create the WAL's
// -shm file either), commands that only read work, and a write exits 5 in
// one line. As root, whom file modes do not stop, warden runs as nobody.
func TestE2EReadOnlySQLiteFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "warden-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Chmod(dir, 0o755)
		os.RemoveAll(dir)
	})
	path := filepath.Join(dir, "w.db")
	url := "sqlite://" + path
	want(t, runWarden(t, nil, "--store", url, "cache", "set", "k", "v"), 0)
	want(t, runWarden(t, nil, "--store", url, "breaker", "open", "pay"), 0)

	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		const nobody = 65534
		cred = &syscall.Credential{Uid: nobody, Gid: nobody}
		for _, p := range []string{dir, filepath.Dir(wardenBin)} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		if err := os.Chmod(path, 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
	}
	runRO := func(args ...string) result {
		t.Helper()
		cmd := exec.Command(wardenBin, append([]string{"--store", url}, args...)...)
		cmd.Env = append(testEnv(), "GORACE=atexit_sleep_ms=0")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		r := result{stdout: stdout.String(), stderr: stderr.String()}
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			r.code = ee.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return r
	}
	if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil && cred == nil {
		f.Close()
		t.Skip("file modes do not stop this user from writing")
	}
	for _, rc := range readCommands {
		if rc.code < 0 {
			continue
		}
		r := runRO(rc.args...)
		if r.code != rc.code || rc.code == 0 && r.stderr != "" {
			t.Fatalf("%q on a read-only file: want exit %d, got %s", rc.args, rc.code, r)
		}
	}
	r := runRO("cache", "get", "k")
	wantLines(t, r, "v")
	for _, args := range [][]string{{"cache", "set", "k2", "v"}, {"breaker", "close", "pay"}, {"migrate"}} {
		r := runRO(args...)
		want(t, r, exitUnreachable)
		if !strings.Contains(r.stderr, "readonly") && !strings.Contains(r.stderr, "read-only") && !strings.Contains(r.stderr, "unable to open") {
			t.Fatalf("%q on a read-only file: %s", args, r)
		}
	}
}

// watchLine is one line of `lock watch -o json`.
type watchLine struct {
	Event  string `json:"event"`
	Key    string `json:"key"`
	Owner  string `json:"owner"`
	Token  int64  `json:"token"`
	At     string `json:"at"`
	Reason string `json:"reason"`
}

// watchLines decodes the lines a `lock watch -o json` printed so far.
func watchLines(t *testing.T, out string) []watchLine {
	t.Helper()
	var lines []watchLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var w watchLine
		if err := json.Unmarshal([]byte(l), &w); err != nil {
			t.Fatalf("watch line %q: %v", l, err)
		}
		lines = append(lines, w)
	}
	return lines
}

// waitWatchFor waits until a watch printed a line that ok accepts, and
// returns the lines up to it.
func waitWatchFor(t *testing.T, p *proc, what string, ok func(watchLine) bool) []watchLine {
	t.Helper()
	var upTo []watchLine
	testkit.Eventually(t, 30*time.Second, what, func() bool {
		lines := watchLines(t, p.stdout.String())
		for i, l := range lines {
			if ok(l) {
				upTo = lines[:i+1]
				return true
			}
		}
		return false
	})
	return upTo
}

// TestE2EWatchReportsKilledHolderExpired: on SQLite, the holding of a warden
// killed with SIGKILL is reported expired while nobody takes the key, with
// the holding's token; a later holder's acquisition does not report it a
// second time.
func TestE2EWatchReportsKilledHolderExpired(t *testing.T) {
	_, url := e2eStore(t)
	w := startWarden(t, nil, "--store", url, "-o", "json", "lock", "watch", "k")
	// The watch has subscribed once it reports a holding.
	testkit.Eventually(t, 30*time.Second, "the watch running", func() bool {
		want(t, runWarden(t, nil, "--store", url, "lock", "run", "k", "--", "true"), 0)
		return len(watchLines(t, w.stdout.String())) > 0
	})
	dir := t.TempDir()
	env := []string{"WARDEN_CLI_TEST_HELPER=wait-file", "HELPER_READY=" + filepath.Join(dir, "ready"), "HELPER_STOP=" + filepath.Join(dir, "stop")}
	h := startWarden(t, env, "--store", url, "lock", "run", "k", "--ttl", "1s", "--", selfBin)
	// Ends the command orphaned by the SIGKILL.
	defer os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	waitFile(t, filepath.Join(dir, "ready"))
	r := runWarden(t, nil, "--store", url, "-o", "json", "lock", "show", "k")
	want(t, r, 0)
	var held lockJSON
	decode(t, r, &held)
	acquired := waitWatchFor(t, w, "the holder's acquisition", func(l watchLine) bool {
		return l.Event == "acquired" && l.Token == held.Token
	})
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	lines := waitWatchFor(t, w, "the killed holder's expiry", func(l watchLine) bool {
		return l.Token == held.Token && l.Event != "acquired"
	})
	expired := lines[len(lines)-1]
	if expired.Event != "expired" || expired.Key != "k" || expired.At < acquired[len(acquired)-1].At {
		t.Fatalf("after SIGKILL: %+v, want expired", expired)
	}
	// Nobody took the key in between: the report did not wait for one.
	want(t, runWarden(t, nil, "--store", url, "lock", "show", "k"), exitNotFound)
	// The next holder's acquisition follows; the store's own report of the
	// lapse, as the key is taken over, is not repeated.
	want(t, runWarden(t, nil, "--store", url, "lock", "run", "k", "--", "true"), 0)
	lines = waitWatchFor(t, w, "the next acquisition", func(l watchLine) bool {
		return l.Event == "acquired" && l.Token > held.Token
	})
	n := 0
	for _, l := range lines {
		if l.Token == held.Token && l.Event != "acquired" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the killed holding's end reported %d times: %+v", n, lines)
	}
}

// TestE2ECacheClearAsksOnTerminal: with stdin a terminal (util-linux's
// script gives the binary one), cache clear asks, and deletes only on "y".
func TestE2ECacheClearAsksOnTerminal(t *testing.T) {
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		t.Skip("util-linux script is not installed: no terminal to test with")
	}
	_, url := e2eStore(t)
	want(t, runWarden(t, nil, "--store", url, "cache", "set", "k", "v"), 0)
	for _, tc := range []struct {
		answer string
		code   int
		left   bool
	}{{"n\n", exitFailed, true}, {"y\n", 0, false}} {
		cmd := exec.Command(scriptBin, "-qec", wardenBin+" --store '"+url+"' cache clear", "/dev/null")
		cmd.Env = append(testEnv(), "GORACE=atexit_sleep_ms=0")
		cmd.Stdin = strings.NewReader(tc.answer)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), "Delete every cache entry of "+url+"? [y/N]") {
			t.Fatalf("answer %q: exit %d, want %d:\n%s", tc.answer, code, tc.code, out)
		}
		r := runWarden(t, nil, "--store", url, "cache", "get", "k")
		if (r.code == 0) != tc.left {
			t.Fatalf("answer %q: the entry left: %v, want %v", tc.answer, r.code == 0, tc.left)
		}
	}
}

// TestE2ECobraHelpAndCompletion: the built binary prints cobra's help
// layout, completion scripts for the four shells, and completes commands
// and flags through its hidden __complete command.
func TestE2ECobraHelpAndCompletion(t *testing.T) {
	r := runWarden(t, nil, "lock", "run", "--help")
	want(t, r, 0)
	for _, s := range []string{"Usage:\n  warden lock run KEY", "Examples:\n", "Flags:\n", "--no-wait", "Global Flags:\n", "--store URL"} {
		if !strings.Contains(r.stdout, s) {
			t.Fatalf("lock run --help lacks %q:\n%s", s, r.stdout)
		}
	}
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		r := runWarden(t, nil, "completion", shell)
		want(t, r, 0)
		if !strings.Contains(r.stdout, "__complete") {
			t.Fatalf("completion %s: %s", shell, r.stdout)
		}
	}
	r = runWarden(t, nil, "__completeNoDesc", "lock", "run", "k", "--gr")
	if r.code != 0 || !strings.Contains(r.stdout, "--grace\n") {
		t.Fatalf("completing lock run k --gr: %s", r)
	}
}

// TestE2ELockRunArgsAfterCmdAreTheCommands: from CMD on every argument is
// the command's, verbatim; a later "--" does not make warden take flags out
// of the command line (which once ran the command with no lock held).
func TestE2ELockRunArgsAfterCmdAreTheCommands(t *testing.T) {
	_, url := e2eStore(t)
	p, stop := holder(t, url, "k")
	r := runWarden(t, nil, "--store", url, "lock", "run", "--no-wait", "k", "echo", "--store", "memory://", "--", "hi")
	want(t, r, exitHeld)
	stop()
	want(t, p.wait(t), 0)
	for _, c := range []struct {
		args []string
		out  string
	}{
		{[]string{"k", "echo", "--ttl", "1m", "--", "x"}, "--ttl 1m -- x\n"},
		{[]string{"k", "echo", "--no-pager", "-c", "--", "a"}, "--no-pager -c -- a\n"},
		{[]string{"k", "--ttl", "1m", "echo", "-x", "--", "b"}, "-x -- b\n"},
		{[]string{"--ttl", "1m", "k", "--", "echo", "--ttl", "c"}, "--ttl c\n"},
	} {
		r := runWarden(t, nil, append([]string{"--store", url, "lock", "run"}, c.args...)...)
		want(t, r, 0)
		if r.stdout != c.out {
			t.Fatalf("lock run %q: want output %q, got %s", c.args, c.out, r)
		}
	}
}

// TestE2EAddrPasswordNeverPrinted: the password of a Redis cluster address
// given as addr=user:password@host:port is masked in errors and in --help.
func TestE2EAddrPasswordNeverPrinted(t *testing.T) {
	url := "redis://127.0.0.1:1?addr=u:S3cretPW@127.0.0.1:2&cluster=true"
	for _, args := range [][]string{{"--timeout", "5s", "lock", "ls"}, {"--help"}, {"lock", "ls", "--help"}} {
		r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
		if strings.Contains(r.stdout+r.stderr, "S3cretPW") || !strings.Contains(r.stdout+r.stderr, "u:xxxxx@") {
			t.Fatalf("%q printed the password or no masked address: %s", args, r)
		}
	}
	r := runWarden(t, []string{"WARDEN_STORE=" + url}, "--help")
	if strings.Contains(r.stdout+r.stderr, "S3cretPW") || !strings.Contains(r.stdout, "u:xxxxx@") {
		t.Fatalf("--help with WARDEN_STORE: %s", r)
	}
}

// TestE2EShortPasswordKeepsMessage: a short password is masked in the URL
// without mangling the words of the message that contain it.
func TestE2EShortPasswordKeepsMessage(t *testing.T) {
	for _, pw := range []string{"e", "test"} {
		r := runWarden(t, nil, "--store", "mysql://root:"+pw+"@127.0.0.1:1/test?prefix=rev:", "--timeout", "5s", "lock", "ls")
		want(t, r, exitUnreachable)
		if !strings.HasPrefix(r.stderr, `warden: store unreachable: open "mysql://root:xxxxx@127.0.0.1:1/test?prefix=rev:": `) ||
			strings.Contains(r.stderr, ":"+pw+"@") || !strings.Contains(r.stderr, "connection refused") {
			t.Fatalf("password %q: %s", pw, r)
		}
	}
}

// TestE2EHelpListsEveryStore: the Stores section of warden --help shows a
// URL of every scheme this build registers, and so does the package doc.
func TestE2EHelpListsEveryStore(t *testing.T) {
	r := runWarden(t, nil, "--help")
	want(t, r, 0)
	_, stores, ok := strings.Cut(r.stdout, "\nStores (registered schemes: ")
	if !ok {
		t.Fatalf("no Stores section: %s", r)
	}
	header, stores, _ := strings.Cut(stores, "\n")
	stores, _, _ = strings.Cut(stores, "\n\n")
	doc, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	pkgDoc, _, _ := strings.Cut(string(doc), "\npackage main")
	pkgDoc = strings.ReplaceAll(pkgDoc, "\n// ", " ")
	for _, scheme := range strings.Split(strings.TrimSuffix(header, "):"), ", ") {
		if !strings.Contains(stores, scheme+"://") {
			t.Errorf("--help Stores lists no %s:// URL:\n%s", scheme, stores)
		}
		if !strings.Contains(pkgDoc, scheme+"://") {
			t.Errorf("main.go package doc does not list %s://", scheme)
		}
	}
}

// TestE2EMigratePrefixColon: a prefix ending in ':' is not followed by a
// second colon in migrate's report.
func TestE2EMigratePrefixColon(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "s.db") + "?prefix=rev010:"
	r := runWarden(t, nil, "--store", url, "migrate")
	want(t, r, 0)
	if strings.Contains(r.stdout, "::") || r.stdout != `migrated the sqlite store at "`+url+`": tables and indexes are in place`+"\n" {
		t.Fatalf("migrate: %s", r)
	}
}

// TestE2EDeleteCommandsCreateNoDatabase: commands that can only delete or
// modify existing records never create a database at a mistyped path.
func TestE2EDeleteCommandsCreateNoDatabase(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "typo.db")
	for _, args := range [][]string{
		{"breaker", "close", "x"},
		{"breaker", "reset", "x"},
		{"cache", "del", "a"},
		{"lock", "release", "k", "--force"},
		{"idem", "rm", "k"},
	} {
		r := runWarden(t, nil, append([]string{"--store", "sqlite://" + path + "?prefix=rev005:"}, args...)...)
		want(t, r, exitUnreachable)
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%q created %s (%v): %s", args, path, err, r)
		}
	}
}

// TestE2EAddrInvalidPort: an invalid port in a further address (addr=) is a
// usage error, exit 2, like one in the store URL's own host.
func TestE2EAddrInvalidPort(t *testing.T) {
	for _, url := range []string{
		"redis://127.0.0.1:6379?addr=127.0.0.1:99999&cluster=true",
		"redis://127.0.0.1:6379?addr=u:pw@127.0.0.1:7001,127.0.0.1:0&cluster=true",
	} {
		r := runWarden(t, nil, "--store", url, "--timeout", "5s", "lock", "ls")
		want(t, r, exitUsage)
		if !strings.Contains(r.stderr, "invalid port") || !strings.Contains(r.stderr, "addr=") || strings.Contains(r.stderr, ":pw@") {
			t.Fatalf("%s: %s", url, r)
		}
	}
}

// TestE2ELockWatchLongPatternRefused: lock watch refuses a pattern longer
// than the longest key (exit 2) in one short line, instead of watching.
func TestE2ELockWatchLongPatternRefused(t *testing.T) {
	_, url := e2eStore(t)
	r := runWarden(t, nil, "--store", url, "lock", "watch", strings.Repeat("p", 10000), "--count", "1")
	want(t, r, exitUsage)
	if len(r.stderr) > 300 || !strings.Contains(r.stderr, "invalid pattern: 10000 bytes") {
		t.Fatalf("want one short line naming the pattern's length: %.400s", r.stderr)
	}
}

// TestE2EStoreArgumentErrorsNameTheCommand: an argument the store refuses
// is reported under the command's name, pointing to its own help, not
// under the store's internal operation name.
func TestE2EStoreArgumentErrorsNameTheCommand(t *testing.T) {
	_, url := e2eStore(t)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"cache", "set", "k3", "v", "--ttl", "1ns"}, `warden: cache set "k3": invalid argument: ttl 1ns is under one millisecond (see 'warden cache set --help')` + "\n"},
		{[]string{"cache", "set", "", "v"}, `warden: cache set: invalid key: empty (see 'warden cache set --help')` + "\n"},
	} {
		r := runWarden(t, nil, append([]string{"--store", url}, c.args...)...)
		want(t, r, exitUsage)
		if r.stderr != c.msg {
			t.Fatalf("%q: want %q, got %s", c.args, c.msg, r)
		}
	}
}

// TestE2EOpenErrorShowsURLAsGiven: a store URL without secrets is echoed as
// given, not as Go's url package reprints it.
func TestE2EOpenErrorShowsURLAsGiven(t *testing.T) {
	r := runWarden(t, nil, "--store", "mysql://", "lock", "ls")
	want(t, r, exitUsage)
	if !strings.HasPrefix(r.stderr, `warden: open "mysql://": `) {
		t.Fatalf("want the URL as given: %s", r)
	}
}

// TestE2EStoreFlagTakesCommand: "warden --store ping" (the URL forgotten)
// says the command was taken as the URL, in one line, not the whole help.
func TestE2EStoreFlagTakesCommand(t *testing.T) {
	r := runWarden(t, nil, "--store", "ping")
	want(t, r, exitUsage)
	if !strings.Contains(r.stderr, `--store "ping" is a command, not a store URL`) {
		t.Fatalf("--store ping: %s", r)
	}
}

// TestE2ESQLiteMissingDirectory: a sqlite:// path whose directory does not
// exist exits 5 (the README's table: an SQLite file that cannot be opened)
// for every kind of command, in one line that names the directory and says
// it does not exist, and creates nothing.
func TestE2ESQLiteMissingDirectory(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "missing", "dir")
	url := "sqlite://" + filepath.Join(dir, "x.db")
	for _, args := range [][]string{
		{"lock", "ls"},                      // reads: opened read-only
		{"cache", "set", "k", "v"},          // writes: would create the file
		{"lock", "release", "k", "--force"}, // modifies: creates nothing
		{"lock", "run", "k", "--", "true"},
		{"migrate"},
	} {
		r := runWarden(t, nil, append([]string{"--store", url}, args...)...)
		want(t, r, exitUnreachable)
		oneErrorLine(t, r)
		if !strings.Contains(r.stderr, fmt.Sprintf("directory %q does not exist", dir)) {
			t.Errorf("%q: the message does not say that %s does not exist: %s", args, dir, r)
		}
		if strings.Contains(r.stderr, "WAL") || strings.Contains(r.stderr, "warden migrate") {
			t.Errorf("%q: misleading message: %s", args, r)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a directory was created: %v", err)
	}
}
