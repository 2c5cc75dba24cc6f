package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/postgres"
)

// rawPool opens a plain pool on the test server.
func rawPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testSchema creates a schema of the test's own, dropped when it ends.
func testSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("wt_%d_%d", os.Getpid(), time.Now().UnixNano())
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE") })
	return name
}

func mustExec(t *testing.T, pool *pgxpool.Pool, q string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestURL checks the URL forms and their errors.
func TestURL(t *testing.T) {
	base := drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL")
	ctx := context.Background()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme = "postgresql"
	q := u.Query()
	q.Set("prefix", "urltest:")
	q.Set("application_name", "warden-url-test")
	u.RawQuery = q.Encode()
	st, err := warden.Open(ctx, u.String())
	if err != nil {
		t.Fatalf("postgresql:// URL: %v", err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	st.Close()

	for _, bad := range []struct{ url, want string }{
		{"postgres://u:s3cret@127.0.0.1:1/db?colour=red", "colour"},
		{"postgres://u:s3cret@127.0.0.1:1/db?prefix=no-colon", "prefix"},
		{"postgres://u:s3cret@127.0.0.1:1/db?max_value_bytes=lots", "max_value_bytes"},
		{"postgres:///db", "postgres://"},
	} {
		_, err := warden.Open(ctx, bad.url)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want an error mentioning %q", bad.url, err, bad.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", bad.url, err)
		}
	}
	if _, err := warden.Open(ctx, "postgres://u@127.0.0.1:1/db?colour=red"); !errors.Is(err, driver.ErrBadURL) {
		t.Errorf("unknown parameter: %v, want driver.ErrBadURL", err)
	}
	if _, err := postgres.Open(ctx, base, &postgres.Options{Tables: postgres.Tables{Locks: "x; DROP TABLE y"}}); err == nil {
		t.Error("a table name that is not an identifier was accepted")
	}
	if _, err := postgres.Open(ctx, base, &postgres.Options{Schema: "a.b"}); err == nil {
		t.Error("a schema name that is not an identifier was accepted")
	}
}

// ggsTables creates the tables go-go-scope's PostgreSQL adapter creates
// (its connect() statements), in schema, with a lock held by a Node
// service, an expired one, and a cached JSON value.
func ggsTables(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE ` + schema + `.go_goscope_locks (key TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at TIMESTAMP NOT NULL)`,
		`CREATE INDEX idx_locks_expires ON ` + schema + `.go_goscope_locks(expires_at)`,
		`CREATE TABLE ` + schema + `.go_goscope_circuit (key TEXT PRIMARY KEY, state TEXT NOT NULL, failure_count INTEGER NOT NULL DEFAULT 0,
			last_failure_time TIMESTAMP, last_success_time TIMESTAMP, updated_at TIMESTAMP NOT NULL DEFAULT NOW())`,
		`CREATE TABLE ` + schema + `.go_goscope_cache (key TEXT PRIMARY KEY, value JSONB NOT NULL, expires_at TIMESTAMP,
			accessed_at TIMESTAMP DEFAULT NOW())`,
		`INSERT INTO ` + schema + `.go_goscope_locks (key, owner, expires_at) VALUES
			('lock:old', 'node-1', (now() AT TIME ZONE 'UTC') - interval '1 hour'),
			('lock:held', 'node-2', (now() AT TIME ZONE 'UTC') + interval '1 hour')`,
		`INSERT INTO ` + schema + `.go_goscope_circuit (key, state, failure_count) VALUES ('circuit:c', 'open', 7)`,
		`INSERT INTO ` + schema + `.go_goscope_cache (key, value) VALUES ('cache:k', '{"a": [1, 2]}')`,
	} {
		mustExec(t, pool, q)
	}
}

// TestAdoptGoGoScopeTables: the store works on tables go-go-scope's
// adapter created, with their records.
func TestAdoptGoGoScopeTables(t *testing.T) {
	pool := rawPool(t)
	schema := testSchema(t, pool)
	ggsTables(t, pool, schema)
	ctx := context.Background()
	st, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err != nil {
		t.Fatalf("New on go-go-scope's tables: %v", err)
	}
	defer st.Close()
	if rec, ok, err := st.Locks().Acquire(ctx, "held", "warden", time.Minute); err != nil || ok || rec.Owner != "node-2" {
		t.Errorf("Acquire of the Node service's held lock: ok=%v owner=%q err=%v, want held by node-2", ok, rec.Owner, err)
	}
	rec, ok, err := st.Locks().Acquire(ctx, "old", "warden", time.Minute)
	if err != nil || !ok || rec.Token <= 0 {
		t.Errorf("Acquire of the expired lock: ok=%v token=%d err=%v", ok, rec.Token, err)
	}
	if c, _, err := st.Circuits().Get(ctx, "c"); err != nil || c.State != driver.Open || c.Failures != 7 {
		t.Errorf("circuit c: %+v, %v; want open with 7 failures", c, err)
	}
	if e, ok, err := st.Cache().Get(ctx, "k"); err != nil || !ok || string(e.Value) != `{"a": [1, 2]}` {
		t.Errorf("cached JSON value: %q ok=%v err=%v", e.Value, ok, err)
	}
	// A second migration finds nothing to do and changes nothing.
	var before int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1", schema).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	var after int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1", schema).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("second Migrate changed the columns: %d → %d", before, after)
	}
	// Keys compare byte for byte after the collation change.
	if _, ok, err := st.Locks().Acquire(ctx, "HELD", "warden", time.Minute); err != nil || !ok {
		t.Errorf("Acquire of HELD (another key than held): ok=%v err=%v", ok, err)
	}
}

// TestAdoptRefusesBeforeChanging: a column that does not convert is
// refused, with its name, before any table is altered.
func TestAdoptRefusesBeforeChanging(t *testing.T) {
	pool := rawPool(t)
	schema := testSchema(t, pool)
	ggsTables(t, pool, schema)
	// Epoch numbers where warden keeps times: not convertible.
	mustExec(t, pool, `CREATE TABLE `+schema+`.go_goscope_idempotency (key TEXT PRIMARY KEY, status TEXT, expires_at BIGINT)`)
	_, err := postgres.New(pool, &postgres.Options{Schema: schema})
	if err == nil || !strings.Contains(err.Error(), "expires_at") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("New: %v, want a refusal naming expires_at", err)
	}
	var n int
	err = pool.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'go_goscope_locks' AND column_name = 'namespace'`, schema).Scan(&n)
	if err != nil || n != 0 {
		t.Fatalf("the locks table was altered before the refusal (namespace column: %d, %v)", n, err)
	}
	var typ string
	if err := pool.QueryRow(context.Background(), `SELECT data_type FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'go_goscope_locks' AND column_name = 'expires_at'`, schema).Scan(&typ); err != nil || typ != "timestamp without time zone" {
		t.Fatalf("locks.expires_at is %q (%v) after the refusal", typ, err)
	}
}

