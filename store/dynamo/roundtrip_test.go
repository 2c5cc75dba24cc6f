package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awsmw "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/dynamo"
)

// countingStore opens a store with New on a client that counts requests.
func countingStore(t *testing.T, table, prefix string) (*warden.Store, *atomic.Int64) {
	t.Helper()
	n := new(atomic.Int64)
	st, err := dynamo.New(newClient(t, countAttempts(n)), table, &dynamo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, n
}

// TestRoundTrips counts the requests each operation sends to the server.
// The uncontended lock cycle, a recorded failure and a cache read are one
// request each; the other counts are logged.
func TestRoundTrips(t *testing.T) {
	ctx := t.Context()
	st, n := countingStore(t, testTable(t), "rt:")
	count := func(what string, want int64, f func() error) {
		t.Helper()
		n.Store(0)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := n.Load()
		if want > 0 && got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
		t.Logf("%-42s %d round trip(s)", what, got)
	}
	must := func(ok bool, err error, what string) error {
		if err == nil && !ok {
			err = errors.New(what + " reported false")
		}
		return err
	}
	var rec driver.LockRecord
	count("lock acquire (new key)", 1, func() (err error) {
		var ok bool
		rec, ok, err = st.Locks().Acquire(ctx, "k", "alice", time.Minute)
		return must(ok, err, "acquire")
	})
	count("lock refresh", 1, func() error {
		_, ok, err := st.Locks().Refresh(ctx, "k", "alice", rec.Token, time.Minute)
		return must(ok, err, "refresh")
	})
	count("lock release", 1, func() error {
		ok, err := st.Locks().Release(ctx, "k", "alice", rec.Token)
		return must(ok, err, "release")
	})
	count("lock acquire (released key)", 1, func() (err error) {
		var ok bool
		rec, ok, err = st.Locks().Acquire(ctx, "k", "bob", time.Minute)
		return must(ok, err, "acquire")
	})
	count("lock acquire (held by another)", 0, func() error {
		_, ok, err := st.Locks().Acquire(ctx, "k", "carol", time.Minute)
		return must(!ok, err, "contended acquire")
	})
	count("lock acquire (held by another, again)", 0, func() error {
		_, ok, err := st.Locks().Acquire(ctx, "k", "carol", time.Minute)
		return must(!ok, err, "contended acquire")
	})
	count("lock acquire (re-entrant)", 0, func() error {
		_, ok, err := st.Locks().Acquire(ctx, "k", "bob", time.Minute)
		return must(ok, err, "re-entrant acquire")
	})
	count("lock get", 1, func() error {
		_, ok, err := st.Locks().Get(ctx, "k")
		return must(ok, err, "get")
	})
	count("circuit record failure (new)", 1, func() error {
		_, err := st.Circuits().RecordFailure(ctx, "c", 3)
		return err
	})
	count("circuit record failure", 1, func() error {
		_, err := st.Circuits().RecordFailure(ctx, "c", 3)
		return err
	})
	count("circuit record failure (opens)", 0, func() error {
		r, err := st.Circuits().RecordFailure(ctx, "c", 3)
		if err == nil && r.State != driver.Open {
			err = errors.New("not open")
		}
		return err
	})
	count("circuit record failure (open)", 0, func() error {
		_, err := st.Circuits().RecordFailure(ctx, "c", 3)
		return err
	})
	count("circuit try probe", 0, func() error {
		_, _, err := st.Circuits().TryProbe(ctx, "c", "p", 0, time.Minute)
		return err
	})
	count("circuit record success (half-open)", 0, func() error {
		_, err := st.Circuits().RecordSuccess(ctx, "c")
		return err
	})
	// The gobreaker-style operations (issue 13): each case is one
	// conditional UpdateItem with exclusive conditions, so the case that
	// applies first is one request; an operation that matches no case (an
	// outcome of an older generation, a Trip at a stale version) tries
	// them and reads the item (logged).
	var gen, version, epoch int64
	if _, err := st.Circuits().RecordFailure(ctx, "g", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Circuits().TryProbes(ctx, "g", "p1", 0, time.Minute, 2); err != nil {
		t.Fatal(err)
	}
	count("circuit try probes (a second of 2 slots)", 1, func() error {
		r, ok, err := st.Circuits().TryProbes(ctx, "g", "p2", 0, time.Minute, 2)
		gen, epoch = r.Generation(), r.ProbeEpoch
		return must(ok, err, "try probes")
	})
	count("circuit outcome (a probe slot no longer granted: ignored)", 0, func() error {
		r, err := st.Circuits().RecordOutcome(ctx, "g", driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen, ProbeEpoch: epoch + 1, Threshold: 1})
		return must(err == nil && r.State == driver.HalfOpen, err, "an outcome of a probe slot no longer granted")
	})
	count("circuit outcome (older generation: ignored)", 0, func() error {
		_, err := st.Circuits().RecordOutcome(ctx, "g", driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen - 1, Threshold: 1})
		return err
	})
	count("circuit outcome (generation matches, closing)", 1, func() error {
		r, err := st.Circuits().RecordOutcome(ctx, "g", driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch, CloseAfter: 1})
		return must(err == nil && r.State == driver.Closed, err, "closing outcome")
	})
	count("circuit outcome (counted, threshold 0)", 1, func() error {
		r, err := st.Circuits().RecordOutcome(ctx, "g", driver.Outcome{Kind: driver.OutcomeFailure, Successes: 2, Interval: time.Hour})
		version = r.Version
		return err
	})
	count("circuit trip (at the version counted)", 1, func() error {
		_, ok, err := st.Circuits().Trip(ctx, "g", version)
		return must(ok, err, "trip")
	})
	count("circuit trip (stale version)", 0, func() error {
		_, ok, err := st.Circuits().Trip(ctx, "g", version)
		return must(!ok, err, "stale trip")
	})
	count("cache set", 1, func() error { return st.Cache().Set(ctx, "ck", []byte("v"), time.Minute) })
	count("cache get", 1, func() error {
		_, ok, err := st.Cache().Get(ctx, "ck")
		return must(ok, err, "cache get")
	})
	count("cache set-if-absent (stored)", 0, func() error {
		ok, err := st.Cache().SetIfAbsent(ctx, "ck2", []byte("v"), time.Minute)
		return must(ok, err, "set-if-absent")
	})
	count("idempotency claim", 0, func() error {
		_, out, err := st.Idempotency().Claim(ctx, "i", "alice", time.Minute, "")
		return must(out == driver.Claimed, err, "claim")
	})
	count("idempotency complete", 0, func() error {
		ok, err := st.Idempotency().Complete(ctx, "i", "alice", []byte("r"), time.Minute)
		return must(ok, err, "complete")
	})
	count("checkpoint save", 0, func() error {
		_, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 5})
		return must(ok, err, "save")
	})
	count("checkpoint latest", 0, func() error {
		_, ok, err := st.Checkpoints().Latest(ctx, "t")
		return must(ok, err, "latest")
	})
}

