package otelwarden_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/otelwarden"
)

// The cost of one report on top of the work reported, with the real SDK:
// go test -run '^$' -bench . (bench/ measures the overhead on SQLite).

// BenchmarkAfterOp: one store operation's report outside any span — the
// metrics only, as the default makes no root span.
func BenchmarkAfterOp(b *testing.B) {
	tel, _ := benchTelemetry(false)
	benchAfterOp(b, tel, context.Background())
}

// BenchmarkAfterOpAllowRoot: the same with Options.AllowRoot — a root
// span and the metrics.
func BenchmarkAfterOpAllowRoot(b *testing.B) {
	tel, _ := benchTelemetry(true)
	benchAfterOp(b, tel, context.Background())
}

// BenchmarkAfterOpInSpan: one store operation's report inside a caller's
// sampled span — a child span and the metrics.
func BenchmarkAfterOpInSpan(b *testing.B) {
	tel, tp := benchTelemetry(false)
	ctx, parent := tp.Tracer("caller").Start(context.Background(), "request")
	defer parent.End()
	benchAfterOp(b, tel, ctx)
}

// BenchmarkAfterOpInUnsampledSpan: the same inside a caller's span that
// its sampler left out (a ParentBased ratio sampler's usual case): the
// child span is not recorded, the metrics are.
func BenchmarkAfterOpInUnsampledSpan(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel := otelwarden.New(&otelwarden.Options{TracerProvider: tp, MeterProvider: mp, Namespace: "x"})
	ctx, parent := tp.Tracer("caller").Start(context.Background(), "request")
	defer parent.End()
	if !parent.SpanContext().IsValid() || parent.SpanContext().IsSampled() {
		b.Fatal("the caller's span is not a valid unsampled one")
	}
	benchAfterOp(b, tel, ctx)
}

// benchTelemetry returns a Telemetry on the SDK as a service sets it up:
// every span sampled and batched, metrics into a reader.
func benchTelemetry(allowRoot bool) (*otelwarden.Telemetry, *sdktrace.TracerProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	return otelwarden.New(&otelwarden.Options{TracerProvider: tp, MeterProvider: mp, Namespace: "x", AllowRoot: allowRoot}), tp
}

func benchAfterOp(b *testing.B, tel *otelwarden.Telemetry, ctx context.Context) {
	op := warden.OpInfo{Store: "sqlite", Op: "cache.get", Key: "bench", Start: time.Now(), Duration: time.Microsecond}
	b.ReportAllocs()
	for b.Loop() {
		tel.AfterOp(ctx, op)
	}
}

// BenchmarkCacheObs: one cache lookup's metric.
func BenchmarkCacheObs(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tel := otelwarden.New(&otelwarden.Options{MeterProvider: mp, Namespace: "x"})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		tel.Cache(ctx, cache.Observation{Kind: cache.ObservedLookup, Key: "bench", Result: cache.LookupHit})
	}
}

// BenchmarkSpanOnly: a bare root span of the same SDK, for comparison.
func BenchmarkSpanOnly(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	tr := tp.Tracer("x")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, s := tr.Start(ctx, "cache.get")
		s.End()
	}
}

// BenchmarkChildSpanOnly: a bare child span of a sampled parent.
func BenchmarkChildSpanOnly(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	tr := tp.Tracer("x")
	ctx, parent := tr.Start(context.Background(), "request")
	defer parent.End()
	b.ReportAllocs()
	for b.Loop() {
		_, s := tr.Start(ctx, "cache.get")
		s.End()
	}
}

// BenchmarkChildSpanAttrs: a child span with the three attributes and
// the kind of a store operation's span, its options made once, as
// AfterOp's are.
func BenchmarkChildSpanAttrs(b *testing.B) {
	benchChildSpan(b, false)
}

// BenchmarkChildSpanAttrsTimes: the same with explicit start and end
// times, as AfterOp sets them: its span without the metrics.
func BenchmarkChildSpanAttrsTimes(b *testing.B) {
	benchChildSpan(b, true)
}

func benchChildSpan(b *testing.B, times bool) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	tr := tp.Tracer("x")
	ctx, parent := tr.Start(context.Background(), "request")
	defer parent.End()
	kind := trace.WithSpanKind(trace.SpanKindClient)
	attrs := trace.WithAttributes(semconv.DBSystemSqlite, otelwarden.KeyOperation.String("cache.get"), otelwarden.KeyNamespace.String("x"))
	start := time.Now()
	end := start.Add(time.Microsecond)
	b.ReportAllocs()
	for b.Loop() {
		if times {
			_, s := tr.Start(ctx, "cache.get", kind, attrs, trace.WithTimestamp(start))
			s.End(trace.WithTimestamp(end))
		} else {
			_, s := tr.Start(ctx, "cache.get", kind, attrs)
			s.End()
		}
	}
}
