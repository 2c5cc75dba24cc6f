//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/drivertest"
)

// e2eMySQLStore returns a mysql:// store URL on the test server with a
// namespace of its own, after `warden migrate` on it. It skips the test
// when no server is configured (unless WARDEN_TEST_REQUIRE asks for one).
func e2eMySQLStore(t *testing.T) string {
	base := drivertest.ServerURL(t, "mysql", "WARDEN_TEST_MYSQL_URL")
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := fmt.Sprintf("%s%sprefix=clie2e%d%d:", base, sep, os.Getpid(), time.Now().UnixNano())
	want(t, runWarden(t, nil, "--store", url, "migrate"), 0)
	return url
}

// TestE2EMySQLConcurrentLockRunNeverOverlaps runs 8 `warden lock run`
// processes at once on one MySQL/MariaDB lock: their commands must run one
// at a time, in order of increasing fencing token, and the lock must be
// free afterwards.
func TestE2EMySQLConcurrentLockRunNeverOverlaps(t *testing.T) {
	url := e2eMySQLStore(t)
	dir := t.TempDir()
	const n = 8
	env := []string{"WARDEN_CLI_TEST_HELPER=exclusive", "HELPER_DIR=" + dir}
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = startWarden(t, env, "--store", url, "lock", "run", "nightly-report", "--ttl", "10s", "--", selfBin)
	}
	for i, p := range procs {
		if r := p.wait(t, 120*time.Second); r.code != 0 {
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

// TestE2EMySQLNoWaitWhileHeld checks `lock run --no-wait` against a lock
// another process holds on MySQL/MariaDB: exit 3 with one message line,
// and success once the holder is done.
func TestE2EMySQLNoWaitWhileHeld(t *testing.T) {
	url := e2eMySQLStore(t)
	h, stop := holder(t, url, "job")

	r := runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true")
	want(t, r, exitHeld)
	oneErrorLine(t, r)
	if !strings.Contains(r.stderr, `lock "job" is held by `) {
		t.Fatalf("--no-wait message: %s", r)
	}
	r = runWarden(t, nil, "--store", url, "lock", "ls")
	want(t, r, 0)
	wantLines(t, r, `KEY +OWNER +TOKEN +ACQUIRED +EXPIRES`, `job +\S+:\d+:\S+ +\d+ +`+rfc3339ms+` +`+rfc3339ms)

	stop()
	want(t, h.wait(t, 30*time.Second), 0)
	want(t, runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true"), 0)
}
