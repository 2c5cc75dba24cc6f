package mongo_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// counter counts the commands a client sends (each is one round trip),
// apart from those on the event collection and its watchers collection,
// which the store's event writer sends in the background (inserts, now
// and then a trim, and a read of who watches); those are counted
// separately.
type counter struct {
	cmds, events, watchers atomic.Int64
}

func (c *counter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		coll, _ := e.Command.Lookup(e.CommandName).StringValueOK()
		if e.CommandName == "getMore" {
			coll, _ = e.Command.Lookup("collection").StringValueOK()
		}
		switch coll {
		case mongo.DefaultEventsCollection:
			c.events.Add(1)
		case mongo.DefaultEventsCollection + "_watchers":
			c.watchers.Add(1)
		default:
			c.cmds.Add(1)
		}
	}}
}

// newCountingStore opens a store with New on a client whose commands are
// counted, through the wire double (when the server's URL lets it read the
// connections), so that the server's answers are in MongoDB's words: the
// counts are MongoDB's on every test server.
func newCountingStore(t testing.TB, prefix string) (*warden.Store, *counter) {
	c := &counter{}
	co := options.Client().SetMonitor(c.monitor())
	db, _, ok := wireDB(t, co)
	if !ok {
		db = testDB(t, co)
	}
	st, err := mongo.New(db, &mongo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		if err := db.Client().Ping(context.Background(), nil); err != nil {
			t.Errorf("the client given to New was disconnected with the store: %v", err)
		}
	})
	return st, c
}

