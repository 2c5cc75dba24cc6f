package breaker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// circuitWrites counts the circuit operations that change the record.
func circuitWrites(ops *testkit.OpCounter) int {
	return ops.Sum(func(op string) bool {
		return strings.HasPrefix(op, "circuit.record-") || op == "circuit.try-probe" || op == "circuit.set" || op == "circuit.trip"
	})
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens a store on the shared memory database db, like one more
// process connecting to the same server.
func openStore(t *testing.T, db string, hook warden.Hook) *warden.Store {
	t.Helper()
	return testkit.Open(t, testkit.MemoryDriver(db), &warden.Options{Hook: hook, Logger: quiet})
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

func (c flakyCircuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, errDown
	}
	return c.Circuits.RecordFailure(ctx, name, threshold, gen)
}

func (c flakyCircuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, errDown
	}
	return c.Circuits.RecordSuccess(ctx, name, gen)
}

func (c flakyCircuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (driver.CircuitRecord, bool, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, false, errDown
	}
	return c.Circuits.TryProbe(ctx, name, owner, openFor, lease)
}

func (c flakyCircuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, errDown
	}
	return c.Circuits.RecordOutcome(ctx, name, o)
}

func (c flakyCircuits) Trip(ctx context.Context, name string, version int64) (driver.CircuitRecord, bool, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, false, errDown
	}
	return c.Circuits.Trip(ctx, name, version)
}

func (c flakyCircuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (driver.CircuitRecord, bool, error) {
	if c.f.down.Load() {
		return driver.CircuitRecord{}, false, errDown
	}
	return c.Circuits.TryProbes(ctx, name, owner, openFor, lease, maxProbes)
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
	f := &flaky{Store: testkit.MemoryDriver(db)}
	return testkit.Open(t, f, &warden.Options{Hook: hook, Logger: logger}), f
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
