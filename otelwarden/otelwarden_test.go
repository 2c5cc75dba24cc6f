package otelwarden_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	ow "github.com/warden-go/warden/otelwarden"
	"github.com/warden-go/warden/scope"
	"github.com/warden-go/warden/store/memory"
)

var memorySystem = semconv.DBSystemKey.String("memory")

// childOf checks that s is a child of parent.
func childOf(t *testing.T, s sdktrace.ReadOnlySpan, parent trace.Span) {
	t.Helper()
	if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q is not a child of the caller's span", s.Name())
	}
}

// An uncontended lock cycle: a client span per store operation and a
// wait span, children of the caller's span; one acquisition, one wait
// and one hold in the metrics. Keys appear nowhere by default.
func TestUncontendedLockCycle(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	l, err := lock.New(st, &lock.Options{Observe: e.tel.Lock, DisableAutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, parent := e.parent(context.Background())
	s, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	parent.End()

	acq := e.one("lock.acquire")
	childOf(t, acq, parent)
	if acq.SpanKind() != trace.SpanKindClient || acq.Status().Code != codes.Unset {
		t.Errorf("lock.acquire span: kind %v, status %v", acq.SpanKind(), acq.Status())
	}
	wantAttrs(t, acq, memorySystem, ow.KeyOperation.String("lock.acquire"), ow.KeyNamespace.String(namespace))
	rel := e.one("lock.release")
	childOf(t, rel, parent)
	wantAttrs(t, rel, memorySystem, ow.KeyOperation.String("lock.release"))
	wait := e.one(ow.SpanLockWait)
	childOf(t, wait, parent)
	wantAttrs(t, wait, ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(false),
		ow.KeyLockToken.Int64(s.Token()), ow.KeyLockOwner.String(l.Owner()), ow.KeyNamespace.String(namespace))
	if _, ok := attr(wait, ow.KeyLockHolder); ok {
		t.Errorf("an uncontended wait names a holder: %v", wait.Attributes())
	}
	if waited, _ := attr(wait, ow.KeyLockWait); waited.AsFloat64() != wait.EndTime().Sub(wait.StartTime()).Seconds() {
		t.Errorf("wait attribute %v, span lasted %v", waited.AsFloat64(), wait.EndTime().Sub(wait.StartTime()))
	}
	if !acq.StartTime().Before(wait.EndTime()) && !acq.StartTime().Equal(wait.EndTime()) || acq.StartTime().Before(wait.StartTime()) {
		t.Errorf("the store's acquire (%v) is not within the wait (%v–%v)", acq.StartTime(), wait.StartTime(), wait.EndTime())
	}
	for _, sp := range e.spans.Ended() {
		if _, ok := attr(sp, ow.KeyKey); ok {
			t.Errorf("span %q has a key without IncludeKeys", sp.Name())
		}
	}
	if n := len(e.spans.Ended()); n != 4 {
		t.Errorf("%d spans ended, want 4 (the caller's, the wait, acquire, release)", n)
	}

	if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(false)); n != 1 {
		t.Errorf("acquisitions = %d, want 1", n)
	}
	if n := e.sum("warden.lock.acquisitions"); n != 1 {
		t.Errorf("acquisitions of any kind = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.wait.duration", ow.KeyLockOutcome.String("acquired")); n != 1 {
		t.Errorf("waits = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.hold.duration", ow.KeyLockOutcome.String("released")); n != 1 {
		t.Errorf("holds = %d, want 1", n)
	}
	for _, op := range []string{"lock.acquire", "lock.release"} {
		if n, _ := e.count("warden.store.operation.duration", memorySystem, ow.KeyOperation.String(op)); n != 1 {
			t.Errorf("%s round trips = %d, want 1", op, n)
		}
	}
	if n := e.sum("warden.store.errors"); n != 0 {
		t.Errorf("store errors = %d, want 0", n)
	}
	if n, _ := e.count("warden.lock.handoff.duration"); n != 0 {
		t.Errorf("hand-offs = %d, want 0", n)
	}
	if n := e.sum("warden.lock.leases.lost"); n != 0 {
		t.Errorf("leases lost = %d, want 0", n)
	}
}

// With IncludeKeys, spans carry the key; metrics never do.
func TestIncludeKeys(t *testing.T) {
	e := newEnv(t, true)
	st := e.store(nil)
	l, err := lock.New(st, &lock.Options{Observe: e.tel.Lock})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, parent := e.parent(context.Background())
	if err := lock.Do(ctx, l, "job", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	parent.End()
	for _, name := range []string{"lock.acquire", ow.SpanLockWait, "lock.release"} {
		wantAttrs(t, e.one(name), ow.KeyKey.String("job"))
	}
	for _, set := range allSets(e.collect()) {
		if _, ok := set.Value(ow.KeyKey); ok {
			t.Errorf("a metric point carries the key: %v", set.ToSlice())
		}
	}
	if len(allSets(e.collect())) == 0 {
		t.Fatal("no metric points")
	}
}

// A contended wait: the waiter's span names the holder it found and
// counts as a contended acquisition; the store's refusals are spans of
// their own.
func TestContendedWait(t *testing.T) {
	e := newEnv(t, false)
	l1, err := lock.New(e.store(nil), &lock.Options{Observe: e.tel.Lock, Owner: "first"})
	if err != nil {
		t.Fatal(err)
	}
	defer l1.Close()
	tried := make(signal, 1)
	l2, err := lock.New(e.store(func(op warden.OpInfo) {
		if op.Op == "lock.acquire" {
			tried.send()
		}
	}), &lock.Options{Observe: e.tel.Lock, Owner: "second"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	ctx := context.Background()
	first, err := l1.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *lock.Lease, 1)
	wctx, parent := e.parent(ctx)
	go func() {
		s, err := l2.Acquire(wctx, "job")
		if err != nil {
			t.Error(err)
		}
		got <- s
	}()
	<-tried // the waiter found the key held
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	parent.End()
	defer second.Release(ctx)

	var wait sdktrace.ReadOnlySpan
	for _, s := range e.ended(ow.SpanLockWait) {
		if v, _ := attr(s, ow.KeyLockOwner); v.AsString() == l2.Owner() {
			wait = s
		}
	}
	if wait == nil {
		t.Fatal("no wait span of the waiter")
	}
	childOf(t, wait, parent)
	wantAttrs(t, wait, ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(true),
		ow.KeyLockHolder.String(l1.Owner()), ow.KeyLockToken.Int64(second.Token()))
	if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(true)); n != 1 {
		t.Errorf("contended acquisitions = %d, want 1", n)
	}
	if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(false)); n != 1 {
		t.Errorf("uncontended acquisitions = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.wait.duration", ow.KeyLockOutcome.String("acquired")); n != 2 {
		t.Errorf("waits = %d, want 2", n)
	}
	// Every store acquire the waiter made is a span of its own, a child
	// of its caller's span, and counted.
	var waiterAcquires int
	for _, s := range e.ended("lock.acquire") {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			waiterAcquires++
		}
	}
	if n, _ := e.count("warden.store.operation.duration", ow.KeyOperation.String("lock.acquire")); waiterAcquires < 2 || n != uint64(waiterAcquires+1) {
		t.Errorf("the waiter made %d store acquires (spans), %d counted in all; want at least 2, and one more counted", waiterAcquires, n)
	}

	// TryAcquire of a held key is a busy acquisition naming the holder.
	if _, err := l1.TryAcquire(ctx, "job"); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("busy"), ow.KeyLockContended.Bool(true)); n != 1 {
		t.Errorf("busy acquisitions = %d, want 1", n)
	}
}

// A lease lost by a force-release: counted by cause, its hold time
// recorded as lost, the refused refresh counted, and an event on the span
// that was current when the lease was taken.
func TestLeaseLostByForceRelease(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	l, err := lock.New(st, &lock.Options{Observe: e.tel.Lock, DisableAutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, parent := e.parent(context.Background())
	s, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Locks().ForceRelease(context.Background(), "job"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if err := s.Refresh(ctx); !errors.Is(err, lock.ErrLeaseLost) {
		t.Fatalf("Refresh after a force-release: %v", err)
	}
	parent.End()

	if n := e.sum("warden.lock.leases.lost", ow.KeyLockCause.String("refused")); n != 1 {
		t.Errorf("leases lost (refused) = %d, want 1", n)
	}
	if n := e.sum("warden.lock.leases.lost"); n != 1 {
		t.Errorf("leases lost = %d, want 1", n)
	}
	if n := e.sum("warden.lock.refreshes", ow.KeyLockOutcome.String("lost")); n != 1 {
		t.Errorf("refreshes found lost = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.refresh.duration", ow.KeyLockOutcome.String("lost")); n != 1 {
		t.Errorf("refresh round trips = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.hold.duration", ow.KeyLockOutcome.String("lost")); n != 1 {
		t.Errorf("holds ended by a loss = %d, want 1", n)
	}
	if n, _ := e.count("warden.lock.hold.duration", ow.KeyLockOutcome.String("released")); n != 0 {
		t.Errorf("holds ended by a release = %d, want 0", n)
	}
	if n, _ := e.count("warden.store.operation.duration", ow.KeyOperation.String("lock.force-release")); n != 1 {
		t.Errorf("force-releases = %d, want 1", n)
	}
	caller := e.one("request")
	var lost []sdktrace.Event
	for _, ev := range caller.Events() {
		if ev.Name == ow.EventLeaseLost {
			lost = append(lost, ev)
		}
	}
	if len(lost) != 1 {
		t.Fatalf("caller's span events %v, want one %s", caller.Events(), ow.EventLeaseLost)
	}
	set := attribute.NewSet(lost[0].Attributes...)
	if v, _ := set.Value(ow.KeyLockCause); v.AsString() != "refused" {
		t.Errorf("loss event cause %q", v.AsString())
	}
	if v, _ := set.Value(ow.KeyLockToken); v.AsInt64() != s.Token() {
		t.Errorf("loss event token %d, want %d", v.AsInt64(), s.Token())
	}
}

// A breaker opening and closing: calls by outcome (rejections included),
// three transitions, and the state gauge following the circuit; a
// rejection is an event on the caller's span.
func TestBreakerOpensAndCloses(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	ctx := context.Background()
	errBoom := errors.New("boom")
	b, err := breaker.New(st, "api", &breaker.Options{Threshold: 1, OpenFor: 20 * time.Millisecond, Observe: e.tel.Breaker})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	api := ow.KeyCircuit.String("api")
	state := func(s breaker.State) int64 {
		v, ok := e.gauge("warden.breaker.state", api, ow.KeyBreakerState.String(string(s)))
		if !ok {
			t.Fatalf("no warden.breaker.state point for %s", s)
		}
		return v
	}
	if err := b.Do(ctx, func(context.Context) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Fatal(err)
	}
	eventually(func() bool { return state(breaker.Open) == 1 })
	if state(breaker.Closed) != 0 || state(breaker.HalfOpen) != 0 {
		t.Fatalf("open circuit: gauge closed %d, half-open %d", state(breaker.Closed), state(breaker.HalfOpen))
	}
	eventually(func() bool { return b.Do(ctx, func(context.Context) error { return nil }) == nil })
	eventually(func() bool { return state(breaker.Closed) == 1 })
	if state(breaker.Open) != 0 || state(breaker.HalfOpen) != 0 {
		t.Fatalf("closed circuit: gauge open %d, half-open %d", state(breaker.Open), state(breaker.HalfOpen))
	}
	if n := e.sum("warden.breaker.calls", api, ow.KeyBreakerOutcome.String("failure")); n != 1 {
		t.Errorf("failures = %d, want 1", n)
	}
	if n := e.sum("warden.breaker.calls", api, ow.KeyBreakerOutcome.String("success")); n != 1 {
		t.Errorf("successes = %d, want 1", n)
	}
	if n, want := e.sum("warden.breaker.calls", api, ow.KeyBreakerOutcome.String("rejected")), b.Stats().Rejections; n != want {
		t.Errorf("rejections = %d, the breaker counted %d", n, want)
	}
	for _, tr := range [][2]breaker.State{{breaker.Closed, breaker.Open}, {breaker.Open, breaker.HalfOpen}, {breaker.HalfOpen, breaker.Closed}} {
		if n := e.sum("warden.breaker.transitions", api, ow.KeyBreakerFrom.String(string(tr[0])), ow.KeyBreakerTo.String(string(tr[1]))); n != 1 {
			t.Errorf("transitions %s → %s = %d, want 1", tr[0], tr[1], n)
		}
	}
	if n := e.sum("warden.breaker.transitions", api); n != 3 {
		t.Errorf("transitions = %d, want 3", n)
	}

	// A rejection on a circuit that stays open is an event on the
	// caller's span.
	db, err := breaker.New(st, "db", &breaker.Options{Threshold: 1, OpenFor: time.Hour, Observe: e.tel.Breaker})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_ = db.Do(ctx, func(context.Context) error { return errBoom })
	rctx, parent := e.parent(ctx)
	if err := db.Do(rctx, func(context.Context) error { return nil }); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("a call on an open circuit: %v", err)
	}
	parent.End()
	evs := e.one("request").Events()
	if len(evs) != 1 || evs[0].Name != ow.EventRejected {
		t.Fatalf("caller's span events %v, want one %s", evs, ow.EventRejected)
	}
	set := attribute.NewSet(evs[0].Attributes...)
	if v, _ := set.Value(ow.KeyCircuit); v.AsString() != "db" {
		t.Errorf("rejection event circuit %q", v.AsString())
	}
	if v, _ := set.Value(ow.KeyBreakerState); v.AsString() != "open" {
		t.Errorf("rejection event state %q", v.AsString())
	}
	if n := e.sum("warden.breaker.calls", ow.KeyCircuit.String("db"), ow.KeyBreakerOutcome.String("rejected")); n != 1 {
		t.Errorf("db rejections = %d, want 1", n)
	}
}

// Cache hit, miss and load; a wait for another process's load.
func TestCacheHitMissLoad(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	c, err := cache.New[int](e.store(nil), &cache.Options{Observe: e.tel.Cache})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Get(ctx, "n"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatal(err)
	}
	if v, err := c.GetOrLoad(ctx, "n", func(context.Context) (int, error) { return 4, nil }); v != 4 || err != nil {
		t.Fatalf("GetOrLoad = %d, %v", v, err)
	}
	if v, err := c.Get(ctx, "n"); v != 4 || err != nil {
		t.Fatalf("Get = %d, %v", v, err)
	}
	if _, err := c.GetOrLoad(ctx, "gone", func(context.Context) (int, error) { return 0, cache.ErrNotFound }); !errors.Is(err, cache.ErrNotFound) {
		t.Fatal(err)
	}
	if n := e.sum("warden.cache.lookups", ow.KeyCacheResult.String("miss")); n != 3 {
		t.Errorf("misses = %d, want 3", n)
	}
	if n := e.sum("warden.cache.lookups", ow.KeyCacheResult.String("hit")); n != 1 {
		t.Errorf("hits = %d, want 1", n)
	}
	if n, _ := e.count("warden.cache.load.duration", ow.KeyCacheOutcome.String("success")); n != 1 {
		t.Errorf("successful loads = %d, want 1", n)
	}
	if n, _ := e.count("warden.cache.load.duration", ow.KeyCacheOutcome.String("absent")); n != 1 {
		t.Errorf("absent loads = %d, want 1", n)
	}
	if n, _ := e.count("warden.store.operation.duration", ow.KeyOperation.String("cache.set")); n != 1 {
		t.Errorf("cache writes = %d, want 1", n)
	}
	// Each load takes the load lease: two lock acquires, two releases.
	if n, _ := e.count("warden.store.operation.duration", ow.KeyOperation.String("lock.acquire")); n != 2 {
		t.Errorf("load leases = %d, want 2", n)
	}

	// Another process waits for this one's load instead of loading.
	tried := make(signal, 1)
	other, err := cache.New[int](e.store(func(op warden.OpInfo) {
		if op.Op == "lock.acquire" {
			tried.send()
		}
	}), &cache.Options{Observe: e.tel.Cache, PollMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	started, release := make(chan struct{}), make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		_, err := c.GetOrLoad(ctx, "hot", func(context.Context) (int, error) {
			close(started)
			<-release
			return 7, nil
		})
		loaded <- err
	}()
	<-started
	waited := make(chan error, 1)
	go func() {
		v, err := other.GetOrLoad(ctx, "hot", func(context.Context) (int, error) { return -1, nil })
		if err == nil && v != 7 {
			err = errors.New("the waiter loaded for itself")
		}
		waited <- err
	}()
	<-tried // the other process found the load lease taken
	close(release)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if n, _ := e.count("warden.cache.load.wait.duration", ow.KeyCacheRemote.Bool(true)); n != 1 {
		t.Errorf("remote load waits = %d, want 1", n)
	}
	if n, _ := e.count("warden.cache.load.duration"); n != 3 {
		t.Errorf("loads = %d, want 3 (the waiter loaded nothing)", n)
	}
}

// An idempotent duplicate: the first call claims, a later one gets the
// completed result, and one that arrives while another caller runs waits
// for it — a span naming the claimant.
func TestIdempotentDuplicate(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	claims := make(signal, 1)
	st := e.store(func(op warden.OpInfo) {
		if op.Op == "idempotency.claim" {
			claims.send()
		}
	})
	opts := &idempotency.Options{Observe: e.tel.Idempotency, PollMin: 2 * time.Millisecond, PollMax: 20 * time.Millisecond}
	one := func(context.Context) (int, error) { return 1, nil }
	for range 2 {
		if v, err := idempotency.Do(ctx, st, "charge", opts, one); v != 1 || err != nil {
			t.Fatalf("Do = %d, %v", v, err)
		}
		<-claims
	}
	if n := e.sum("warden.idempotency.outcomes", ow.KeyIdemOutcome.String("claimed")); n != 1 {
		t.Errorf("claimed = %d, want 1", n)
	}
	if n := e.sum("warden.idempotency.outcomes", ow.KeyIdemOutcome.String("completed")); n != 1 {
		t.Errorf("completed = %d, want 1", n)
	}

	// A duplicate arriving while another worker runs waits for its result.
	if _, _, err := st.Idempotency().Claim(ctx, "refund", "worker-b", time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	<-claims
	wctx, parent := e.parent(ctx)
	done := make(chan error, 1)
	go func() {
		v, err := idempotency.Do(wctx, st, "refund", opts, one)
		if err == nil && v != 9 {
			err = errors.New("the duplicate did not get the worker's result")
		}
		done <- err
	}()
	<-claims // the duplicate found the key in progress
	if ok, err := st.Idempotency().Complete(ctx, "refund", "worker-b", []byte("9"), 0); !ok || err != nil {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	parent.End()
	wait := e.one(ow.SpanIdempotencyWait)
	childOf(t, wait, parent)
	wantAttrs(t, wait, ow.KeyIdemHolder.String("worker-b"), ow.KeyNamespace.String(namespace))
	if wait.Status().Code != codes.Unset {
		t.Errorf("wait span status %v", wait.Status())
	}
	if n, _ := e.count("warden.idempotency.wait.duration"); n != 1 {
		t.Errorf("duplicate waits = %d, want 1", n)
	}
	if n := e.sum("warden.idempotency.outcomes", ow.KeyIdemOutcome.String("completed")); n != 2 {
		t.Errorf("completed = %d, want 2", n)
	}
	if n := e.sum("warden.idempotency.outcomes"); n != 3 {
		t.Errorf("outcomes = %d, want 3", n)
	}
}

// Checkpoint runs (fresh and resumed) and saves by outcome.
func TestCheckpointRunsAndSaves(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	ctx := context.Background()
	opts := &checkpoint.Options{Observe: e.tel.Checkpoint}
	errStop := errors.New("stop")
	err := checkpoint.Run(ctx, st, "import", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		if err := cp.Save(ctx, 1, 50); err != nil {
			return err
		}
		return errStop
	})
	if !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	err = checkpoint.Run(ctx, st, "import", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		return cp.Save(ctx, 2, 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.sum("warden.checkpoint.runs", ow.KeyCheckpointResumed.Bool(false)); n != 1 {
		t.Errorf("fresh runs = %d, want 1", n)
	}
	if n := e.sum("warden.checkpoint.runs", ow.KeyCheckpointResumed.Bool(true)); n != 1 {
		t.Errorf("resumed runs = %d, want 1", n)
	}
	if n := e.sum("warden.checkpoint.saves", ow.KeyCheckpointOutcome.String("saved")); n != 2 {
		t.Errorf("saves = %d, want 2", n)
	}
}

// A failed store operation: an error span and an error counted by
// error.type.
func TestStoreError(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	ctx, parent := e.parent(context.Background())
	if _, _, err := st.Cache().Get(ctx, ""); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("Get of an empty key: %v", err)
	}
	parent.End()
	s := e.one("cache.get")
	childOf(t, s, parent)
	if s.Status().Code != codes.Error || len(s.Events()) != 1 || s.Events()[0].Name != "exception" {
		t.Errorf("failed operation's span: status %v, events %v", s.Status(), s.Events())
	}
	wantAttrs(t, s, semconv.ErrorTypeKey.String("invalid_argument"), ow.KeyOperation.String("cache.get"))
	if n := e.sum("warden.store.errors", memorySystem, ow.KeyOperation.String("cache.get"), semconv.ErrorTypeKey.String("invalid_argument")); n != 1 {
		t.Errorf("store errors = %d, want 1", n)
	}
}

// scope's reports through the same hook: a task is an internal span, a
// child of the caller's (its start is no span), and no store operation;
// the task's lock reports as any Locker's.
func TestScopeTasks(t *testing.T) {
	e := newEnv(t, false)
	st := e.store(nil)
	ctx, parent := e.parent(context.Background())
	err := scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(ctx context.Context) error { return nil }, scope.Name("report"), scope.Lock("nightly"))
		return nil
	}, scope.WithStore(st), scope.WithHook(e.tel), scope.WithLockOptions(&lock.Options{Observe: e.tel.Lock}))
	if err != nil {
		t.Fatal(err)
	}
	parent.End()
	task := e.one(scope.OpTask)
	childOf(t, task, parent)
	wantAttrs(t, task, ow.KeyOperation.String(scope.OpTask))
	if task.SpanKind() != trace.SpanKindInternal || task.Status().Code != codes.Unset {
		t.Errorf("task span: kind %v, status %v", task.SpanKind(), task.Status())
	}
	if got := e.ended(scope.OpTaskStart); len(got) != 0 {
		t.Errorf("task starts made %d spans", len(got))
	}
	if n, _ := e.count("warden.store.operation.duration", ow.KeyOperation.String(scope.OpTask)); n != 0 {
		t.Errorf("a task counted as a store operation")
	}
	if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("acquired")); n != 1 {
		t.Errorf("the task's lock: %d acquisitions, want 1", n)
	}
}

// downCache is a memory store's cache whose reads and writes fail as a
// store that cannot be reached does.
type downCache struct{ driver.Cache }

var errDown = errors.New("connection refused (test outage)")

func (downCache) Get(context.Context, string) (driver.CacheEntry, bool, error) {
	return driver.CacheEntry{}, false, errDown
}

func (downCache) Set(context.Context, string, []byte, time.Duration) error { return errDown }

type downStore struct{ driver.Store }

func (d downStore) Cache() driver.Cache { return downCache{d.Store.Cache()} }

// A GetOrLoad whose store fails loads without it: one fallback counted in
// warden.cache.fallbacks, the load counted as any other, and the store's
// failures in warden.cache.store.errors and warden.store.errors.
func TestCacheFallback(t *testing.T) {
	e := newEnv(t, false)
	st := warden.New(downStore{memory.NewDriver(&memory.Options{Name: e.db})}, &warden.Options{Hook: e.tel, Logger: quiet})
	t.Cleanup(func() { _ = st.Close() })
	c, err := cache.New[int](st, &cache.Options{Observe: e.tel.Cache})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, err := c.GetOrLoad(context.Background(), "n", func(context.Context) (int, error) { return 4, nil }); v != 4 || err != nil {
		t.Fatalf("GetOrLoad with the store down = %d, %v; want the loaded value", v, err)
	}
	if s := c.Stats(); s.StoreFallbacks != 1 {
		t.Fatalf("stats %+v: want 1 fallback", s)
	}
	if n := e.sum("warden.cache.fallbacks"); n != 1 {
		t.Errorf("fallbacks = %d, want 1", n)
	}
	if n, _ := e.count("warden.cache.load.duration", ow.KeyCacheOutcome.String("success")); n != 1 {
		t.Errorf("successful loads = %d, want 1", n)
	}
	if n := e.sum("warden.cache.store.errors"); n < 1 {
		t.Errorf("cache store errors = %d, want at least the failed read", n)
	}
	if n := e.sum("warden.store.errors", memorySystem, ow.KeyOperation.String("cache.get")); n != 1 {
		t.Errorf("store errors of cache.get = %d, want 1", n)
	}
}
