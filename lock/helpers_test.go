package lock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/memory"
)

// The test doubles below wrap the real memory driver; nothing is mocked.

var dbSeq atomic.Int64

// newDB names a fresh shared memory database for one test.
func newDB(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), dbSeq.Add(1))
}

// logBuf collects a store's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *logBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// env is one "process": a store connection to a shared memory database.
type env struct {
	st   *warden.Store
	logs *logBuf
	ops  *opCounter
}

// opCounter counts store operations by name.
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) AfterOp(_ context.Context, op warden.OpInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[op.Op]++
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// openEnv opens a store on database db, optionally wrapping the memory
// driver.
func openEnv(t *testing.T, db string, wrap func(driver.Store) driver.Store) *env {
	t.Helper()
	drv := memory.NewDriver(&memory.Options{Name: db, Prefix: "p:"})
	if wrap != nil {
		drv = wrap(drv)
	}
	e := &env{logs: &logBuf{}, ops: &opCounter{n: map[string]int{}}}
	e.st = warden.New(drv, &warden.Options{
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)),
		Hook:   e.ops,
	})
	t.Cleanup(func() { _ = e.st.Close() })
	return e
}

// locker makes a Locker closed at the end of the test.
func (e *env) locker(t *testing.T, opts *Options) *Locker {
	t.Helper()
	l := New(e.st, opts)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// noNotify hides the memory driver's LockNotifier: only driver.Store's
// methods are promoted from the embedded interface.
type noNotify struct{ driver.Store }

func hideNotify(d driver.Store) driver.Store { return noNotify{d} }

// faultyStore lets a test make the lock driver's Refresh fail on command.
type faultyStore struct {
	driver.Store
	locks *faultyLocks
}

func (s *faultyStore) Locks() driver.Locks { return s.locks }

type faultyLocks struct {
	driver.Locks
	fail      atomic.Bool  // Refresh returns an error without applying
	ambiguous atomic.Bool  // Refresh applies, then returns an error
	calls     atomic.Int64 // Refresh calls
	oks       atomic.Int64 // successful (and reported) refreshes
	lastOK    atomic.Int64 // UnixNano when the last successful refresh was sent
}

var errInjected = errors.New("injected refresh failure")

func (f *faultyLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	f.calls.Add(1)
	if f.fail.Load() {
		return driver.LockRecord{}, false, errInjected
	}
	sent := time.Now()
	rec, ok, err := f.Locks.Refresh(ctx, key, owner, token, ttl)
	if f.ambiguous.Load() && err == nil {
		return driver.LockRecord{}, false, fmt.Errorf("connection reset after the write: %w", errInjected)
	}
	if err == nil && ok {
		f.lastOK.Store(sent.UnixNano())
		f.oks.Add(1)
	}
	return rec, ok, err
}

func wrapFaulty(f *faultyLocks) func(driver.Store) driver.Store {
	return func(d driver.Store) driver.Store {
		f.Locks = d.Locks()
		return &faultyStore{Store: d, locks: f}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitDone waits for a lease to end and returns its cause.
func waitDone(t *testing.T, s *Lease, within time.Duration) error {
	t.Helper()
	select {
	case <-s.Done():
		return context.Cause(s.Context())
	case <-time.After(within):
		t.Fatalf("lease %q still held after %v", s.Key(), within)
		return nil
	}
}

// queueLen is how many Acquire calls of l wait for key.
func queueLen(l *Locker, key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ks := l.keys[key]; ks != nil {
		return len(ks.queue)
	}
	return 0
}

// waitGoroutines polls until at most n goroutines run.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
