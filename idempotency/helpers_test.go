package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/store/memory"
)

type idemOpts = idempotency.Options

// dbName returns a fresh shared memory database name for one test.
func dbName(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "-" + hex.EncodeToString(b[:])
}

// opCounter is a warden.Hook counting operations by name.
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func newOpCounter() *opCounter { return &opCounter{n: map[string]int{}} }

func (c *opCounter) AfterOp(_ context.Context, op warden.OpInfo) {
	c.mu.Lock()
	c.n[op.Op]++
	c.mu.Unlock()
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens a store on the shared memory database db, like one more
// process connecting to the same server.
func openStore(t *testing.T, db string, hook warden.Hook) *warden.Store {
	t.Helper()
	return openDriver(t, memory.NewDriver(&memory.Options{Name: db, Prefix: "p:"}), hook)
}

func openDriver(t *testing.T, drv driver.Store, hook warden.Hook) *warden.Store {
	t.Helper()
	st := warden.New(drv, &warden.Options{Hook: hook, Logger: quiet})
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// errDown is what the flaky store answers while it is down.
var errDown = errors.New("connection reset (test outage)")

// flaky wraps the real memory driver; its idempotency Extend fails while
// down is set, and as many more times as failures says.
type flaky struct {
	driver.Store
	down     atomic.Bool
	failures atomic.Int32
}

func (f *flaky) Idempotency() driver.Idempotency { return flakyIdem{f.Store.Idempotency(), f} }

type flakyIdem struct {
	driver.Idempotency
	f *flaky
}

func (i flakyIdem) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	if i.f.down.Load() || i.f.failures.Add(-1) >= 0 {
		return false, errDown
	}
	return i.Idempotency.Extend(ctx, key, owner, lease)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// pending reports whether key has a live pending claim.
func pending(t *testing.T, st *warden.Store, key string) bool {
	t.Helper()
	rec, found, err := st.Idempotency().Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return found && rec.Status == driver.IdemPending
}

var errBoom = errors.New("boom")

// fast are options with short polling, for tests.
func fast(o idemOpts) *idemOpts {
	if o.PollMin == 0 {
		o.PollMin = 2 * time.Millisecond
	}
	if o.PollMax == 0 {
		o.PollMax = 20 * time.Millisecond
	}
	return &o
}
