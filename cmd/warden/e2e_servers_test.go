//go:build unix

package main

import (
	"fmt"
	"os"
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

// TestE2EMySQLConcurrentLockRunNeverOverlaps runs the concurrent lock-run
// scenario of the SQLite end-to-end test against MySQL/MariaDB.
func TestE2EMySQLConcurrentLockRunNeverOverlaps(t *testing.T) {
	concurrentLockRuns(t, t.TempDir(), e2eMySQLStore(t))
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
