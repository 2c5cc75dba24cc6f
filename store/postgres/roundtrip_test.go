package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/postgres"
)

// counter is a pgx tracer that counts round trips: every query, exec,
// BEGIN and COMMIT (pgx traces them all as queries) and every prepare.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// newCountingStore opens a store with New on a one-connection pool whose
// tracer counts round trips.
func newCountingStore(t testing.TB, prefix string) (*warden.Store, *counter) {
	cfg, err := pgxpool.ParseConfig(drivertest.ServerURL(t, "postgres", "WARDEN_TEST_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{}
	cfg.ConnConfig.Tracer = c
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := postgres.New(pool, &postgres.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, c
}

// TestRoundTrips checks how many round trips each operation makes. pgx
// prepares a statement the first time a connection runs it (one more
// round trip, once per connection); every operation runs once unmeasured
// first, so the counts are those of a warm connection, the steady state
// of a service.
func TestRoundTrips(t *testing.T) {
	st, c := newCountingStore(t, fmt.Sprintf("roundtrips%d:", time.Now().UnixNano()))
	ctx := context.Background()
	tag := time.Now().Format("150405.000000")
	lk, cb, ca, id, cp := st.Locks(), st.Circuits(), st.Cache(), st.Idempotency(), st.Checkpoints()

	type op struct {
		name string
		want int64
		f    func(key string) error
	}
	var token, gen, version, epoch int64
	ops := []op{
		{"Locks.Acquire (new key)", 1, func(key string) error {
			l, ok, err := lk.Acquire(ctx, key, "a", time.Minute)
			if err == nil && !ok {
				t.Errorf("%s: not acquired", key)
			}
			token = l.Token
			return err
		}},
		{"Locks.Acquire (held by another)", 1, func(key string) error {
			r, ok, err := lk.Acquire(ctx, key, "b", time.Minute)
			if err == nil && (ok || r.Owner == "" || r.Token != token) {
				t.Errorf("%s: acquired=%v holder %q token %d, want the holder a with token %d", key, ok, r.Owner, r.Token, token)
			}
			return err
		}},
		{"Locks.Refresh", 1, func(key string) error {
			_, ok, err := lk.Refresh(ctx, key, "a", token, time.Minute)
			if err == nil && !ok {
				t.Errorf("%s: refresh refused", key)
			}
			return err
		}},
		{"Locks.Release", 1, func(key string) error {
			ok, err := lk.Release(ctx, key, "a", token)
			if err == nil && !ok {
				t.Errorf("%s: release refused", key)
			}
			return err
		}},
		{"Circuits.RecordFailure", 1, func(key string) error {
			r, err := cb.RecordFailure(ctx, key, 1)
			if err == nil && r.State != driver.Open {
				t.Errorf("%s: state %s", key, r.State)
			}
			return err
		}},
		{"Circuits.RecordSuccess", 1, func(key string) error { _, err := cb.RecordSuccess(ctx, key); return err }},
		{"Circuits.TryProbe", 1, func(key string) error {
			r, _, err := cb.TryProbe(ctx, key, "p", 0, time.Second)
			gen = r.Generation()
			return err
		}},
		// The gobreaker-style operations (issue 13): each is one
		// statement, whatever it decides.
		{"Circuits.TryProbes (a second of 2 slots)", 1, func(key string) error {
			r, ok, err := cb.TryProbes(ctx, key, "p2", 0, time.Second, 2)
			if err == nil && !ok {
				t.Errorf("%s: the second of 2 probe slots refused", key)
			}
			epoch = r.ProbeEpoch
			return err
		}},
		{"Circuits.RecordOutcome (a probe slot no longer granted: ignored)", 1, func(key string) error {
			r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch + 1})
			if err == nil && r.State != driver.HalfOpen {
				t.Errorf("%s: the outcome of a probe slot no longer granted left the circuit %s", key, r.State)
			}
			return err
		}},
		{"Circuits.RecordOutcome (older generation: ignored)", 1, func(key string) error {
			r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen - 1, Threshold: 1})
			if err == nil && r.State != driver.HalfOpen {
				t.Errorf("%s: an outcome of an older generation left the circuit %s", key, r.State)
			}
			return err
		}},
		{"Circuits.RecordOutcome (success, generation matches, closing)", 1, func(key string) error {
			r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch, CloseAfter: 1})
			if err == nil && r.State != driver.Closed {
				t.Errorf("%s: a probe's success left the circuit %s", key, r.State)
			}
			return err
		}},
		{"Circuits.RecordOutcome (failure counted, threshold 0)", 1, func(key string) error {
			r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeFailure, Successes: 2, Interval: time.Hour})
			version = r.Version
			return err
		}},
		{"Circuits.Trip (at the version counted)", 1, func(key string) error {
			_, ok, err := cb.Trip(ctx, key, version)
			if err == nil && !ok {
				t.Errorf("%s: Trip at the current version refused", key)
			}
			return err
		}},
		{"Circuits.Trip (stale version)", 1, func(key string) error {
			_, ok, err := cb.Trip(ctx, key, version)
			if err == nil && ok {
				t.Errorf("%s: Trip at a stale version applied", key)
			}
			return err
		}},
		{"Cache.Set", 1, func(key string) error { return ca.Set(ctx, key, []byte("v"), time.Minute) }},
		{"Cache.SetIfAbsent", 1, func(key string) error {
			ok, err := ca.SetIfAbsent(ctx, key, []byte("w"), time.Minute)
			if ok {
				t.Errorf("%s: SetIfAbsent replaced a live entry", key)
			}
			return err
		}},
		{"Cache.Get", 1, func(key string) error {
			e, ok, err := ca.Get(ctx, key)
			if err == nil && (!ok || string(e.Value) != "v") {
				t.Errorf("%s: Get = %q, %v", key, e.Value, ok)
			}
			return err
		}},
		{"Idempotency.Claim", 1, func(key string) error {
			_, o, err := id.Claim(ctx, key, "a", time.Minute, "fp")
			if err == nil && o != driver.Claimed {
				t.Errorf("%s: outcome %v", key, o)
			}
			return err
		}},
		{"Idempotency.Extend", 1, func(key string) error { _, err := id.Extend(ctx, key, "a", time.Minute); return err }},
		{"Idempotency.Complete", 1, func(key string) error {
			_, err := id.Complete(ctx, key, "a", []byte("r"), time.Minute)
			return err
		}},
		{"Checkpoints.Fence", 1, func(key string) error { _, err := cp.Fence(ctx, key, 5); return err }},
		{"Checkpoints.Save", 1, func(key string) error {
			_, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: key, Progress: 50, Data: []byte("d"), Token: 5})
			if err == nil && !ok {
				t.Errorf("%s: save refused", key)
			}
			return err
		}},
		{"Checkpoints.Latest", 1, func(key string) error { _, _, err := cp.Latest(ctx, key); return err }},
		// Fenced deletions: BEGIN, lock the fence row, DELETE, COMMIT.
		{"Checkpoints.Cleanup (fenced)", 4, func(key string) error {
			_, ok, err := cp.CleanupFenced(ctx, key, 0, 5)
			if err == nil && !ok {
				t.Errorf("%s: cleanup refused", key)
			}
			return err
		}},
	}
	// Warm: every statement prepared on the pool's one connection.
	for _, o := range ops {
		if err := o.f("warm" + tag); err != nil {
			t.Fatalf("%s (warm-up): %v", o.name, err)
		}
	}
	for _, o := range ops {
		before := c.n.Load()
		if err := o.f("k" + tag); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		if got := c.n.Load() - before; got != o.want {
			t.Errorf("%s: %d round trips, want %d", o.name, got, o.want)
		} else {
			t.Logf("%s: %d round trip(s)", o.name, got)
		}
	}
}
