package breaker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/memory"
)

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

// writes counts the circuit operations that change the record.
func (c *opCounter) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for op, k := range c.n {
		if strings.HasPrefix(op, "circuit.record-") || op == "circuit.try-probe" || op == "circuit.set" {
			n += k
		}
	}
	return n
}

func (c *opCounter) reset() {
	c.mu.Lock()
	c.n = map[string]int{}
	c.mu.Unlock()
}

// logBuffer collects log output safely.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens a store on the shared memory database db, like one more
// process connecting to the same server.
func openStore(t *testing.T, db string, hook warden.Hook) *warden.Store {
	t.Helper()
	st := warden.New(memory.NewDriver(&memory.Options{Name: db, Prefix: "p:"}), &warden.Options{Hook: hook, Logger: quiet})
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// newBreaker makes a Breaker closed at the end of the test.
func newBreaker(t *testing.T, st *warden.Store, name string, opts *breaker.Options) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(st, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// errDown is what the flaky store answers while it is down.
var errDown = errors.New("connection refused (test outage)")

// flaky wraps the real memory driver; its circuit operations fail while
// down is set. It has no notifications (the embedded interface hides
// them), so Breakers on it poll.
type flaky struct {
	driver.Store
	down atomic.Bool
}

func (f *flaky) Circuits() driver.Circuits { return flakyCircuits{f.Store.Circuits(), f} }

// flakyWatching is flaky with the memory driver's notifications.
type flakyWatching struct{ *flaky }

func (f flakyWatching) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	if f.down.Load() {
		return nil, errDown
	}
	return f.Store.(driver.CircuitNotifier).WatchCircuits(ctx)
}

type flakyCircuits struct {
	driver.Circuits
	f *flaky
}

func (c flakyCircuits) RecordFailure(ctx context.Context, name string, threshold int) (driver.CircuitRecord, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, errDown
	}
	return c.Circuits.RecordFailure(ctx, name, threshold)
}

func (c flakyCircuits) RecordSuccess(ctx context.Context, name string) (driver.CircuitRecord, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, errDown
	}
	return c.Circuits.RecordSuccess(ctx, name)
}

func (c flakyCircuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, false, errDown
	}
	return c.Circuits.TryProbe(ctx, name, owner, openFor, lease)
}

func (c flakyCircuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, false, errDown
	}
	return c.Circuits.Get(ctx, name)
}

// openFlaky opens a flaky store (polling) on db.
func openFlaky(t *testing.T, db string, hook warden.Hook, logger *slog.Logger) (*warden.Store, *flaky) {
	t.Helper()
	if logger == nil {
		logger = quiet
	}
	f := &flaky{Store: memory.NewDriver(&memory.Options{Name: db, Prefix: "p:"})}
	st := warden.New(f, &warden.Options{Hook: hook, Logger: logger})
	t.Cleanup(func() { _ = st.Close() })
	return st, f
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

// record reads the shared record through st.
func record(t *testing.T, st *warden.Store, name string) driver.CircuitRecord {
	t.Helper()
	rec, _, err := st.Circuits().Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

var (
	errBoom = errors.New("boom")
	fail    = func(context.Context) error { return errBoom }
	succeed = func(context.Context) error { return nil }
)
