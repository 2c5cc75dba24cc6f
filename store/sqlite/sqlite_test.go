package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// openTest opens a store on a new file in a temporary directory.
func openTest(t *testing.T, opts *Options) (*warden.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "warden.db")
	return openAt(t, path, opts), path
}

// openAt opens a store on path and closes it when the test ends.
func openAt(t *testing.T, path string, opts *Options) *warden.Store {
	t.Helper()
	st, err := Open(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url    string
		path   string
		prefix string
		busy   time.Duration
		max    int
		poll   time.Duration
	}{
		{url: "sqlite:///abs/path/file.db", path: "/abs/path/file.db"},
		{url: "sqlite://relative/file.db", path: "relative/file.db"},
		{url: "sqlite://file.db", path: "file.db"},
		{url: "sqlite://./dir/file.db", path: "./dir/file.db"},
		{url: "sqlite://a/b/c/file.db", path: "a/b/c/file.db"},
		{url: "sqlite:file.db", path: "file.db"},
		{url: "SQLITE:///x.db", path: "/x.db"},
		{url: "sqlite:///tmp/with%20space%3Fq%23h.db", path: "/tmp/with space?q#h.db"},
		{url: "sqlite:///x.db?prefix=app%3A&busy_timeout=250ms&max_value_bytes=1024&poll_interval=2ms",
			path: "/x.db", prefix: "app:", busy: 250 * time.Millisecond, max: 1024, poll: 2 * time.Millisecond},
	}
	for _, c := range cases {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", c.url, err)
		}
		path, opts, err := parseURL(u)
		if err != nil {
			t.Errorf("parseURL(%q): %v", c.url, err)
			continue
		}
		if path != c.path || opts.Prefix != c.prefix || opts.BusyTimeout != c.busy || opts.MaxValueBytes != c.max || opts.PollInterval != c.poll {
			t.Errorf("parseURL(%q) = %q %+v, want path %q prefix %q busy %v max %d poll %v",
				c.url, path, *opts, c.path, c.prefix, c.busy, c.max, c.poll)
		}
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, raw := range []string{
		"sqlite://",
		"sqlite:///",
		"sqlite://dir/",
		"sqlite:///x.db?bogus=1",
		"sqlite:///x.db?busy_timeout=5000",
		"sqlite:///x.db?max_value_bytes=-1",
		"sqlite:///x.db#frag",
		"sqlite://user:s3cret@host/x.db",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", raw, err)
		}
		_, _, err = parseURL(u)
		if err == nil {
			t.Errorf("parseURL(%q): no error", raw)
			continue
		}
		if !errors.Is(err, driver.ErrBadURL) {
			t.Errorf("parseURL(%q) = %v, want driver.ErrBadURL", raw, err)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("parseURL(%q) error shows the password: %v", raw, err)
		}
	}
}

func TestWardenOpenAbsolute(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "abs.db")
	st, err := warden.Open(ctx, "sqlite://"+path+"?prefix=p1:")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Name() != "sqlite" {
		t.Fatalf("Name = %q", st.Name())
	}
	if err := st.Cache().Set(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not created at %s: %v", path, err)
	}
	// The prefix is applied: the stored key carries it.
	db := st.Driver().(*store).db
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM go_goscope_cache WHERE key = 'p1:cache:k'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("stored key p1:cache:k: n=%d err=%v", n, err)
	}
}

