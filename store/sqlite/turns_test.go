package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fairtest"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
)

// The waiters' queues (turns.go): a release hands the key to the waiters
// in the order they queued, across processes; a waiter that dies or
// stops waiting stops counting once its entry lapses; the lock row alone
// decides who holds the lock.

// fairResult is what a "fair" child reports.
type fairResult = testkit.FairResult

// counterDB opens a plain handle on the shared file for the counter the
// holders bump, with a busy timeout of its own.
func counterDB(path string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)")
}

// helperFair: WARDEN_SQLITE_WORKERS workers, each a Locker on a store of
// its own, take the key "fair" in turn until the counter, bumped under
// the lock, reaches WARDEN_SQLITE_TOTAL. The child starts once the file
// "go" exists in WARDEN_SQLITE_DIR, after writing "ready<id>".
func helperFair() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, id := os.Getenv("WARDEN_SQLITE_DIR"), os.Getenv("WARDEN_SQLITE_ID")
	workers, total := envInt("WARDEN_SQLITE_WORKERS"), envInt("WARDEN_SQLITE_TOTAL")
	path := filepath.Join(dir, "shared.db")
	db, err := counterDB(path)
	if err != nil {
		return err
	}
	defer db.Close()
	var lockers []*lock.Locker
	for range workers {
		st, err := Open(ctx, path, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		l, err := lock.New(st, &lock.Options{TTL: 30 * time.Second})
		if err != nil {
			return err
		}
		defer l.Close()
		lockers = append(lockers, l)
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"+id), nil, 0o644); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(2 * time.Millisecond) // polling for the start signal
	}
	res := fairtest.Run(ctx, lockers, "fair", total, 0, func(ctx context.Context) (int64, error) {
		var n int64
		err := db.QueryRowContext(ctx, `INSERT INTO fair_counter (k, n) VALUES ('c', 1)
			ON CONFLICT (k) DO UPDATE SET n = n + 1 RETURNING n`).Scan(&n)
		return n, err
	})
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv("WARDEN_SQLITE_RESULT"), b, 0o644)
}

// TestTurnsFairAcrossProcesses: 2 processes × 4 workers (a Locker and a
// store each) take one key in turn, holding it for a counter bump, until
// the counter reaches 160. Waiters queue in the file, so every worker
// gets about its share: the fewest acquisitions of a worker are at least
// half the most (releasers and waiters of the releasing process that ask
// at once made it about 0.3). The tokens increase with the counter: one
// holder at a time.
func TestTurnsFairAcrossProcesses(t *testing.T) {
	testkit.FairTwice(t, func(int) bool { return turnsFairRun(t) })
}

func turnsFairRun(t *testing.T) bool {
	const procs, workers, total = 2, 4, 160
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "shared.db")
	openAt(t, path, nil) // creates the file and the tables
	db, err := counterDB(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE fair_counter (k TEXT PRIMARY KEY, n INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for i := range procs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), helperEnv+"=fair",
			"WARDEN_SQLITE_DIR="+dir, "WARDEN_SQLITE_ID="+strconv.Itoa(i),
			"WARDEN_SQLITE_WORKERS="+strconv.Itoa(workers), "WARDEN_SQLITE_TOTAL="+strconv.Itoa(total),
			"WARDEN_SQLITE_RESULT="+filepath.Join(dir, fmt.Sprintf("out%d.json", i)))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	pollUntil(t, ctx, "the children to be ready", func() bool {
		for i := range procs {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("ready%d", i))); err != nil {
				return false
			}
		}
		return true
	})
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var results []testkit.FairResult
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("out%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		var r fairResult
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	return testkit.CheckFair(t, results, workers, total)
}

// pollUntil polls cond (the file's state) until it holds; the test fails
// if ctx ends first.
func pollUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not a synchronisation
	}
}

// turnEntry reads owner's entry in the queue of key: its seq and expiry
// (Unix ms); found is false when it has none.
func turnEntry(t *testing.T, s *store, key, owner string) (seq, exp int64, found bool) {
	t.Helper()
	err := s.db.QueryRow(`SELECT seq, expires_at FROM `+quote(s.cfg.turns)+` WHERE namespace = ? AND key = ? AND owner = ?`,
		s.cfg.prefix, s.lockPfx+key, owner).Scan(&seq, &exp)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return seq, exp, true
}