// tokenStore returns a raw pool, a fresh schema and a store in it
// (namespace "tok:"), closed when t ends.
func tokenStore(t *testing.T) (*pgxpool.Pool, string, *warden.Store) {
	pool := rawPool(t)
	schema := testSchema(t, pool)
	st, err := postgres.New(pool, &postgres.Options{Schema: schema, Prefix: "tok:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return pool, schema, st
}

// TestTokensNeverGoBack: whatever another writer does to a lock row —
// resets its token, deletes it — the next holding's token is greater
// than every token handed out before.
func TestTokensNeverGoBack(t *testing.T) {
	pool, schema, st := tokenStore(t)
	ctx := context.Background()
	var last int64
	take := func(what string) {
		t.Helper()
		rec, ok, err := st.Locks().Acquire(ctx, "k", "w", time.Minute)
		if err != nil || !ok {
			t.Fatalf("%s: ok=%v err=%v", what, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("%s: token %d, not above the previous %d", what, rec.Token, last)
		}
		last = rec.Token
		if ok, err := st.Locks().Release(ctx, "k", "w", rec.Token); err != nil || !ok {
			t.Fatalf("%s: Release ok=%v err=%v", what, ok, err)
		}
	}
	take("first")
	take("second")
	mustExec(t, pool, `UPDATE `+schema+`.go_goscope_locks SET token = 0`)
	take("after another writer reset the token")
	mustExec(t, pool, `DELETE FROM `+schema+`.go_goscope_locks`)
	mustExec(t, pool, `INSERT INTO `+schema+`.go_goscope_locks (namespace, key, owner, expires_at) VALUES ('tok:', 'tok:lock:k', 'node', now() - interval '1 second')`)
	take("after another writer recreated the row")
}

// TestListenReconnects: when the LISTEN connection is killed, watchers get
// EventsLost once the store has listened again, and then the events that
// follow. Events are awaited as long as they take: one that never comes is
// reported by go test's -timeout.
func TestListenReconnects(t *testing.T) {
	pool := rawPool(t)
	ctx := t.Context()
	app := fmt.Sprintf("warden-listen-%d-%d", os.Getpid(), time.Now().UnixNano())
	u, err := url.Parse(serverURL(t, fmt.Sprintf("relisten%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	st, err := postgres.Open(ctx, u.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// next returns the next event, however long it takes.
	next := func(what string) driver.LockEvent {
		t.Helper()
		ev, ok := <-ch
		if !ok {
			t.Fatalf("%s: the watch ended", what)
		}
		return ev
	}
	cycle := func(key string) {
		t.Helper()
		rec, ok, err := st.Locks().Acquire(ctx, key, "o", time.Minute)
		if err != nil || !ok {
			t.Fatalf("Acquire %s: ok=%v err=%v", key, ok, err)
		}
		if _, err := st.Locks().Release(ctx, key, "o", rec.Token); err != nil {
			t.Fatal(err)
		}
	}
	cycle("before")
	if ev := next("before the drop"); ev.Kind != driver.LockAcquired || ev.Key != "before" {
		t.Fatalf("first event %+v, want before acquired", ev)
	}
	next("before's release")
	var killed int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %') k`, app).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminating the LISTEN connection: %d terminated, %v", killed, err)
	}
	if ev := next("after the drop"); ev.Kind != driver.EventsLost {
		t.Fatalf("after the LISTEN connection dropped: %+v, want EventsLost", ev)
	}
	cycle("after")
	if ev := next("after the reconnection"); ev.Kind != driver.LockAcquired || ev.Key != "after" {
		t.Fatalf("after the reconnection: %+v, want after acquired", ev)
	}
}

// TestNotifyOnlyOnCommit: a change whose transaction fails to commit is
// never announced. A deferred constraint trigger (test-only) makes the
// commit of acquiring "doomed" fail after the statement, its pg_notify
// included, has run. The event is awaited as long as it takes: one that
// never comes is reported by go test's -timeout.
func TestNotifyOnlyOnCommit(t *testing.T) {
	pool := rawPool(t)
	schema := testSchema(t, pool)
	ctx := t.Context()
	st, err := postgres.New(pool, &postgres.Options{Schema: schema, Prefix: "commit:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mustExec(t, pool, `CREATE FUNCTION `+schema+`.doom() RETURNS trigger LANGUAGE plpgsql AS
		$$BEGIN IF NEW.key LIKE '%doomed' THEN RAISE EXCEPTION 'doomed at commit'; END IF; RETURN NULL; END$$`)
	mustExec(t, pool, `CREATE CONSTRAINT TRIGGER doom AFTER INSERT OR UPDATE ON `+schema+`.go_goscope_locks
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+schema+`.doom()`)
	ch, err := st.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Locks().Acquire(ctx, "doomed", "o", time.Minute); err == nil || !strings.Contains(err.Error(), "doomed at commit") {
		t.Fatalf("Acquire of doomed: %v, want the commit's failure", err)
	}
	rec, ok, err := st.Locks().Acquire(ctx, "sentinel", "o", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ev, ok := <-ch; !ok {
		t.Fatal("the watch ended without an event")
	} else if ev.Key != "sentinel" || ev.Token != rec.Token {
		t.Fatalf("first event %+v, want sentinel acquired with token %d (nothing of the rolled-back doomed)", ev, rec.Token)
	}
}

// TestStrictIsolationSessions: on sessions whose default isolation is
// REPEATABLE READ or SERIALIZABLE, concurrent first acquires, claims and
// failures still give one winner and lose no increment: serialization
// failures are retried inside the store, never returned.
func TestStrictIsolationSessions(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(level, " ", "-"), func(t *testing.T) {
			ctx := t.Context() // no deadline: a hang is reported by go test's -timeout
			u, err := url.Parse(serverURL(t, fmt.Sprintf("iso%d:", time.Now().UnixNano())))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("options", "-c default_transaction_isolation="+strings.ReplaceAll(level, " ", "\\ "))
			u.RawQuery = q.Encode()
			st, err := postgres.Open(ctx, u.String(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			const n = 16
			type result struct {
				ok  bool
				err error
			}
			race := func(f func(i int) (bool, error)) []result {
				out := make([]result, n)
				start := make(chan struct{})
				done := make(chan int)
				for i := range n {
					go func() {
						<-start
						out[i].ok, out[i].err = f(i)
						done <- i
					}()
				}
				close(start)
				for range n {
					<-done
				}
				return out
			}
			count := func(what string, rs []result) {
				t.Helper()
				wins := 0
				for _, r := range rs {
					if r.err != nil {
						t.Fatalf("%s: %v", what, r.err)
					}
					if r.ok {
						wins++
					}
				}
				if wins != 1 {
					t.Errorf("%s: %d winners, want 1", what, wins)
				}
			}
			count("Acquire", race(func(i int) (bool, error) {
				_, ok, err := st.Locks().Acquire(ctx, "first", fmt.Sprint("o", i), time.Minute)
				return ok, err
			}))
			count("Claim", race(func(i int) (bool, error) {
				_, o, err := st.Idempotency().Claim(ctx, "first", fmt.Sprint("o", i), time.Minute, "")
				return o == driver.Claimed || o == driver.TakenOver, err
			}))
			rs := race(func(i int) (bool, error) {
				_, err := st.Circuits().RecordFailure(ctx, "c", 1000)
				return i == 0, err
			})
			count("RecordFailure", rs)
			if rec, _, err := st.Circuits().Get(ctx, "c"); err != nil || rec.Failures != n {
				t.Errorf("after %d concurrent failures: %d failures recorded (%v)", n, rec.Failures, err)
			}
		})
	}
}

// TestTokensAfterForeignDelete: another program deleting the lock row
// right after each acquisition never makes the next holder's token equal
// to or below the previous one, though the row is recreated within the
// same millisecond of server time.
func TestTokensAfterForeignDelete(t *testing.T) {
	pool, schema, st := tokenStore(t)
	ctx := context.Background()
	var last int64
	for i := range 2000 {
		rec, ok, err := st.Locks().Acquire(ctx, "k", fmt.Sprint("w", i), time.Minute)
		if err != nil || !ok {
			t.Fatalf("round %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Token <= last {
			t.Fatalf("round %d: token %d, not above the previous %d", i, rec.Token, last)
		}
		last = rec.Token
		mustExec(t, pool, `DELETE FROM `+schema+`.go_goscope_locks`)
	}
}

// TestTokensWhileAnotherProgramDeletes: four acquirers take one key in
// turn while another program deletes every released row as fast as it
// can; each holder checks, while it holds the key, that its token is
// above every earlier holder's. An acquire that read its clock, then
// waited while a whole holding began and ended and its row was deleted,
// would recreate the row below that holding's token.
func TestTokensWhileAnotherProgramDeletes(t *testing.T) {
	pool := rawPool(t)
	schema := testSchema(t, pool)
	ctx := t.Context()
	var (
		mu    sync.Mutex
		last  int64
		bad   []string
		done  atomic.Bool
		wg    sync.WaitGroup
		count atomic.Int64
	)
	const holdings = 1500
	for w := range 4 {
		p, err := pgxpool.New(ctx, drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		st, err := postgres.New(p, &postgres.Options{Schema: schema, Prefix: "del:"})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		wg.Go(func() {
			owner := fmt.Sprint("w", w)
			for !done.Load() {
				rec, ok, err := st.Locks().Acquire(ctx, "k", owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				mu.Lock()
				if rec.Token <= last {
					bad = append(bad, fmt.Sprintf("%s got %d after %d", owner, rec.Token, last))
				}
				last = rec.Token
				mu.Unlock()
				if count.Add(1) >= holdings {
					done.Store(true)
				}
				if _, err := st.Locks().Release(ctx, "k", owner, rec.Token); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for !done.Load() {
			if _, err := pool.Exec(ctx, `DELETE FROM `+schema+`.go_goscope_locks WHERE expires_at <= clock_timestamp()`); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("%d of %d holdings got a token not above the previous holder's, e.g. %v", len(bad), count.Load(), bad[:min(len(bad), 5)])
	}
}
