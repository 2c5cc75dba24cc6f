package idempotency_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/testkit"
)

type idemOpts = idempotency.Options

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens a store on the shared memory database db, like one more
// process connecting to the same server.
func openStore(t *testing.T, db string, hook warden.Hook) *warden.Store {
	t.Helper()
	return openDriver(t, testkit.MemoryDriver(db), hook)
}

// openDriver opens a store on drv, closed at the end of the test.
func openDriver(t *testing.T, drv driver.Store, hook warden.Hook) *warden.Store {
	t.Helper()
	return testkit.Open(t, drv, &warden.Options{Hook: hook, Logger: quiet})
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
