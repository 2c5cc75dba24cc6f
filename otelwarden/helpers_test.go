package otelwarden_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/otelwarden"
	"github.com/warden-go/warden/store/memory"
)

// The tests run the real OpenTelemetry SDK: a span recorder and a manual
// metric reader. Nothing is faked.

const namespace = "test-ns"

// env is one telemetry pipeline with stores reporting to it.
type env struct {
	t      *testing.T
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	tel    *otelwarden.Telemetry
	db     string
}

var dbSeq atomic.Int64

// newEnv returns a pipeline of its own and a Telemetry reporting to it,
// with keys on spans if includeKeys.
func newEnv(t *testing.T, includeKeys bool) *env {
	t.Helper()
	return newEnvWith(t, otelwarden.Options{IncludeKeys: includeKeys})
}

// newEnvWith is newEnv with options o, given the env's providers and
// namespace.
func newEnvWith(t *testing.T, o otelwarden.Options) *env {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	o.TracerProvider, o.MeterProvider, o.Namespace = tp, mp, namespace
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return &env{
		t: t, spans: rec, tp: tp, reader: reader,
		tel: otelwarden.New(&o),
		db:  fmt.Sprintf("%s-%d", t.Name(), dbSeq.Add(1)),
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// store opens one more connection ("process") to the env's memory
// database, reporting to the env's Telemetry and then to also, if set.
func (e *env) store(also func(warden.OpInfo)) *warden.Store {
	e.t.Helper()
	var hook warden.Hook = e.tel
	if also != nil {
		hook = warden.HookFunc(func(ctx context.Context, op warden.OpInfo) {
			e.tel.AfterOp(ctx, op)
			also(op)
		})
	}
	st := warden.New(memory.NewDriver(&memory.Options{Name: e.db}), &warden.Options{Hook: hook, Logger: quiet})
	e.t.Cleanup(func() { _ = st.Close() })
	return st
}

// parent starts a span of the test's own, the caller's span.
func (e *env) parent(ctx context.Context) (context.Context, trace.Span) {
	return e.tp.Tracer("test").Start(ctx, "request")
}

// ended returns the ended spans named name.
func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one ended span named name.
func (e *env) one(name string) sdktrace.ReadOnlySpan {
	e.t.Helper()
	got := e.ended(name)
	if len(got) != 1 {
		e.t.Fatalf("%d ended spans named %q, want 1", len(got), name)
	}
	return got[0]
}

// attr returns a span's attribute.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs checks a span's attributes: each of want present with its
// value.
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, w := range want {
		v, ok := attr(s, w.Key)
		if !ok || v != w.Value {
			t.Errorf("span %q: %s = %v (present: %v), want %v; attributes %v", s.Name(), w.Key, v.Emit(), ok, w.Value.Emit(), s.Attributes())
		}
	}
}

// collect reads every metric once.
func (e *env) collect() metricdata.ResourceMetrics {
	e.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		e.t.Fatal(err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// allSets returns the attribute sets of every point of every metric.
func allSets(rm metricdata.ResourceMetrics) []attribute.Set {
	var out []attribute.Set
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out = append(out, p.Attributes)
				}
			}
		}
	}
	return out
}

// matches reports whether set has every attribute of want and, as every
// metric of the Telemetry does, the namespace.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	if v, ok := set.Value(otelwarden.KeyNamespace); !ok || v.AsString() != namespace {
		return false
	}
	for _, w := range want {
		if v, ok := set.Value(w.Key); !ok || v != w.Value {
			return false
		}
	}
	return true
}

// points summarizes every metric point: its metric's name and its
// attributes, each mapped to the counter's or gauge's value or the
// histogram's count (not the durations, which vary from run to run).
func (e *env) points() map[string]int64 {
	e.t.Helper()
	out := map[string]int64{}
	enc := attribute.DefaultEncoder()
	for _, sm := range e.collect().ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+" "+p.Attributes.Encoded(enc)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+" "+p.Attributes.Encoded(enc)] += int64(p.Count)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+" "+p.Attributes.Encoded(enc)] += p.Value
				}
			default:
				e.t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// sum is the value of the counter name summed over the points with the
// attributes want.
func (e *env) sum(name string, want ...attribute.KeyValue) int64 {
	e.t.Helper()
	m, ok := find(e.collect(), name)
	if !ok {
		return 0
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		e.t.Fatalf("%s is a %T, not an int64 sum", name, m.Data)
	}
	var n int64
	for _, p := range s.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// count is the number of values the histogram name recorded with the
// attributes want, and their sum (seconds).
func (e *env) count(name string, want ...attribute.KeyValue) (uint64, float64) {
	e.t.Helper()
	m, ok := find(e.collect(), name)
	if !ok {
		return 0, 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		e.t.Fatalf("%s is a %T, not a float64 histogram", name, m.Data)
	}
	if m.Unit != "s" {
		e.t.Errorf("%s has unit %q, want s", name, m.Unit)
	}
	var n uint64
	var total float64
	for _, p := range h.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Count
			total += p.Sum
		}
	}
	return n, total
}

// gauge is the value of the int64 gauge name at the point with exactly
// the attributes want (plus the namespace); ok=false if there is none.
func (e *env) gauge(name string, want ...attribute.KeyValue) (int64, bool) {
	e.t.Helper()
	m, found := find(e.collect(), name)
	if !found {
		return 0, false
	}
	g, isGauge := m.Data.(metricdata.Gauge[int64])
	if !isGauge {
		e.t.Fatalf("%s is a %T, not an int64 gauge", name, m.Data)
	}
	for _, p := range g.DataPoints {
		if matches(p.Attributes, want) && p.Attributes.Len() == len(want)+1 {
			return p.Value, true
		}
	}
	return 0, false
}

// eventually polls cond every 2 ms. It sets no time limit: a condition
// that never holds is reported by go test's -timeout, with every
// goroutine's stack.
func eventually(cond func() bool) {
	for !cond() {
		time.Sleep(2 * time.Millisecond)
	}
}

// signal is a channel a hook sends to without blocking.
type signal chan struct{}

func (s signal) send() {
	select {
	case s <- struct{}{}:
	default:
	}
}