// TestOddPathAndPrefix: a file name with URI-special and non-ASCII
// characters, and a prefix full of glob and LIKE syntax.
func TestOddPathAndPrefix(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "dir with space")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ü?#%25&x=1.db")
	prefix := `p*?[%_\]:`
	st := openAt(t, path, &Options{Prefix: prefix})
	other := openAt(t, path, &Options{Prefix: "p:"})
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at %q: %v", path, err)
	}
	for _, k := range []string{"a1", "a2", "b"} {
		if _, _, err := st.Locks().Acquire(ctx, k, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := st.Cache().Set(ctx, k, []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := other.Locks().Acquire(ctx, k, "o", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	l, err := st.Locks().List(ctx, "a*")
	if err != nil || len(l) != 2 || l[0].Key != "a1" || l[1].Key != "a2" {
		t.Fatalf("List(a*) = %+v %v", l, err)
	}
	keys, err := st.Cache().Keys(ctx, "")
	if err != nil || len(keys) != 3 {
		t.Fatalf("Keys = %q %v", keys, err)
	}
	if l, _ := other.Locks().List(ctx, "*"); len(l) != 3 {
		t.Fatalf("other namespace lists %+v", l)
	}
	for _, bad := range []string{"bad\xff:", "a", "a:b:", "lock:"} {
		if _, err := Open(ctx, path, &Options{Prefix: bad}); !errors.Is(err, driver.ErrBadPrefix) {
			t.Errorf("prefix %q: %v, want driver.ErrBadPrefix", bad, err)
		}
	}
}

func TestWardenOpenRelative(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, c := range []struct{ url, file string }{
		{"sqlite://sub/rel.db", "sub/rel.db"},
		{"sqlite://top.db", "top.db"},
	} {
		st, err := warden.Open(ctx, c.url)
		if err != nil {
			t.Fatalf("Open(%q): %v", c.url, err)
		}
		if err := st.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if _, err := os.Stat(filepath.Join(dir, c.file)); err != nil {
			t.Errorf("Open(%q) did not create %s: %v", c.url, c.file, err)
		}
	}
}

func TestWardenOpenErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, raw := range []string{
		"sqlite://" + dir + "/x.db?unknown=1",
		"sqlite://" + dir + "/missing-dir/x.db",
	} {
		if st, err := warden.Open(ctx, raw); err == nil {
			st.Close()
			t.Errorf("Open(%q): no error", raw)
		}
	}
	if _, err := Open(ctx, ":memory:", nil); err == nil {
		t.Error("Open(:memory:): no error")
	}
}

// TestMissingDirectory: a database whose directory does not exist is not
// created (nor is the directory); the error names the directory, says
// that it does not exist, and matches ErrNoDirectory and fs.ErrNotExist,
// read-write and read-only, through Open and warden.Open.
func TestMissingDirectory(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	missing := filepath.Join(base, "missing", "dir")
	path := filepath.Join(missing, "x.db")
	check := func(what string, err error, dir string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if !errors.Is(err, ErrNoDirectory) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v does not match ErrNoDirectory and fs.ErrNotExist", what, err)
		}
		if want := fmt.Sprintf("directory %q", dir); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("%s: %q does not say that %s does not exist", what, err, want)
		}
		if strings.Contains(err.Error(), "WAL") {
			t.Errorf("%s: %q speaks of WAL", what, err)
		}
	}
	_, err := Open(ctx, path, nil)
	check("Open", err, missing)
	_, err = Open(ctx, path, &Options{ReadOnly: true})
	check("Open read-only", err, missing)
	_, err = warden.Open(ctx, "sqlite://"+path+"?prefix=billing:")
	check("warden.Open", err, missing)
	if _, err := os.Stat(filepath.Join(base, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a directory was created: %v", err)
	}
	// A relative path names the directory as given, and where it is.
	t.Chdir(base)
	_, err = warden.Open(ctx, "sqlite://typo/x.db")
	check("relative", err, "typo")
	if !strings.Contains(err.Error(), filepath.Join(base, "typo")) {
		t.Errorf("relative: %q does not give the absolute directory", err)
	}
	// The directory's existence is all that is asked: once it exists,
	// the file is created in it.
	if err := os.MkdirAll(missing, 0o755); err != nil {
		t.Fatal(err)
	}
	openAt(t, path, nil)
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bad := []*Options{
		{BusyTimeout: -1},
		{MaxValueBytes: -1},
		{MaxValueBytes: maxSQLiteLength + 1},
		{PollInterval: -1},
		{Tables: Tables{Locks: "bad name"}},
		{Tables: Tables{Cache: "x;drop"}},
		{Tables: Tables{Locks: "same", Cache: "same"}},
		{Tables: Tables{Events: "sqlite_master"}},
	}
	for _, o := range bad {
		if st, err := Open(ctx, filepath.Join(dir, "bad.db"), o); err == nil {
			st.Close()
			t.Errorf("Open with %+v: no error", *o)
		}
	}
	st := openAt(t, filepath.Join(dir, "ok.db"), nil)
	if got := st.Limits().MaxValueBytes; got != DefaultMaxValueBytes {
		t.Errorf("default MaxValueBytes = %d", got)
	}
	s := st.Driver().(*store)
	if s.cfg.busy != DefaultBusyTimeout || s.cfg.poll != DefaultPollInterval {
		t.Errorf("defaults: busy %v poll %v", s.cfg.busy, s.cfg.poll)
	}
	var busy int64
	// SQLite waits a few milliseconds per attempt; the store retries.
	if err := s.db.QueryRow("PRAGMA busy_timeout").Scan(&busy); err != nil || busy != busyAttempt.Milliseconds() {
		t.Errorf("busy_timeout = %d, %v", busy, err)
	}
	var mode string
	if err := s.db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v", mode, err)
	}
	var syncMode int
	if err := s.db.QueryRow("PRAGMA synchronous").Scan(&syncMode); err != nil || syncMode != 2 {
		t.Errorf("synchronous = %d (want 2, FULL), %v", syncMode, err)
	}
}

