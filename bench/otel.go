package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/otelwarden"
)

// The overhead of package otelwarden: the same work on SQLite with and
// without it, measured in one run. Instrumented runs use the real SDK as a
// service would: every span sampled and batched to an exporter (one that
// counts and drops them, so no network is measured), every metric
// recorded into a reader.
//
// Each operation is measured twice: outside any span (a background loop's
// call; the default Options make no store operation span there, only the
// metrics and a lock's wait span), and inside a caller's sampled span, as
// in a service's request handler, where every store operation is a child
// span. In the second case the caller's span, started and ended once per
// operation, is part of the plain and the instrumented runs alike, so
// that only warden's own spans and metrics differ.

const (
	groupLock        = "sqlite lock cycle, OpenTelemetry overhead, no caller's span"
	groupCache       = "sqlite cache get, OpenTelemetry overhead, no caller's span"
	groupLockInSpan  = "sqlite lock cycle in a caller's sampled span, OpenTelemetry overhead"
	groupCacheInSpan = "sqlite cache get in a caller's sampled span, OpenTelemetry overhead"
)

// otelCases are the OpenTelemetry overhead groups: a lock cycle and a
// cache hit, each without and inside a caller's span, run plain,
// instrumented, and both alternating.
func otelCases() []Case {
	lockOp := func(inSpan bool) func(*testing.B, bool) func() {
		return func(b *testing.B, instrumented bool) func() { return otelLockCycleOp(b, instrumented, inSpan) }
	}
	cacheOp := func(inSpan bool) func(*testing.B, bool) func() {
		return func(b *testing.B, instrumented bool) func() { return otelCacheGetOp(b, instrumented, inSpan) }
	}
	var cases []Case
	for _, g := range []struct {
		group, plain, instrumented string
		op                         func(*testing.B, bool) func()
	}{
		{groupLock, "lock.Locker TryAcquire + Release", "the same with otelwarden (hook + lock.Options.Observe)", lockOp(false)},
		{groupCache, "cache.Cache Get (hit)", "the same with otelwarden (hook + cache.Options.Observe)", cacheOp(false)},
		{groupLockInSpan, "lock.Locker TryAcquire + Release in a span of the caller's", "the same with otelwarden", lockOp(true)},
		{groupCacheInSpan, "cache.Cache Get (hit) in a span of the caller's", "the same with otelwarden", cacheOp(true)},
	} {
		op := g.op
		cases = append(cases,
			Case{Group: g.group, Name: g.plain, Baseline: true, Run: func(b *testing.B) { otelLoop(b, op(b, false)) }},
			Case{Group: g.group, Name: g.instrumented, Run: func(b *testing.B) { otelLoop(b, op(b, true)) }},
			Case{Group: g.group, Name: "both alternating, paired (µs: the instrumented half)", Metric: PairedMetric, Run: func(b *testing.B) { otelPaired(b, op) }},
		)
	}
	return cases
}

// otelLoop runs op b.N times.
func otelLoop(b *testing.B, op func()) {
	for b.Loop() {
		op()
	}
}

// PairedMetric is the time per operation (µs) of the instrumented half of
// a paired run; PairedRatio, reported beside it, is the instrumented
// half's total time over the plain half's. Each iteration of a paired run
// makes one plain and one instrumented operation (in alternating order,
// on stores of their own), so both halves meet the same load on the
// machine: on a shared machine the ratio is steadier than the ratio of
// two runs made one after the other.
const (
	PairedMetric = "instrumented-µs/op"
	PairedRatio  = "paired-ratio"
)

// otelPaired runs op plain and instrumented, alternating, and reports
// PairedMetric and PairedRatio.
func otelPaired(b *testing.B, setup func(b *testing.B, instrumented bool) func()) {
	plain, instrumented := setup(b, false), setup(b, true)
	var tp, ti time.Duration
	n := 0
	for b.Loop() {
		first, second, t1, t2 := plain, instrumented, &tp, &ti
		if n%2 == 1 {
			first, second, t1, t2 = instrumented, plain, &ti, &tp
		}
		start := time.Now()
		first()
		mid := time.Now()
		second()
		*t1 += mid.Sub(start)
		*t2 += time.Since(mid)
		n++
	}
	b.ReportMetric(float64(ti.Microseconds())/float64(n), PairedMetric)
	b.ReportMetric(float64(ti)/float64(tp), PairedRatio)
}

