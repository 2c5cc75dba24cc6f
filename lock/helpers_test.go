package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/testkit"
)

// The test doubles below wrap the real memory driver; nothing is mocked.

// env is one "process": a store connection to a shared memory database.
type env struct {
	st   *warden.Store
	logs *testkit.LogBuffer
	ops  *testkit.OpCounter
}

// openEnv opens a store on database db, optionally wrapping the memory
// driver.
func openEnv(t *testing.T, db string, wrap func(driver.Store) driver.Store) *env {
	t.Helper()
	drv := testkit.MemoryDriver(db)
	if wrap != nil {
		drv = wrap(drv)
	}
	e := &env{logs: &testkit.LogBuffer{}, ops: &testkit.OpCounter{}}
	e.st = testkit.Open(t, drv, &warden.Options{
		Logger: slog.New(slog.NewTextHandler(e.logs, nil)),
		Hook:   e.ops,
	})
	return e
}

// locker makes a Locker closed at the end of the test.
func (e *env) locker(t *testing.T, opts *Options) *Locker {
	t.Helper()
	l, err := New(e.st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// shortLocker makes a Locker that accepts TTLs down to deadline.MinTTL,
// under MinTTL: the deadline rule's tests use leases that short, which
// keep exclusion but are lost often. It is closed at the end of the test.
func (e *env) shortLocker(t *testing.T, opts *Options) *Locker {
	t.Helper()
	l, err := newLocker(e.st, opts, deadline.MinTTL)
	if err != nil {
		t.Fatal(err)
	}
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
	// wake, if set (capacity 1), is signalled after every Refresh call,
	// for tests that wait for refreshes without sleeping.
	wake chan struct{}
}

var errInjected = errors.New("injected refresh failure")

func (f *faultyLocks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	f.calls.Add(1)
	if f.wake != nil {
		defer func() {
			select {
			case f.wake <- struct{}{}:
			default:
			}
		}()
	}
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

// waitDone waits for a lease to end and returns its cause. It sets no time
// limit: a lease that never ends is reported by go test's -timeout, with
// every goroutine's stack.
func waitDone(s *Lease) error {
	<-s.Done()
	return context.Cause(s.Context())
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

// waitGoroutines polls until at most n goroutines run. It sets no time
// limit: goroutines that never end are reported by go test's -timeout,
// with their stacks.
func waitGoroutines(n int) {
	for runtime.NumGoroutine() > n {
		time.Sleep(5 * time.Millisecond)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