func TestCustomTables(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, &Options{Tables: Tables{Locks: "my_locks", Cache: "my_cache", Events: "my_events"}})
	// Events are written while the namespace is watched.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	if _, err := st.Driver().(*store).WatchLocks(wctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Locks().Acquire(ctx, "k", "o", time.Second); err != nil || !ok {
		t.Fatalf("Acquire: %v %v", ok, err)
	}
	if err := st.Cache().Set(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	db := st.Driver().(*store).db
	for _, q := range []string{
		"SELECT count(*) FROM my_locks",
		"SELECT count(*) FROM my_cache",
		"SELECT count(*) FROM my_events",
		"SELECT count(*) FROM my_events_watchers",
	} {
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil || n < 1 {
			t.Errorf("%s: %d, %v", q, n, err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name = 'go_goscope_locks'").Scan(&n); err != nil || n != 0 {
		t.Errorf("default locks table created although renamed: %d %v", n, err)
	}
}

func TestMigrateIdempotent(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Cache().Set(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st2 := openAt(t, path, nil)
	e, found, err := st2.Cache().Get(ctx, "k")
	if err != nil || !found || string(e.Value) != "v" {
		t.Fatalf("after reopen: %v %v %v", e, found, err)
	}
	// The schema is complete: opening does not need to migrate.
	ok, _, err := st2.Driver().(*store).schemaCurrent(ctx)
	if err != nil || !ok {
		t.Fatalf("schemaCurrent = %v, %v", ok, err)
	}
}

// TestGoGoScopeTables opens a database whose tables were created by the
// go-go-scope SQLite adapters (their layout: fewer columns, TEXT values,
// NOT NULL value in idempotency) and checks that warden adds what it needs
// and works on them.
func TestGoGoScopeTables(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ggs.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ddl := range []string{
		`CREATE TABLE go_goscope_circuit (key TEXT PRIMARY KEY, state TEXT NOT NULL, failure_count INTEGER NOT NULL DEFAULT 0,
			last_failure_time INTEGER, last_success_time INTEGER, updated_at INTEGER NOT NULL)`,
		`CREATE TABLE go_goscope_cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, expires_at INTEGER, created_at INTEGER DEFAULT (unixepoch()))`,
		`CREATE INDEX idx_cache_expires ON go_goscope_cache(expires_at)`,
		`CREATE TABLE go_goscope_idempotency (key TEXT PRIMARY KEY, value TEXT NOT NULL, expires_at INTEGER,
			created_at INTEGER DEFAULT (unixepoch()), updated_at INTEGER DEFAULT (unixepoch()))`,
		`INSERT INTO go_goscope_circuit (key, state, failure_count, updated_at) VALUES ('circuit:old', 'closed', 2, 0)`,
	} {
		if _, err := db.Exec(ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
	}
	db.Close()

	st := openAt(t, path, nil)
	rec, err := st.Circuits().RecordFailure(ctx, "old", 3)
	if err != nil || rec.State != driver.Open || rec.Failures != 3 {
		t.Fatalf("RecordFailure on a go-go-scope row: %+v %v", rec, err)
	}
	if err := st.Cache().Set(ctx, "k", []byte(`{"a":1}`), time.Minute); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := st.Cache().Get(ctx, "k"); err != nil || !ok || string(e.Value) != `{"a":1}` {
		t.Fatalf("cache Get: %+v %v %v", e, ok, err)
	}
	idem := st.Idempotency()
	if _, out, err := idem.Claim(ctx, "job", "me", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v %v", out, err)
	}
	if ok, err := idem.Complete(ctx, "job", "me", []byte(`"done"`), 0); err != nil || !ok {
		t.Fatalf("Complete: %v %v", ok, err)
	}
	if err := idem.Set(ctx, "other", []byte(`42`), 0); err != nil {
		t.Fatal(err)
	}
	r, out, err := idem.Claim(ctx, "job", "you", time.Minute, "")
	if err != nil || out != driver.Completed || string(r.Result) != `"done"` {
		t.Fatalf("Claim of a completed key: %+v %v %v", r, out, err)
	}
	// go-go-scope readers find the result in their value column.
	var v string
	if err := st.Driver().(*store).db.QueryRow(`SELECT value FROM go_goscope_idempotency WHERE key = 'job'`).Scan(&v); err != nil || v != `"done"` {
		t.Fatalf("legacy value column = %q, %v", v, err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNamespacesExact: the unprefixed namespace and namespace "a:" both
// store idempotency key "a:bk" (unprefixed key "a:bk", and "a:" + "bk"),
// and likewise task ids; the namespace column keeps them apart.
func TestNamespacesExact(t *testing.T) {
	ctx := context.Background()
	none, path := openTest(t, nil)
	a := openAt(t, path, &Options{Prefix: "a:"})
	ab := openAt(t, path, &Options{Prefix: "ab:"})

	if err := none.Idempotency().Set(ctx, "a:bk", []byte("unprefixed"), 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Idempotency().Set(ctx, "bk", []byte("from a"), 0); err != nil {
		t.Fatal(err)
	}
	if err := ab.Idempotency().Set(ctx, "bk", []byte("from ab"), 0); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := a.Idempotency().Get(ctx, "bk"); string(r.Result) != "from a" {
		t.Fatalf("a sees %q", r.Result)
	}
	if r, _, _ := none.Idempotency().Get(ctx, "a:bk"); string(r.Result) != "unprefixed" {
		t.Fatalf("the unprefixed store sees %q", r.Result)
	}
	if l, _ := none.Idempotency().List(ctx, "*"); len(l) != 1 || l[0].Key != "a:bk" {
		t.Fatalf("unprefixed lists %+v", l)
	}
	if l, _ := a.Idempotency().List(ctx, "*"); len(l) != 1 || l[0].Key != "bk" {
		t.Fatalf("a lists %+v", l)
	}
	if ok, _ := none.Idempotency().Delete(ctx, "a:bk"); !ok {
		t.Fatal("Delete in the unprefixed namespace")
	}
	if _, found, _ := a.Idempotency().Get(ctx, "bk"); !found {
		t.Fatal("Delete in the unprefixed namespace removed a:'s record")
	}

	if _, _, err := none.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "a:t"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t"}); err != nil {
		t.Fatal(err)
	}
	if tasks, _ := none.Checkpoints().Tasks(ctx, "*"); fmt.Sprint(tasks) != "[a:t]" {
		t.Fatalf("unprefixed tasks %q", tasks)
	}
	if tasks, _ := a.Checkpoints().Tasks(ctx, "*"); fmt.Sprint(tasks) != "[t]" {
		t.Fatalf("a's tasks %q", tasks)
	}
	if cp, found, _ := a.Checkpoints().Load(ctx, "t:1"); !found || cp.TaskID != "t" {
		t.Fatalf("a's checkpoint %+v %v", cp, found)
	}
	if n, _ := none.Checkpoints().DeleteAll(ctx, "a:t"); n != 1 {
		t.Fatalf("DeleteAll deleted %d", n)
	}
	if l, _ := a.Checkpoints().List(ctx, "t"); len(l) != 1 {
		t.Fatalf("a's checkpoints after the unprefixed DeleteAll: %d", len(l))
	}
}

// TestBusyWait: a write waits while another connection holds SQLite's
// write lock, succeeds once it is released, and gives up with SQLITE_BUSY
// only after Options.BusyTimeout. Reads are never blocked.
func TestBusyWait(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{BusyTimeout: 300 * time.Millisecond})
	s := st.Driver().(*store)
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	hold := func() *sql.Conn {
		conn, err := raw.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	conn := hold()
	start := time.Now()
	err = st.Cache().Set(ctx, "k", []byte("v"), 0)
	if err == nil || !isBusy(err) {
		t.Fatalf("Set while the write lock is held elsewhere: %v, want SQLITE_BUSY", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("gave up after %v, before the busy timeout", waited)
	}
	if _, _, err := st.Cache().Get(ctx, "k"); err != nil {
		t.Fatalf("read while the write lock is held: %v", err)
	}
	conn.ExecContext(ctx, "ROLLBACK")
	conn.Close()

	// A longer timeout: the writer waits, then succeeds.
	st2 := openAt(t, path, &Options{BusyTimeout: time.Minute})
	s2 := st2.Driver().(*store)
	if s2.gate != s.gate {
		t.Fatal("two stores on one file have different write gates")
	}
	conn = hold()
	done := make(chan error, 1)
	go func() { done <- st2.Cache().Set(ctx, "k", []byte("v2"), 0) }()
	for len(s2.gate.sem) == 0 { // until the writer is inside, retrying
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("write finished while the lock was held: %v", err)
	default:
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatalf("write after the lock was released: %v", err)
	}
	if e, _, _ := st2.Cache().Get(ctx, "k"); string(e.Value) != "v2" {
		t.Fatalf("value %q", e.Value)
	}
}

// TestTransactionsImmediate: the store's transactions take SQLite's write
// lock at BEGIN, before reading anything (a deferred transaction could fail
// with SQLITE_BUSY when it later upgrades to writing).
func TestTransactionsImmediate(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	s := st.Driver().(*store)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	other, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	if err == nil {
		conn.ExecContext(ctx, "ROLLBACK")
		t.Fatal("another connection took the write lock while a store transaction was open: the store's transactions are not IMMEDIATE")
	}
	if !isBusy(err) {
		t.Fatalf("BEGIN IMMEDIATE elsewhere: %v, want SQLITE_BUSY", err)
	}
}

// synchronousFull checks that every connection db can hold at once runs
// with PRAGMA synchronous=FULL (2) or stronger: holding maxOpenConns
// connections together makes the pool open each one.
func synchronousFull(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	conns := make([]*sql.Conn, 0, maxOpenConns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < maxOpenConns; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var level int
		if err := c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&level); err != nil {
			t.Fatal(err)
		}
		// 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA. In WAL mode only FULL and
		// EXTRA sync the log at every commit.
		if level < 2 {
			t.Fatalf("connection %d of the pool: PRAGMA synchronous = %d, want FULL (2): a commit that returned can be lost on power loss", i+1, level)
		}
	}
}

// TestSynchronousFull: every connection of the store's pool commits
// durably (synchronous=FULL): a lock, claim or fence whose write returned
// survives a power loss, so its fencing token is never handed out again.
// Neither a URL nor an odd file name can lower it.
func TestSynchronousFull(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	synchronousFull(t, st.Driver().(*store).db)

	// A URL cannot pass pragmas to the driver: unknown parameters are
	// refused.
	dir := t.TempDir()
	u := "sqlite://" + filepath.ToSlash(filepath.Join(dir, "url.db")) + "?_pragma=synchronous(OFF)"
	if st, err := warden.Open(ctx, u); err == nil {
		st.Close()
		t.Fatalf("warden.Open(%q): no error", u)
	} else if !errors.Is(err, driver.ErrBadURL) {
		t.Fatalf("warden.Open(%q): %v, want ErrBadURL", u, err)
	}

	// A path that looks like DSN parameters is a file name, through
	// Open and through an escaped URL alike.
	odd := filepath.Join(dir, "odd.db?_pragma=synchronous(OFF)&_pragma=journal_mode(DELETE)")
	synchronousFull(t, openAt(t, odd, nil).Driver().(*store).db)
	if _, err := os.Stat(odd); err != nil {
		t.Fatalf("the odd path is not the file: %v", err)
	}
	u = "sqlite://" + filepath.ToSlash(filepath.Join(dir, "esc.db")) + "%3F_pragma=synchronous(OFF)"
	st2, err := warden.Open(ctx, u)
	if err != nil {
		t.Fatalf("warden.Open(%q): %v", u, err)
	}
	defer st2.Close()
	synchronousFull(t, st2.Driver().(*store).db)
}
