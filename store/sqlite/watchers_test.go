package sqlite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/lock"
)

// The event triggers write only while the namespace has a live watcher
// registration (docs/design.md, SQLite notifications): these tests check
// that a store nobody watches writes no event, that a watcher in another
// store or process makes every change evented, that a dead watcher stops
// costing writes once its registration expired, and that a registration
// racing a release never loses the wake-up.

// eventCount is the number of rows of the events table of namespace ns.
func eventCount(t *testing.T, st *warden.Store, ns string) int {
	t.Helper()
	var n int
	if err := st.Driver().(*store).db.QueryRow(`SELECT count(*) FROM go_goscope_events WHERE namespace = ?`, ns).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// lockCycle acquires and releases key.
func lockCycle(t *testing.T, st *warden.Store, key string) {
	t.Helper()
	ctx := context.Background()
	rec, ok, err := st.Locks().Acquire(ctx, key, "o", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire(%s): %v %v", key, ok, err)
	}
	if ok, err := st.Locks().Release(ctx, key, "o", rec.Token); err != nil || !ok {
		t.Fatalf("Release(%s): %v %v", key, ok, err)
	}
}

// watcherRows is the number of registrations of namespace ns and kind.
func watcherRows(t *testing.T, st *warden.Store, ns, kind string) int {
	t.Helper()
	var n int
	if err := st.Driver().(*store).db.QueryRow(`SELECT count(*) FROM go_goscope_events_watchers WHERE namespace = ? AND kind = ?`, ns, kind).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEventsOnlyWhileWatched: without a watcher of the namespace a lock
// cycle (and a circuit change) writes no event; while another store on
// the file watches, every acquisition and release is evented, and a lock
// watcher does not make circuits evented (nor the reverse); after the
// watcher closed, nothing is written again.
func TestEventsOnlyWhileWatched(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "w.db")
	st := openAt(t, path, &Options{Prefix: "app:"})
	other := openAt(t, path, &Options{Prefix: "other:"})

	lockCycle(t, st, "k")
	if _, err := st.Circuits().RecordFailure(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if n := eventCount(t, st, "app:"); n != 0 {
		t.Fatalf("unwatched namespace: %d events written, want 0", n)
	}

	w, err := Open(ctx, path, &Options{Prefix: "app:"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := w.Locks().Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := watcherRows(t, st, "app:", kindLock); n != 1 {
		t.Fatalf("%d lock registrations after Watch returned, want 1", n)
	}
	for i := range 3 {
		lockCycle(t, st, fmt.Sprint("k", i))
	}
	if n := eventCount(t, st, "app:"); n != 6 {
		t.Fatalf("watched namespace: %d events for 3 cycles, want 6", n)
	}
	for i := range 3 {
		key := fmt.Sprint("k", i)
		if e := nextLock(t, ch); e.Kind != driver.LockAcquired || e.Key != key {
			t.Fatalf("event %+v, want acquired %s", e, key)
		}
		if e := nextLock(t, ch); e.Kind != driver.LockReleased || e.Key != key {
			t.Fatalf("event %+v, want released %s", e, key)
		}
	}
	// A lock watcher makes neither circuits nor another namespace evented.
	if _, err := st.Circuits().RecordFailure(ctx, "c2", 1); err != nil {
		t.Fatal(err)
	}
	lockCycle(t, other, "k")
	if n := eventCount(t, st, "app:"); n != 6 {
		t.Fatalf("a circuit change with only a lock watcher: %d events, want 6", n)
	}
	if n := eventCount(t, st, "other:"); n != 0 {
		t.Fatalf("a namespace nobody watches: %d events, want 0", n)
	}
	// A circuit watcher makes circuit changes evented.
	cch, err := w.Circuits().Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "c3", 1); err != nil {
		t.Fatal(err)
	}
	if r := nextCircuit(t, cch); r.Name != "c3" || r.State != driver.Open {
		t.Fatalf("circuit event %+v", r)
	}

	// Closing the watcher deletes its registrations.
	w.Close()
	if n := watcherRows(t, st, "app:", kindLock) + watcherRows(t, st, "app:", kindCircuit); n != 0 {
		t.Fatalf("%d registrations left after the watcher closed", n)
	}
	before := eventCount(t, st, "app:")
	lockCycle(t, st, "k")
	if n := eventCount(t, st, "app:"); n != before {
		t.Fatalf("after the watcher closed: %d new events, want 0", n-before)
	}
}

// TestWatchEndUnregisters: when the last watch of a kind ends, its
// registration goes (the watcher goroutine deletes it on its way out).
func TestWatchEndUnregisters(t *testing.T) {
	st, _ := openTest(t, nil)
	s := st.Driver().(*store)
	wctx, stop := context.WithCancel(context.Background())
	ch, err := st.Locks().Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	waitClosed(t, ch)
	s.hub.Wait() // the watcher goroutine ended
	if n := watcherRows(t, st, "", kindLock); n != 0 {
		t.Fatalf("%d registrations after the last watch ended", n)
	}
	lockCycle(t, st, "k")
	if n := eventCount(t, st, ""); n != 0 {
		t.Fatalf("%d events after the last watch ended, want 0", n)
	}
}

// helperWatch watches the namespace "note:" and says so on stdout, then
// waits to be killed.
func helperWatch() error {
	ctx := context.Background()
	st, err := Open(ctx, filepath.Join(os.Getenv("WARDEN_SQLITE_DIR"), "shared.db"), &Options{Prefix: "note:"})
	if err != nil {
		return err
	}
	if _, err := st.Locks().Watch(ctx); err != nil {
		return err
	}
	fmt.Println("watching")
	select {}
}

// TestDeadWatcherStopsEvents: a process that watches the namespace makes
// this process's lock cycles evented; killed, its registration stays
// until it expires — then writes are no longer evented, and the next
// registration deletes it.
func TestDeadWatcherStopsEvents(t *testing.T) {
	dir := t.TempDir()
	st := openAt(t, filepath.Join(dir, "shared.db"), &Options{Prefix: "note:"})
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=watch", "WARDEN_SQLITE_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "watching" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q, %v\n%s", line, err, stderr.String())
	}
	lockCycle(t, st, "a")
	if n := eventCount(t, st, "note:"); n != 2 {
		t.Fatalf("watched by another process: %d events, want 2", n)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// Killed: its registration lives until it expires.
	lockCycle(t, st, "b")
	if n := eventCount(t, st, "note:"); n != 4 {
		t.Fatalf("watcher killed, registration not yet expired: %d events, want 4", n)
	}
	// Its expiry passes (the process cannot renew it any more).
	db := st.Driver().(*store).db
	res, err := db.Exec(`UPDATE go_goscope_events_watchers SET expires_at = ? WHERE namespace = 'note:'`, time.Now().Add(-time.Millisecond).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%d registrations of the dead process, want 1", n)
	}
	lockCycle(t, st, "c")
	if n := eventCount(t, st, "note:"); n != 4 {
		t.Fatalf("registration expired: %d events, want still 4", n)
	}
	// The next registration deletes the lapsed one.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if _, err := st.Locks().Watch(ctx); err != nil {
		t.Fatal(err)
	}
	if n := watcherRows(t, st, "note:", kindLock); n != 1 {
		t.Fatalf("%d lock registrations, want only the new one", n)
	}
}

// TestWatcherLapseReportsLost: a registration that lapsed while its
// process stalled (so changes went unevented) is written again at the
// next renewal, and the watches get EventsLost, so that waiters read the
// state again.
func TestWatcherLapseReportsLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	st := openAt(t, path, nil)
	w := openAt(t, path, nil)
	h := w.Driver().(*store).hub
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ch, err := w.Locks().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The stall: the registration expires and the renewal is overdue.
	h.regMu.Lock()
	if _, err := st.Driver().(*store).db.Exec(`UPDATE go_goscope_events_watchers SET expires_at = 0`); err != nil {
		h.regMu.Unlock()
		t.Fatal(err)
	}
	lockCycle(t, st, "k") // not evented
	h.reg[kindLock] = time.Now().Add(-watcherTTL)
	h.regMu.Unlock()
	if n := eventCount(t, st, ""); n != 0 {
		t.Fatalf("%d events with the registration lapsed, want 0", n)
	}
	if e := nextLock(t, ch); e.Kind != driver.EventsLost {
		t.Fatalf("after the lapse: %+v, want EventsLost", e)
	}
	var exp int64
	if err := st.Driver().(*store).db.QueryRow(`SELECT expires_at FROM go_goscope_events_watchers`).Scan(&exp); err != nil || exp <= time.Now().UnixMilli() {
		t.Fatalf("registration after the renewal: expires %d, %v; want in the future", exp, err)
	}
	lockCycle(t, st, "k")
	if e := nextLock(t, ch); e.Kind != driver.LockAcquired {
		t.Fatalf("after the renewal: %+v, want acquired", e)
	}
}

// TestWatchRegistrationRacesRelease: a waiter watches, then reads the
// lock; the holder, in another store on the file, releases at each point
// of that sequence. In every interleaving the waiter either reads the lock
// free or receives the release: the registration is committed before
// Watch subscribes (checked from the holder's connection at that moment),
// so a release after the waiter's read is always evented.
func TestWatchRegistrationRacesRelease(t *testing.T) {
	steps := []string{"before Watch", "after the registration, before the subscription", "after Watch, before the read", "after the read"}
	for _, at := range steps {
		t.Run(at, func(t *testing.T) {
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			path := filepath.Join(t.TempDir(), "w.db")
			holder := openAt(t, path, nil)
			waiter := openAt(t, path, nil)
			rec, ok, err := holder.Locks().Acquire(ctx, "k", "holder", time.Minute)
			if err != nil || !ok {
				t.Fatalf("Acquire: %v %v", ok, err)
			}
			release := func(step string) {
				if step != at {
					return
				}
				if ok, err := holder.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
					t.Errorf("Release: %v %v", ok, err)
				}
			}
			registered := false
			waiter.Driver().(*store).hub.afterRegister = func() {
				registered = watcherRows(t, holder, "", kindLock) == 1
				release(steps[1])
			}

			release(steps[0])
			ch, err := waiter.Locks().Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !registered {
				t.Fatal("the registration was not committed before the subscription")
			}
			release(steps[2])
			_, held, err := waiter.Locks().Get(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			release(steps[3])
			if !held {
				if at == steps[3] {
					t.Fatal("read the lock free before its release")
				}
				return // the waiter reads it free: no wake-up needed
			}
			if at != steps[3] {
				t.Fatalf("released %s, yet the read found it held", at)
			}
			for {
				e := nextLock(t, ch)
				if e.Kind == driver.LockReleased && e.Key == "k" && e.Token == rec.Token {
					return
				}
				if e.Kind == driver.EventsLost {
					t.Fatalf("the release after the read was lost: %+v", e)
				}
			}
		})
	}
}

// TestLockTriggersUpgraded: a file whose lock and circuit triggers are an
// earlier warden's (events for every change, no watcher condition) gets
// the gated ones when opened: a cycle nobody watches then writes no event.
func TestLockTriggersUpgraded(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	db := st.Driver().(*store).db
	oldIns := `CREATE TRIGGER "go_goscope_locks_warden_ev_ins" AFTER INSERT ON "go_goscope_locks"
WHEN NEW.released_at IS NULL
BEGIN
	INSERT INTO "go_goscope_events" (kind, namespace, key, owner, token, at, data) VALUES ('acquired', NEW.namespace, NEW.key, NEW.owner, NEW.token, COALESCE(NEW.acquired_at, NEW.updated_at, 0), NULL);
END`
	oldDel := `CREATE TRIGGER "go_goscope_circuit_warden_ev_del" AFTER DELETE ON "go_goscope_circuit"
BEGIN
	INSERT INTO "go_goscope_events" (kind, namespace, key, owner, token, at, data) VALUES ('circuit-deleted', OLD.namespace, OLD.key, NULL, NULL, CAST(unixepoch('subsec') * 1000 AS INTEGER), NULL);
END`
	for _, q := range []string{
		`DROP TRIGGER "go_goscope_locks_warden_ev_ins"`, oldIns,
		`DROP TRIGGER "go_goscope_circuit_warden_ev_del"`, oldDel,
		`DROP TABLE "go_goscope_events_watchers"`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if ok, _, err := st.Driver().(*store).schemaCurrent(ctx); err != nil || ok {
		t.Fatalf("schema current with an earlier warden's triggers: %v, %v; want false", ok, err)
	}
	st.Close()

	st2 := openAt(t, path, nil)
	s2 := st2.Driver().(*store)
	if ok, _, err := s2.schemaCurrent(ctx); err != nil || !ok {
		t.Fatalf("schema current after the upgrade: %v, %v; want true", ok, err)
	}
	if _, _, err := st2.Locks().Acquire(ctx, "new", "o", time.Minute); err != nil { // an insert
		t.Fatal(err)
	}
	if _, err := st2.Circuits().RecordFailure(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Circuits().Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if n := eventCount(t, st2, ""); n != 0 {
		t.Fatalf("%d events after the upgrade with nobody watching, want 0", n)
	}
}

// TestReadOnlyStoreWatches: a read-only store (how `warden lock watch`
// opens a SQLite file) registers as a watcher like any other, through a
// pool of its own that writes nothing else: the changes another store
// makes are evented and delivered, to the driver's watch and to a lock
// watch, and its registrations go when it closes. The store itself still
// cannot write.
func TestReadOnlyStoreWatches(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "app:"})
	ro, err := Open(ctx, path, &Options{Prefix: "app:", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	wctx, stop := context.WithCancel(ctx)
	defer stop()

	ch, err := ro.Locks().Watch(wctx)
	if err != nil {
		t.Fatalf("Watch on a read-only store: %v", err)
	}
	if n := watcherRows(t, st, "app:", kindLock); n != 1 {
		t.Fatalf("%d lock registrations after a read-only store's Watch returned, want 1", n)
	}
	rec, ok, err := st.Locks().Acquire(ctx, "k", "o", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v %v", ok, err)
	}
	expectLock(t, ch, driver.LockAcquired, "k", "o", rec.Token)
	if ok, err := st.Locks().Release(ctx, "k", "o", rec.Token); err != nil || !ok {
		t.Fatalf("Release: %v %v", ok, err)
	}
	expectLock(t, ch, driver.LockReleased, "k", "o", rec.Token)

	cch, err := ro.Circuits().Watch(wctx)
	if err != nil {
		t.Fatalf("circuit Watch on a read-only store: %v", err)
	}
	if _, err := st.Circuits().RecordFailure(ctx, "c", 1); err != nil {
		t.Fatal(err)
	}
	if r := nextCircuit(t, cch); r.Name != "c" || r.State != driver.Open {
		t.Fatalf("circuit event %+v", r)
	}

	// A lock watch, as the CLI's, on a read-only store of its own.
	ro2 := openAt(t, path, &Options{Prefix: "app:", ReadOnly: true})
	locker, err := lock.New(ro2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	lch, err := locker.Watch(wctx, "job")
	if err != nil {
		t.Fatalf("lock watch on a read-only store: %v", err)
	}
	rec, ok, err = st.Locks().Acquire(ctx, "job", "o", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: %v %v", ok, err)
	}
	if ev := <-lch; ev.Kind != lock.Acquired || ev.Key != "job" || ev.Token != rec.Token {
		t.Fatalf("lock watch event %+v, want acquired job %d", ev, rec.Token)
	}

	// The read-only store writes nothing else.
	if _, _, err := ro.Locks().Acquire(ctx, "k", "o", time.Minute); err == nil {
		t.Fatal("Acquire on a read-only store succeeded")
	}
	ro.Close()
	locker.Close()
	ro2.Close()
	if n := watcherRows(t, st, "app:", kindLock) + watcherRows(t, st, "app:", kindCircuit); n != 0 {
		t.Fatalf("%d registrations left after the read-only stores closed", n)
	}
}

// TestReadOnlyWatchUnwritable: a read-only store on a file this process
// cannot write (played by opening its registration pool read-only too,
// since file modes do not stop root) cannot register, and says so with an
// error matching errors.ErrUnsupported rather than watching a stream
// nobody writes; nor can a store opened immutable, which sees no commits.
func TestReadOnlyWatchUnwritable(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	defer func(m string) { rwMode = m }(rwMode)
	rwMode = "&mode=ro"
	ro := openAt(t, path, &Options{ReadOnly: true})
	_, err := ro.Locks().Watch(ctx)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "cannot write") {
		t.Fatalf("Watch on a read-only store that cannot write the file: %v, want errors.ErrUnsupported", err)
	}
	if n := watcherRows(t, st, "", kindLock); n != 0 {
		t.Fatalf("%d registrations, want 0", n)
	}

	// Immutable: what the file holds, once every connection closed (the
	// last one moves the WAL into the file).
	ro.Close()
	st.Close()
	cfg, err := newConfig(&Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	im, err := openFile(ctx, path, cfg, "&mode=ro&immutable=1")
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if _, err := im.WatchLocks(ctx); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("Watch on an immutable store: %v, want errors.ErrUnsupported", err)
	}
}

// TestWatchersTableNameClash: the watchers table is named after the events
// table; no other table may take that name.
func TestWatchersTableNameClash(t *testing.T) {
	_, err := Open(context.Background(), filepath.Join(t.TempDir(), "w.db"), &Options{Tables: Tables{Cache: "ev_watchers", Events: "ev"}})
	if err == nil || !strings.Contains(err.Error(), "watchers table") {
		t.Fatalf("Open with the cache table named as the watchers table: %v, want an error", err)
	}
}
