//go:build unix

package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/drivertest"
)

// serverStore describes how the end-to-end tests reach one store's test
// server: the environment variable testenv/up.sh sets, and how to turn its
// value and a fresh prefix into a store URL for --store.
type serverStore struct {
	name string // drivertest.ServerURL's store name
	env  string
	url  func(base, prefix string) string
}

var serverStores = []serverStore{
	{name: "mysql", env: "WARDEN_TEST_MYSQL_URL", url: func(base, prefix string) string {
		return withParam(base, "prefix", prefix)
	}},
	{name: "mongodb", env: "WARDEN_TEST_MONGODB_URL", url: func(base, prefix string) string {
		// The test server's URL names no database: use one of the CLI
		// tests' own.
		u, err := url.Parse(base)
		if err == nil && strings.Trim(u.Path, "/") == "" {
			u.Path = "/warden_cli_e2e"
			base = u.String()
		}
		return withParam(base, "prefix", prefix)
	}},
	{name: "postgres", env: "WARDEN_TEST_POSTGRES_URL", url: func(base, prefix string) string {
		return withParam(base, "prefix", prefix)
	}},
	{name: "redis", env: "WARDEN_TEST_REDIS_URL", url: func(base, prefix string) string {
		return withParam(base, "prefix", prefix)
	}},
	{name: "dynamodb", env: "WARDEN_TEST_DYNAMODB_ENDPOINT", url: func(endpoint, prefix string) string {
		u := "dynamodb://warden_cli_e2e?region=us-east-1"
		u = withParam(u, "endpoint", endpoint)
		return withParam(u, "prefix", prefix)
	}},
}

// e2eServerStore returns a store URL on s's test server with a namespace
// of its own, after `warden migrate` on it. It skips the test when no
// server is configured (unless WARDEN_TEST_REQUIRE asks for one).
func e2eServerStore(t *testing.T, s serverStore) string {
	base := drivertest.ServerURL(t, s.name, s.env)
	u := s.url(base, fmt.Sprintf("clie2e%d%d:", os.Getpid(), time.Now().UnixNano()))
	want(t, runWarden(t, nil, "--store", u, "migrate"), 0)
	return u
}

// TestE2EServerConcurrentLockRunNeverOverlaps runs the concurrent lock-run
// scenario of the SQLite end-to-end test against every server store.
func TestE2EServerConcurrentLockRunNeverOverlaps(t *testing.T) {
	for _, s := range serverStores {
		t.Run(s.name, func(t *testing.T) {
			concurrentLockRuns(t, t.TempDir(), e2eServerStore(t, s))
		})
	}
}

// TestE2EServerNoWaitWhileHeld checks `lock run --no-wait` against a lock
// another process holds on every server store: exit 3 with one message
// line, and success once the holder is done.
func TestE2EServerNoWaitWhileHeld(t *testing.T) {
	for _, s := range serverStores {
		t.Run(s.name, func(t *testing.T) {
			url := e2eServerStore(t, s)
			h, stop := holder(t, url, "job")

			r := runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true")
			want(t, r, exitHeld)
			oneErrorLine(t, r)
			if !strings.Contains(r.stderr, `lock "job" is held by `) {
				t.Fatalf("--no-wait message: %s", r)
			}
			r = runWarden(t, nil, "--store", url, "lock", "ls")
			want(t, r, 0)
			wantLines(t, r, `KEY +OWNER +TOKEN +ACQUIRED +EXPIRES`, `job +\S+:\d+#[0-9a-f]{12} +\d+ +`+rfc3339ms+` +`+rfc3339ms)

			stop()
			want(t, h.wait(t), 0)
			want(t, runWarden(t, nil, "--store", url, "lock", "run", "job", "--no-wait", "--", "true"), 0)
		})
	}
}

// TestE2EServerMySQLRefused: a login the server refuses and a database it
// does not have exit 5 (the store cannot be used), in one line without the
// password.
func TestE2EServerMySQLRefused(t *testing.T) {
	base, err := url.Parse(drivertest.ServerURL(t, "mysql", "WARDEN_TEST_MYSQL_URL"))
	if err != nil {
		t.Fatal(err)
	}
	badUser := *base
	badUser.User = url.UserPassword("warden_no_such_user", "s3cret")
	badDB := *base
	badDB.Path = "/warden_no_such_db"
	for _, u := range []*url.URL{&badUser, &badDB} {
		r := runWarden(t, nil, "--store", u.String(), "ping")
		want(t, r, exitUnreachable)
		if strings.Contains(r.stderr, "s3cret") || !strings.Contains(r.stderr, "store unreachable") {
			t.Fatalf("%s: %s", u.Redacted(), r)
		}
	}
}