// helperQueue: owner "dead" waits for key "k" in the queue (WaitLock)
// until the parent kills this process.
func helperQueue() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := Open(ctx, filepath.Join(os.Getenv("WARDEN_SQLITE_DIR"), "shared.db"), nil)
	if err != nil {
		return err
	}
	defer st.Close()
	w := st.Driver().(driver.LockWaiter)
	for ctx.Err() == nil {
		if _, err := w.WaitLock(ctx, "k", "dead", time.Minute); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// TestTurnsDeadWaiterBounded: a queued waiter that dies (its process is
// killed) or stops waiting without LeaveLock keeps the others from the
// released key only while its entry lives, and its entry lives at most
// turnTTL after it stopped. Every acquire by the live waiter behind it
// is checked against the bound B = min(the dead entry's expiry, the
// release + turnGrace), on the store clock: refused only if sent before
// B, acquired only if answered at or after B.
func TestTurnsDeadWaiterBounded(t *testing.T) {
	for _, how := range []string{"killed", "abandoned"} {
		t.Run(how, func(t *testing.T) { deadWaiter(t, how) })
	}
}

func deadWaiter(t *testing.T, how string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	path := filepath.Join(dir, "shared.db")
	hs := openAt(t, path, nil).Driver().(*store)
	ws := openAt(t, path, nil).Driver().(*store)
	if _, ok, err := hs.Locks().Acquire(ctx, "k", "h", time.Minute); err != nil || !ok {
		t.Fatalf("holder: %v %v", ok, err)
	}
	var stopped int64 // store clock once the dead waiter surely stopped renewing
	switch how {
	case "killed":
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), helperEnv+"=queue", "WARDEN_SQLITE_DIR="+dir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pollUntil(t, ctx, "the child to queue", func() bool { _, _, ok := turnEntry(t, hs, "k", "dead"); return ok })
		if err := cmd.Process.Kill(); err != nil { // SIGKILL: no LeaveLock, no Close
			t.Fatal(err)
		}
		_ = cmd.Wait()
	case "abandoned":
		qs := openAt(t, path, nil).Driver().(*store)
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := qs.WaitLock(wctx, "k", "dead", time.Minute); done <- err }()
		pollUntil(t, ctx, "the waiter to queue", func() bool { _, _, ok := turnEntry(t, hs, "k", "dead"); return ok })
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitLock: %v", err)
		}
		// LeaveLock is never called.
	}
	stopped = nowMs()
	deadSeq, deadExp, ok := turnEntry(t, hs, "k", "dead")
	if !ok {
		t.Fatal("the dead waiter's entry is gone")
	}
	if bound := stopped + driver.Millis(turnTTL); deadExp > bound {
		t.Fatalf("the dead waiter's entry expires at %d, after its bound %d (stopped at %d + turnTTL)", deadExp, bound, stopped)
	}
	// A live waiter queues behind it.
	if err := ws.keepTurn(ctx, ws.lockPfx+"k", "w", true); err != nil {
		t.Fatal(err)
	}
	if seq, _, _ := turnEntry(t, hs, "k", "w"); seq <= deadSeq {
		t.Fatalf("the live waiter queued at %d, ahead of the dead one's %d", seq, deadSeq)
	}
	if ok, err := hs.Locks().Release(ctx, "k", "h", mustHolder(t, hs, "k").Token); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	var freed int64
	if err := hs.db.QueryRow(`SELECT expires_at FROM `+quote(hs.cfg.locks)+` WHERE key = ?`, hs.lockPfx+"k").Scan(&freed); err != nil {
		t.Fatal(err)
	}
	b := min(deadExp, freed+driver.Millis(turnGrace))
	refused := 0
	for {
		if err := ws.keepTurn(ctx, ws.lockPfx+"k", "w", false); err != nil {
			t.Fatal(err)
		}
		sent := nowMs()
		rec, ok, err := ws.Locks().Acquire(ctx, "k", "w", time.Minute)
		answered := nowMs()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if answered < b {
				t.Fatalf("acquired at %d, before the dead waiter's turn ended (%d)", answered, b)
			}
			if rec.Owner != "w" {
				t.Fatalf("acquired as %q", rec.Owner)
			}
			break
		}
		if sent >= b {
			t.Fatalf("refused at %d, after the bound %d: the dead waiter still blocks the key", sent, b)
		}
		refused++
		time.Sleep(20 * time.Millisecond) // polling interval, not a synchronisation
	}
	t.Logf("refused %d times while the dead waiter's entry lived (%d ms after the release)", refused, b-freed)
	if _, _, ok := turnEntry(t, hs, "k", "w"); ok {
		t.Error("the waiter's entry is left after it acquired")
	}
	if _, err := hs.Purge(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := turnEntry(t, hs, "k", "dead"); ok {
		t.Error("Purge left the lapsed entry")
	}
}

func mustHolder(t *testing.T, s *store, key string) driver.LockRecord {
	t.Helper()
	rec, ok, err := s.Locks().Get(context.Background(), key)
	if err != nil || !ok {
		t.Fatalf("get %q: %v %v", key, ok, err)
	}
	return rec
}