// TestRoundTrips counts the commands (round trips) of every driver
// operation on its common path, with the driver's command monitor.
func TestRoundTrips(t *testing.T) {
	st, n := newCountingStore(t, "roundtrips-"+time.Now().Format("150405.000000")+":")
	ctx := context.Background()
	count := func(name string, want int64, f func() error) {
		t.Helper()
		before := n.cmds.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := n.cmds.Load() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		} else {
			t.Logf("%s: %d round trips", name, got)
		}
	}
	d := st.Driver()
	lk, cb, ca, id, cp := d.Locks(), d.Circuits(), d.Cache(), d.Idempotency(), d.Checkpoints()
	var token int64
	events0 := n.events.Load() // the event collection's migration
	count("Locks.Acquire (new key)", 1, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if err == nil && !ok {
			t.Error("not acquired")
		}
		token = l.Token
		return err
	})
	count("Locks.Acquire (held by another)", 2, func() error {
		_, ok, err := lk.Acquire(ctx, "k", "b", time.Minute)
		if ok {
			t.Error("acquired a held lock")
		}
		return err
	})
	count("Locks.Acquire (own live holding, renewed)", 3, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if err == nil && (!ok || l.Token != token) {
			t.Errorf("re-acquire: ok=%v token %d, want %d", ok, l.Token, token)
		}
		return err
	})
	count("Locks.Refresh", 1, func() error {
		_, ok, err := lk.Refresh(ctx, "k", "a", token, time.Minute)
		if err == nil && !ok {
			t.Error("refresh refused")
		}
		return err
	})
	count("Locks.Release", 1, func() error {
		ok, err := lk.Release(ctx, "k", "a", token)
		if err == nil && !ok {
			t.Error("release refused")
		}
		return err
	})
	time.Sleep(2 * time.Millisecond) // a later millisecond: the candidate token is above the stored one
	count("Locks.Acquire (released key)", 1, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "b", time.Minute)
		if err == nil && (!ok || l.Token <= token) {
			t.Errorf("acquire after release: ok=%v token %d, want > %d", ok, l.Token, token)
		}
		return err
	})
	count("Locks.Get", 1, func() error { _, _, err := lk.Get(ctx, "k"); return err })
	count("Circuits.RecordFailure (closed, below the threshold)", 1, func() error {
		r, err := cb.RecordFailure(ctx, "c", 5, driver.AnyGeneration)
		if err == nil && r.State != driver.Closed {
			t.Errorf("state %s", r.State)
		}
		return err
	})
	count("Circuits.RecordSuccess (closed)", 1, func() error { _, err := cb.RecordSuccess(ctx, "c", driver.AnyGeneration); return err })
	count("Circuits.RecordFailure (opening, threshold 1)", 1, func() error {
		r, err := cb.RecordFailure(ctx, "c", 1, driver.AnyGeneration)
		if err == nil && r.State != driver.Open {
			t.Errorf("state %s", r.State)
		}
		return err
	})
	count("Circuits.RecordFailure (open, threshold 1)", 2, func() error { _, err := cb.RecordFailure(ctx, "c", 1, driver.AnyGeneration); return err })
	count("Circuits.TryProbe (granted)", 1, func() error {
		_, ok, err := cb.TryProbe(ctx, "c", "p", 0, time.Minute)
		if err == nil && !ok {
			t.Error("probe refused")
		}
		return err
	})
	count("Circuits.TryProbe (refused)", 2, func() error { _, _, err := cb.TryProbe(ctx, "c", "q", 0, time.Minute); return err })
	// The gobreaker-style operations (issue 13): one findOneAndUpdate per
	// case, tried in order with disjoint filters, so each decision is one
	// atomic step; a case whose filter does not match costs a round trip,
	// and an operation that matches no case (an outcome of an older
	// generation, a Trip at a stale version) ends with a read of the
	// record it returns.
	var gen, version, epoch int64
	count("Circuits.TryProbes (a second of 2 slots)", 3, func() error {
		r, ok, err := cb.TryProbes(ctx, "c", "p2", 0, time.Minute, 2)
		if err == nil && !ok {
			t.Error("the second of 2 probe slots refused")
		}
		gen, epoch = r.Generation(), r.ProbeEpoch
		return err
	})
	count("Circuits.RecordOutcome (a probe slot no longer granted: ignored)", 3, func() error {
		r, err := cb.RecordOutcome(ctx, "c", driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen, ProbeEpoch: epoch + 1, Threshold: 1})
		if err == nil && r.State != driver.HalfOpen {
			t.Errorf("the outcome of a probe slot no longer granted left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (older generation: ignored)", 3, func() error {
		r, err := cb.RecordOutcome(ctx, "c", driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen - 1, Threshold: 1})
		if err == nil && r.State != driver.HalfOpen {
			t.Errorf("an outcome of an older generation left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (success, generation matches, closing)", 2, func() error {
		r, err := cb.RecordOutcome(ctx, "c", driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch, CloseAfter: 1})
		if err == nil && r.State != driver.Closed {
			t.Errorf("a probe's success left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (failure counted, threshold 0)", 1, func() error {
		r, err := cb.RecordOutcome(ctx, "c", driver.Outcome{Kind: driver.OutcomeFailure, Successes: 2, Interval: time.Hour})
		version = r.Version
		return err
	})
	count("Circuits.Trip (at the version counted)", 1, func() error {
		_, ok, err := cb.Trip(ctx, "c", version)
		if err == nil && !ok {
			t.Error("Trip at the current version refused")
		}
		return err
	})
	count("Circuits.Trip (stale version)", 2, func() error {
		_, ok, err := cb.Trip(ctx, "c", version)
		if err == nil && ok {
			t.Error("Trip at a stale version applied")
		}
		return err
	})
	count("Cache.Set", 1, func() error { return ca.Set(ctx, "c", []byte("v"), time.Minute) })
	count("Cache.SetIfAbsent", 1, func() error {
		ok, err := ca.SetIfAbsent(ctx, "c", []byte("w"), time.Minute)
		if ok {
			t.Error("SetIfAbsent replaced a live entry")
		}
		return err
	})
	count("Cache.Get", 1, func() error {
		e, ok, err := ca.Get(ctx, "c")
		if err == nil && (!ok || string(e.Value) != "v") {
			t.Errorf("Get: %v %q", ok, e.Value)
		}
		return err
	})
	count("Idempotency.Claim (new key)", 1, func() error {
		_, o, err := id.Claim(ctx, "i", "a", time.Minute, "fp")
		if err == nil && o != driver.Claimed {
			t.Errorf("outcome %v", o)
		}
		return err
	})
	count("Idempotency.Claim (in progress)", 2, func() error { _, _, err := id.Claim(ctx, "i", "b", time.Minute, "fp"); return err })
	count("Idempotency.Extend", 1, func() error { _, err := id.Extend(ctx, "i", "a", time.Minute); return err })
	count("Idempotency.Complete", 1, func() error { _, err := id.Complete(ctx, "i", "a", []byte("r"), time.Minute); return err })
	count("Checkpoints.Fence (new task)", 6, func() error { _, err := cp.Fence(ctx, "t", 5); return err })
	count("Checkpoints.Save", 2, func() error {
		_, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Progress: 1, Token: 5})
		if err == nil && !ok {
			t.Error("save refused")
		}
		return err
	})
	count("Checkpoints.Fence", 1, func() error { _, err := cp.Fence(ctx, "t", 6); return err })
	// Reads read the fence's deletedThrough after the checkpoints.
	count("Checkpoints.Latest", 2, func() error { _, _, err := cp.Latest(ctx, "t"); return err })
	count("Checkpoints.DeleteAll", 3, func() error {
		_, ok, err := cp.DeleteAll(ctx, "t", 6)
		if err == nil && !ok {
			t.Error("delete refused")
		}
		return err
	})

	// The lock and circuit changes above each queued one event; the writer
	// drops them, nobody watching the namespace, after reading who watches
	// (off the operations' path).
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("background commands: %d on the event collection, %d reads of its watchers (for 13 lock and circuit changes, nobody watching)", n.events.Load()-events0, n.watchers.Load())
	if got := n.events.Load() - events0; got != 0 {
		t.Errorf("%d commands on the event collection while nobody watched, want 0", got)
	}
	if n.watchers.Load() == 0 {
		t.Error("the event writer never read who watches")
	}
}

// TestRoundTripsWatched: while the namespace is watched, each lock change
// still costs its one round trip, and its event is written in the
// background.
func TestRoundTripsWatched(t *testing.T) {
	st, n := newCountingStore(t, "roundtrips-w-"+time.Now().Format("150405.000000")+":")
	ctx := context.Background()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := st.Driver().(driver.LockNotifier).WatchLocks(wctx)
	if err != nil {
		t.Fatal(err)
	}
	lk := st.Driver().Locks()
	before := n.cmds.Load()
	l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
	if err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if ok, err := lk.Release(ctx, "k", "a", l.Token); err != nil || !ok {
		t.Fatalf("Release: ok=%v err=%v", ok, err)
	}
	if got := n.cmds.Load() - before; got != 2 {
		t.Errorf("Acquire + Release while watched: %d round trips, want 2", got)
	}
	for ev := range ch {
		if ev.Key == "k" && ev.Kind == driver.LockReleased {
			break
		}
	}
	if n.events.Load() == 0 {
		t.Error("no command on the event collection while the namespace was watched")
	}
}
