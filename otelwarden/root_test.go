package otelwarden_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	ow "github.com/warden-go/warden/otelwarden"
	"github.com/warden-go/warden/scope"
)

// rootWork is the same work for every case of TestSpansNeedACallersSpan:
// a cache write, hit and miss, a lock cycle, a failed store operation and
// a scope task, all with ctx.
func rootWork(t *testing.T, e *env, ctx context.Context) {
	t.Helper()
	st := e.store(nil)
	c, err := cache.New[int](st, &cache.Options{Observe: e.tel.Cache})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Set(ctx, "n", 4); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "n"); v != 4 || err != nil {
		t.Fatalf("Get = %d, %v", v, err)
	}
	if _, err := c.Get(ctx, "absent"); !errors.Is(err, cache.ErrNotFound) {
		t.Fatalf("Get of an absent key: %v", err)
	}
	l, err := lock.New(st, &lock.Options{Observe: e.tel.Lock, DisableAutoRefresh: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Cache().Get(ctx, ""); !errors.Is(err, warden.ErrInvalidKey) {
		t.Fatalf("Get of an empty key: %v", err)
	}
	err = scope.Run(ctx, func(s *scope.Scope) error {
		s.Go(func(context.Context) error { return nil }, scope.Name("report"))
		return nil
	}, scope.WithStore(st), scope.WithHook(e.tel))
	if err != nil {
		t.Fatal(err)
	}
}

// storeOps is the number of store operations the metrics counted.
func (e *env) storeOps() int {
	n, _ := e.count("warden.store.operation.duration")
	return int(n)
}

// Store operations (and scope tasks, which come through the same hook)
// make spans only inside a caller's span, of which they are children, as
// in otelsql: without one, no span — unless Options.AllowRoot, which
// makes them roots. A propagated parent counts as a caller's span. Lock
// waits make a span either way. The metrics are the same in every case.
func TestSpansNeedACallersSpan(t *testing.T) {
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	var metrics []map[string]int64
	for _, tc := range []struct {
		name      string
		allowRoot bool
		parent    string // "", "local", "remote"
	}{
		{name: "no caller's span", parent: ""},
		{name: "in a caller's span", parent: "local"},
		{name: "in a propagated span", parent: "remote"},
		{name: "AllowRoot, no caller's span", allowRoot: true, parent: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, ow.Options{AllowRoot: tc.allowRoot})
			ctx := context.Background()
			var parent trace.SpanContext // invalid: no parent
			switch tc.parent {
			case "local":
				var span trace.Span
				ctx, span = e.parent(ctx)
				defer span.End()
				parent = span.SpanContext()
			case "remote":
				ctx = trace.ContextWithRemoteSpanContext(ctx, remote)
				parent = remote
			}
			rootWork(t, e, ctx)

			var client, tasks, waits []sdktrace.ReadOnlySpan
			for _, s := range e.spans.Ended() {
				switch {
				case s.Name() == ow.SpanLockWait:
					waits = append(waits, s)
				case s.Name() == scope.OpTask:
					tasks = append(tasks, s)
				case s.SpanKind() == trace.SpanKindClient:
					client = append(client, s)
				default:
					t.Errorf("unexpected span %q", s.Name())
				}
			}
			ops := e.storeOps()
			if ops < 6 {
				t.Fatalf("%d store operations counted, want at least 6", ops)
			}
			spans := append(slices.Clone(client), tasks...)
			switch {
			case parent.IsValid():
				if len(client) != ops || len(tasks) != 1 {
					t.Errorf("%d store operation spans for %d operations, %d task spans; want one each", len(client), ops, len(tasks))
				}
			case tc.allowRoot:
				if len(client) != ops || len(tasks) != 1 {
					t.Errorf("AllowRoot: %d store operation spans for %d operations, %d task spans; want one each", len(client), ops, len(tasks))
				}
			default:
				if len(spans) != 0 {
					t.Errorf("no caller's span: %d store operation and task spans, want none", len(spans))
				}
			}
			// A lock wait is a span whatever the context.
			if len(waits) != 1 {
				t.Fatalf("%d lock wait spans, want 1", len(waits))
			}
			spans = append(spans, waits...)
			for _, s := range spans {
				if parent.IsValid() {
					if s.Parent().SpanID() != parent.SpanID() || s.SpanContext().TraceID() != parent.TraceID() {
						t.Errorf("span %q is not a child of the caller's span", s.Name())
					}
					if s.Parent().IsRemote() != parent.IsRemote() {
						t.Errorf("span %q: parent remote %v, want %v", s.Name(), s.Parent().IsRemote(), parent.IsRemote())
					}
				} else if s.Parent().IsValid() {
					t.Errorf("span %q has a parent %v without a caller's span", s.Name(), s.Parent().SpanID())
				}
			}
			if tc.allowRoot {
				traces := map[trace.TraceID]bool{}
				for _, s := range spans {
					traces[s.SpanContext().TraceID()] = true
				}
				if len(traces) != len(spans) {
					t.Errorf("AllowRoot: %d root spans in %d traces, want one trace each", len(spans), len(traces))
				}
			}
			wait := waits[0]
			wantAttrs(t, wait, ow.KeyLockOutcome.String("acquired"), ow.KeyLockContended.Bool(false))

			// The metrics do not depend on spans.
			if n := e.sum("warden.store.errors", ow.KeyOperation.String("cache.get")); n != 1 {
				t.Errorf("store errors = %d, want 1", n)
			}
			if n := e.sum("warden.cache.lookups", ow.KeyCacheResult.String("hit")); n != 1 {
				t.Errorf("hits = %d, want 1", n)
			}
			if n := e.sum("warden.lock.acquisitions", ow.KeyLockOutcome.String("acquired")); n != 1 {
				t.Errorf("acquisitions = %d, want 1", n)
			}
			metrics = append(metrics, e.points())
		})
	}
	if len(metrics) != 4 {
		t.Fatalf("%d cases ran, want 4", len(metrics))
	}
	for i, m := range metrics[1:] {
		if !maps.Equal(m, metrics[0]) {
			t.Errorf("case %d's metric points differ from the first case's:\n%v\n%v", i+1, m, metrics[0])
		}
	}
}

// An idempotency duplicate's wait, like a lock wait, is a span without a
// caller's span too; the duplicate's store operations are not.
func TestIdempotencyWaitWithoutCallersSpan(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	claims := make(signal, 1)
	st := e.store(func(op warden.OpInfo) {
		if op.Op == "idempotency.claim" {
			claims.send()
		}
	})
	if _, _, err := st.Idempotency().Claim(ctx, "refund", "worker-b", time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	<-claims
	done := make(chan error, 1)
	go func() {
		opts := &idempotency.Options{Observe: e.tel.Idempotency, PollMin: 2 * time.Millisecond, PollMax: 20 * time.Millisecond}
		v, err := idempotency.Do(ctx, st, "refund", opts, func(context.Context) (int, error) { return 1, nil })
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
	wait := e.one(ow.SpanIdempotencyWait)
	if wait.Parent().IsValid() {
		t.Errorf("the wait span has a parent %v", wait.Parent().SpanID())
	}
	wantAttrs(t, wait, ow.KeyIdemHolder.String("worker-b"))
	if n := len(e.spans.Ended()); n != 1 {
		t.Errorf("%d spans ended, want only the wait", n)
	}
	if e.storeOps() < 3 {
		t.Errorf("%d store operations counted, want at least 3 (two claims, a completion)", e.storeOps())
	}
}