// TestTurnsReleaserDoesNotBarge: a holder releases while a waiter of
// another store on the file is queued, and asks again at once. The key
// goes to the waiter: the releaser's TryAcquire is refused, its Acquire
// queues behind, and gets the key at the waiter's release.
func TestTurnsReleaserDoesNotBarge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "barge.db")
	hst, wst := openAt(t, path, nil), openAt(t, path, nil)
	probe := hst.Driver().(*store)
	holder, err := lock.New(hst, &lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := lock.New(wst, &lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	type acquired struct {
		lease *lock.Lease
		err   error
	}
	async := func(l *lock.Locker) <-chan acquired {
		ch := make(chan acquired, 1)
		go func() { lease, err := l.Acquire(ctx, "k"); ch <- acquired{lease, err} }()
		return ch
	}
	var last int64
	for round := range 3 {
		held, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := async(waiter)
		pollUntil(t, ctx, "the waiter to queue", func() bool { _, _, ok := turnEntry(t, probe, "k", waiter.Owner()); return ok })
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		again, err := holder.TryAcquire(ctx, "k")
		if err == nil {
			again.Release(ctx)
			t.Fatalf("round %d: the releaser took the key back past the queued waiter", round)
		}
		if !errors.Is(err, lock.ErrLocked) {
			t.Fatal(err)
		}
		next := async(holder) // the releaser queues
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.lease.Token() <= held.Token() || held.Token() <= last {
			t.Fatalf("tokens %d, %d after %d", held.Token(), r.lease.Token(), last)
		}
		pollUntil(t, ctx, "the releaser to queue", func() bool { _, _, ok := turnEntry(t, probe, "k", holder.Owner()); return ok })
		if err := r.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r2 := <-next
		if r2.err != nil {
			t.Fatal(r2.err)
		}
		last = r2.lease.Token()
		if last <= r.lease.Token() {
			t.Fatalf("token %d after %d", last, r.lease.Token())
		}
		if err := r2.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := probe.db.QueryRow(`SELECT count(*) FROM ` + quote(probe.cfg.turns)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d queue entries left after every Acquire returned", n)
	}
}

// TestTurnsOlderFile: a file written by a warden from before the waiters'
// table opens read-only as before (its store declines to wait and reads
// locks), and read-write gets the table added; the lock table's layout
// is untouched.
func TestTurnsOlderFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	st, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Locks().Acquire(ctx, "k", "a", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	s := st.Driver().(*store)
	cols, err := tableColumns(ctx, s.db, s.cfg.locks)
	if err != nil {
		t.Fatal(err)
	}
	if len(cols) != 9 {
		t.Errorf("the lock table has %d columns, want go-go-scope's layout's 9", len(cols))
	}
	if _, err := s.db.Exec("DROP TABLE " + quote(s.cfg.turns)); err != nil {
		t.Fatal(err)
	}
	st.Close()

	ro, err := Open(ctx, path, &Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a file without the waiters' table: %v", err)
	}
	if rec, ok, err := ro.Locks().Get(ctx, "k"); err != nil || !ok || rec.Owner != "a" {
		t.Fatalf("get: %+v %v %v", rec, ok, err)
	}
	if again, err := ro.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "b", time.Minute); again || err != nil {
		t.Errorf("WaitLock on a read-only store: %v %v, want false, nil", again, err)
	}
	ro.Close()

	rw := openAt(t, path, nil)
	var n int
	if err := rw.Driver().(*store).db.QueryRow("SELECT count(*) FROM " + quote(s.cfg.turns)).Scan(&n); err != nil {
		t.Fatalf("the waiters' table was not added: %v", err)
	}
}

// TestTurnsCloseLeavesQueue: a store closed while its Locker waits in the
// queue takes its entry out as it closes — the wait ends with ErrClosed
// and the entry is gone at once, so no release hands the key to a waiter
// that is no more (it kept its place until the entry lapsed, 2 s, when
// the wait's own LeaveLock came after Close's clean-up).
func TestTurnsCloseLeavesQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "close.db")
	hst := openAt(t, path, nil)
	probe := hst.Driver().(*store)
	holder, err := lock.New(hst, &lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	for round := range 5 {
		held, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		wst, err := Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		waiter, err := lock.New(wst, &lock.Options{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { _, err := waiter.Acquire(ctx, "k"); got <- err }()
		pollUntil(t, ctx, "the waiter to queue", func() bool { _, _, ok := turnEntry(t, probe, "k", waiter.Owner()); return ok })
		if err := wst.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-got; !errors.Is(err, warden.ErrClosed) && !errors.Is(err, lock.ErrClosed) {
			t.Fatalf("round %d: Acquire on a store closed while it waited: %v, want ErrClosed", round, err)
		}
		if _, _, ok := turnEntry(t, probe, "k", waiter.Owner()); ok {
			t.Fatalf("round %d: the closed store's waiter is still queued", round)
		}
		waiter.Close()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