// dropReply returns a stack change that, while *armed names an operation
// ("UpdateItem", "PutItem"), lets the next request of that operation reach
// the server and then reports a connection reset instead of its reply —
// the ambiguous outcome of a write whose reply is lost. The SDK's retryer
// resends the request.
func dropReply(armed *atomic.Value) func(*middleware.Stack) error {
	return func(st *middleware.Stack) error {
		return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("warden-drop-reply",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleFinalize(ctx, in)
				op := awsmw.GetOperationName(ctx)
				if err == nil && armed.CompareAndSwap(op, "") {
					return out, md, errors.New("read tcp 127.0.0.1: connection reset by peer (reply dropped by the test)")
				}
				return out, md, err
			}), middleware.After)
	}
}

// TestLostReplies checks that conditional writes whose reply was lost
// after they applied (the SDK then resends them and their condition
// fails) are recognised by their request id and reported as done, and
// that counters are not incremented twice.
func TestLostReplies(t *testing.T) {
	ctx := t.Context()
	var armed atomic.Value
	armed.Store("")
	st, err := dynamo.New(newClient(t, dropReply(&armed)), testTable(t), &dynamo.Options{Prefix: "lost:"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	arm := func(op string) {
		armed.Store(op)
	}
	fired := func(what string) {
		t.Helper()
		if armed.Load() != "" {
			t.Errorf("%s: no reply was dropped", what)
		}
	}

	arm("UpdateItem")
	rec, ok, err := st.Locks().Acquire(ctx, "k", "alice", time.Minute)
	fired("acquire")
	if err != nil || !ok || rec.Owner != "alice" {
		t.Fatalf("Acquire with a lost reply: %+v ok=%v err=%v", rec, ok, err)
	}
	arm("UpdateItem")
	ok, err = st.Locks().Release(ctx, "k", "alice", rec.Token)
	fired("release")
	if err != nil || !ok {
		t.Fatalf("Release with a lost reply: ok=%v err=%v", ok, err)
	}
	if _, held, _ := st.Locks().Get(ctx, "k"); held {
		t.Error("the lock is still held after the release")
	}
	if ok, err := st.Locks().Release(ctx, "k", "alice", rec.Token); err != nil || ok {
		t.Errorf("second Release: ok=%v err=%v, want false", ok, err)
	}

	arm("UpdateItem")
	c, err := st.Circuits().RecordFailure(ctx, "c", 10)
	fired("record failure")
	if err != nil || c.Failures != 1 {
		t.Errorf("RecordFailure with a lost reply: failures=%d err=%v, want 1", c.Failures, err)
	}
	if c, _, _ := st.Circuits().Get(ctx, "c"); c.Failures != 1 {
		t.Errorf("stored failures %d, want 1", c.Failures)
	}

	arm("PutItem")
	stored, err := st.Cache().SetIfAbsent(ctx, "ck", []byte("v"), time.Minute)
	fired("set-if-absent")
	if err != nil || !stored {
		t.Errorf("SetIfAbsent with a lost reply: stored=%v err=%v", stored, err)
	}

	if _, out, err := st.Idempotency().Claim(ctx, "i", "alice", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("Claim: %v %v", out, err)
	}
	arm("UpdateItem")
	ok, err = st.Idempotency().Complete(ctx, "i", "alice", []byte("r"), time.Minute)
	fired("complete")
	if err != nil || !ok {
		t.Errorf("Complete with a lost reply: ok=%v err=%v", ok, err)
	}

	arm("UpdateItem")
	cp, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 3})
	fired("checkpoint save")
	if err != nil || !ok || cp.Sequence != 1 {
		t.Errorf("Save with a lost reply: %+v ok=%v err=%v, want sequence 1", cp, ok, err)
	}
	cp, ok, err = st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: "t", Token: 3})
	if err != nil || !ok || cp.Sequence != 2 {
		t.Errorf("next Save: %+v ok=%v err=%v, want sequence 2", cp, ok, err)
	}
}