// TestE2EServerWatchPolledSaysSo: on MySQL, which has no notifications,
// lock watch starts with an events-lost line saying that holdings between
// two listings are not seen, then reports what it sees.
func TestE2EServerWatchPolledSaysSo(t *testing.T) {
	url := e2eServerStore(t, serverStores[0])
	w := startWarden(t, nil, "--store", url, "-o", "json", "lock", "watch", "job", "--count", "1")
	lost := waitWatchFor(t, w, "a first line", func(watchLine) bool { return true })[0]
	if lost.Event != "events-lost" || !strings.Contains(lost.Reason, "no notifications") || !strings.Contains(lost.Reason, "not seen") {
		t.Fatalf("first line: %+v", lost)
	}
	_, stop := holder(t, url, "job")
	defer stop()
	r := w.wait(t)
	want(t, r, 0)
	if lines := watchLines(t, r.stdout); len(lines) != 2 || lines[1].Event != "acquired" || lines[1].Key != "job" {
		t.Fatalf("watch: %+v", lines)
	}
}

// TestE2EServerWatchPolledOrder: on MySQL, a holding force-released and
// taken by another holder between two listings is reported ended before,
// and stamped no later than, its successor's acquisition.
func TestE2EServerWatchPolledOrder(t *testing.T) {
	url := e2eServerStore(t, serverStores[0])
	w := startWarden(t, nil, "--store", url, "-o", "json", "lock", "watch", "job")
	waitWatchFor(t, w, "events-lost", func(l watchLine) bool { return l.Event == "events-lost" })
	_, stopA := holder(t, url, "job")
	defer stopA()
	first := waitWatchFor(t, w, "the first acquisition", func(l watchLine) bool { return l.Event == "acquired" })
	a := first[len(first)-1]
	want(t, runWarden(t, nil, "--store", url, "lock", "release", "job", "--force"), 0)
	_, stopB := holder(t, url, "job")
	defer stopB()
	lines := waitWatchFor(t, w, "the second acquisition", func(l watchLine) bool {
		return l.Event == "acquired" && l.Token > a.Token
	})
	b := lines[len(lines)-1]
	var end *watchLine
	for i := range lines {
		if lines[i].Token == a.Token && lines[i].Event != "acquired" {
			end = &lines[i]
		}
	}
	if end == nil || end.At > b.At {
		t.Fatalf("the first holding's end %+v, want it before and no later than %+v", end, b)
	}
}

// TestE2EServerLoginOrDatabaseRefused: a PostgreSQL or Redis server that
// refuses the login or has no such database makes the store unusable, exit
// 5, as with MySQL.
func TestE2EServerLoginOrDatabaseRefused(t *testing.T) {
	for _, c := range []struct {
		env    string
		modify func(u *url.URL)
	}{
		{"WARDEN_TEST_POSTGRES_URL", func(u *url.URL) { u.Path = "/nodb_warden_cli" }},
		{"WARDEN_TEST_POSTGRES_URL", func(u *url.URL) { u.User = url.UserPassword("nouser_warden_cli", "x") }},
		{"WARDEN_TEST_REDIS_URL", func(u *url.URL) { u.User = url.UserPassword("nouser_warden_cli", "S3cretPW") }},
		{"WARDEN_TEST_REDIS_URL", func(u *url.URL) { u.Path = "/99" }},
	} {
		base := os.Getenv(c.env)
		if base == "" {
			t.Logf("%s not set: skipped", c.env)
			continue
		}
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		c.modify(u)
		r := runWarden(t, nil, "--store", u.String(), "lock", "ls")
		want(t, r, exitUnreachable)
		if strings.Contains(r.stderr, "S3cretPW") {
			t.Fatalf("%s: printed the password: %s", u.Redacted(), r)
		}
	}
}