// countingExporter counts the spans exported, otelwarden's store
// operation spans apart, and drops them.
type countingExporter struct{ spans, storeSpans atomic.Int64 }

func (e *countingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		if s.InstrumentationScope().Name == otelwarden.ScopeName && s.SpanKind() == trace.SpanKindClient {
			e.storeSpans.Add(1)
		}
	}
	e.spans.Add(int64(len(spans)))
	return nil
}

func (e *countingExporter) Shutdown(context.Context) error { return nil }

// otelSetup returns what a case's operation runs with: a Telemetry (nil
// if not instrumented) and the caller's tracer (nil outside a caller's
// span), on one SDK pipeline set up as in a service — every span sampled
// and batched to a countingExporter, metrics into a reader. At the end of
// the benchmark it checks that the telemetry was what the case means:
// metrics when instrumented, and store operation spans exactly when
// instrumented inside a caller's span.
func otelSetup(b *testing.B, instrumented, inSpan bool) (*otelwarden.Telemetry, trace.Tracer) {
	b.Helper()
	if !instrumented && !inSpan {
		return nil, nil
	}
	exp := &countingExporter{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	b.Cleanup(func() {
		ctx := context.Background()
		_ = tp.Shutdown(ctx) // exports what is left
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); instrumented && (err != nil || len(rm.ScopeMetrics) == 0) {
			b.Errorf("no metrics recorded (%v)", err)
		}
		_ = mp.Shutdown(ctx)
		if inSpan && exp.spans.Load() == 0 {
			b.Error("no spans exported")
		}
		if n := exp.storeSpans.Load(); (n > 0) != (instrumented && inSpan) {
			b.Errorf("%d store operation spans exported (instrumented %v, in a caller's span %v)", n, instrumented, inSpan)
		}
	})
	var tel *otelwarden.Telemetry
	if instrumented {
		tel = otelwarden.New(&otelwarden.Options{TracerProvider: tp, MeterProvider: mp, Namespace: "bench"})
	}
	var tracer trace.Tracer
	if inSpan {
		tracer = tp.Tracer("bench/caller")
	}
	return tel, tracer
}

// inCallerSpan returns work run in a span of the caller's, one per call,
// if tracer is not nil, or work itself.
func inCallerSpan(tracer trace.Tracer, work func(ctx context.Context)) func() {
	if tracer == nil {
		return func() { work(context.Background()) }
	}
	return func() {
		ctx, span := tracer.Start(context.Background(), "request")
		work(ctx)
		span.End()
	}
}

// openWith opens a fresh SQLite store, instrumented by tel if not nil.
func openWith(b *testing.B, tel *otelwarden.Telemetry) *warden.Store {
	b.Helper()
	opts := &warden.Options{}
	if tel != nil {
		opts.Hook = tel
	}
	st, err := warden.OpenWith(context.Background(), sqliteURL(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// otelLockCycleOp returns one TryAcquire + Release on a fresh SQLite
// store, instrumented or not, in a caller's span or not.
func otelLockCycleOp(b *testing.B, instrumented, inSpan bool) func() {
	tel, tracer := otelSetup(b, instrumented, inSpan)
	opts := &lock.Options{TTL: time.Minute}
	if tel != nil {
		opts.Observe = tel.Lock
	}
	lk, err := lock.New(openWith(b, tel), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lk.Close() })
	return inCallerSpan(tracer, func(ctx context.Context) {
		lease, err := lk.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	})
}

// otelCacheGetOp returns one cache hit on a fresh SQLite store,
// instrumented or not, in a caller's span or not.
func otelCacheGetOp(b *testing.B, instrumented, inSpan bool) func() {
	tel, tracer := otelSetup(b, instrumented, inSpan)
	opts := &cache.Options{}
	if tel != nil {
		opts.Observe = tel.Cache
	}
	c, err := cache.New[string](openWith(b, tel), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	if err := c.Set(context.Background(), "bench", "value"); err != nil {
		b.Fatal(err)
	}
	return inCallerSpan(tracer, func(ctx context.Context) {
		if v, err := c.Get(ctx, "bench"); err != nil || v != "value" {
			b.Fatal(v, err)
		}
	})
}