// attemptsByOp counts the requests a client sends (every attempt), by
// operation name.
type attemptsByOp struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *attemptsByOp) middleware(st *middleware.Stack) error {
	return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("warden-count-ops",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.mu.Lock()
			c.n[awsmw.GetOperationName(ctx)]++
			c.mu.Unlock()
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// take returns the counts since the last take and starts again.
func (c *attemptsByOp) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// pages is the most Query pages a listing of n index entries reads with
// limit entries a page: the last may be empty.
func pages(n, limit int) int { return n/limit + 1 }

// ceilDiv is ⌈a/b⌉.
func ceilDiv(a, b int) int { return (a + b - 1) / b }

// TestListingRoundTrips proves that listings do not Scan: Keys, List,
// Tasks, Clear and Purge Query the list index of their namespace (every
// page), read what they need with BatchGetItem (100 keys a request) and
// delete with BatchWriteItem (Clear, 25 a request) or conditional
// DeleteItem (Purge, one per record it removes). The number of requests
// is bounded by the namespace's pages, and does not change when another
// namespace of the table grows.
func TestListingRoundTrips(t *testing.T) {
	ctx := t.Context()
	ops := &attemptsByOp{n: map[string]int{}}
	table := testTable(t)
	st, err := dynamo.New(newClient(t, ops.middleware), table, &dynamo.Options{Prefix: "ls:", DisableEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !dynamo.ListsByIndex(st) {
		t.Fatal("a store on a table it created does not list by the list index")
	}
	const limit, n = 4, 30
	dynamo.SetPageLimit(st, limit)
	for i := range n {
		k := fmt.Sprintf("k%02d", i)
		if err := st.Cache().Set(ctx, k, []byte("v"), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		rec, ok, err := st.Locks().Acquire(ctx, k, "o", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if ok, err := st.Locks().Release(ctx, k, "o", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if _, err := st.Circuits().RecordFailure(ctx, k, 5); err != nil {
			t.Fatal(err)
		}
		if err := st.Idempotency().Set(ctx, k, []byte("r"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.Checkpoints().Save(ctx, driver.CheckpointInput{TaskID: k, Token: 1}); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// Another namespace of the same table, larger: it must not change
	// what the listings of ls: cost.
	other, err := dynamo.New(newClient(t), table, &dynamo.Options{Prefix: "big:", DisableEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	type want struct{ query, get int }
	check := func(what string, got map[string]int, w want, extra map[string]int) {
		t.Helper()
		if got["Scan"] != 0 {
			t.Errorf("%s: %d Scan requests, want none", what, got["Scan"])
		}
		if got["Query"] < 1 || got["Query"] > w.query {
			t.Errorf("%s: %d Query requests, want 1 to %d", what, got["Query"], w.query)
		}
		if got["BatchGetItem"] > w.get {
			t.Errorf("%s: %d BatchGetItem requests, want at most %d", what, got["BatchGetItem"], w.get)
		}
		for op, max := range extra {
			if got[op] > max {
				t.Errorf("%s: %d %s requests, want at most %d", what, got[op], op, max)
			}
		}
		for op, c := range got {
			if op != "Query" && op != "BatchGetItem" && extra[op] == 0 && c > 0 {
				t.Errorf("%s: %d unexpected %s requests", what, c, op)
			}
		}
		t.Logf("%-28s %v", what, got)
	}
	listing := want{query: pages(n, limit), get: ceilDiv(n, 100)}
	run := func(round string) map[string]map[string]int {
		counts := map[string]map[string]int{}
		measure := func(what string, f func() (int, error), wantLen int, w want) {
			t.Helper()
			ops.take()
			got, err := f()
			if err != nil || got != wantLen {
				t.Fatalf("%s %s: %d, %v; want %d", round, what, got, err, wantLen)
			}
			c := ops.take()
			counts[what] = c
			check(round+" "+what, c, w, nil)
		}
		measure("Locks.List", func() (int, error) {
			l, err := st.Locks().List(ctx, "*")
			return len(l), err
		}, 0, listing) // released: read, not listed
		measure("Circuits.List", func() (int, error) {
			l, err := st.Circuits().List(ctx, "k*")
			return len(l), err
		}, n, listing)
		measure("Idempotency.List", func() (int, error) {
			l, err := st.Idempotency().List(ctx, "*")
			return len(l), err
		}, n, listing)
		measure("Cache.Keys (expired)", func() (int, error) {
			l, err := st.Cache().Keys(ctx, "*")
			return len(l), err
		}, 0, listing)
		measure("Checkpoints.Tasks", func() (int, error) {
			l, err := st.Checkpoints().Tasks(ctx, "k*")
			return len(l), err
		}, n, want{query: pages(2*n, limit), get: ceilDiv(n, 100)}) // checkpoints and fences
		// A pattern's literal prefix narrows the Query: k1* reads the
		// 10 entries k10…k19 (3 pages of 4) and loads only those.
		measure("Circuits.List k1*", func() (int, error) {
			l, err := st.Circuits().List(ctx, "k1*")
			return len(l), err
		}, 10, want{query: pages(10, limit), get: 1})
		return counts
	}
	before := run("small table")
	for i := range 2 * n {
		if err := other.Cache().Set(ctx, fmt.Sprintf("k%03d", i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Circuits().RecordFailure(ctx, fmt.Sprintf("k%03d", i), 5); err != nil {
			t.Fatal(err)
		}
	}
	after := run("larger table")
	if !reflect.DeepEqual(before, after) {
		t.Errorf("listings cost more requests after another namespace grew:\nbefore %v\nafter  %v", before, after)
	}

	// Purge: one Query per kind (every page), one BatchGetItem per 100
	// items it reads (locks, cache entries, idempotency records, fences;
	// not the checkpoints: 30 locks, 30 cache entries, 30 idempotency
	// records and 30 fences), one conditional DeleteItem per record removed:
	// the 30 expired cache entries and the 30 released lock items.
	ops.take()
	removed, err := st.Purge(ctx, time.Millisecond) // released seconds ago
	if err != nil || removed != 2*n {
		t.Fatalf("Purge: %d, %v; want %d", removed, err, 2*n)
	}
	c := ops.take()
	check("Purge", c, want{query: 3*pages(n, limit) + pages(2*n, limit), get: ceilDiv(4*n, 100)}, map[string]int{"DeleteItem": 2 * n})
	if c["DeleteItem"] != 2*n {
		t.Errorf("Purge: %d DeleteItem requests, want %d", c["DeleteItem"], 2*n)
	}

	// Clear: the Query, the reads that tell the live entries, and one
	// BatchWriteItem per 25 deletes.
	for i := range n {
		if err := st.Cache().Set(ctx, fmt.Sprintf("c%02d", i), []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	ops.take()
	cleared, err := st.Cache().Clear(ctx)
	if err != nil || cleared != n {
		t.Fatalf("Clear: %d, %v; want %d", cleared, err, n)
	}
	c = ops.take()
	check("Cache.Clear", c, listing, map[string]int{"BatchWriteItem": ceilDiv(n, 25)})
	if keys, err := other.Cache().Keys(ctx, "*"); err != nil || len(keys) != 2*n {
		t.Errorf("the other namespace's keys after Clear: %d, %v; want %d", len(keys), err, 2*n)
	}
}
