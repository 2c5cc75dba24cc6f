package otelwarden

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden"
)

// ScopeName is the instrumentation scope of the tracer and meter: this
// package's import path.
const ScopeName = "github.com/warden-go/warden/otelwarden"

// Attribute keys of warden's own (the others are OpenTelemetry semantic
// conventions: db.system, error.type).
const (
	KeyOperation = attribute.Key("warden.operation") // the store operation: "lock.acquire", "cache.get", …
	KeyNamespace = attribute.Key("warden.namespace") // Options.Namespace
	KeyKey       = attribute.Key("warden.key")       // a key, name or task id; only with Options.IncludeKeys

	KeyLockOutcome   = attribute.Key("warden.lock.outcome")   // see the metrics table in the README
	KeyLockContended = attribute.Key("warden.lock.contended") // the acquire found the key held or queued
	KeyLockCause     = attribute.Key("warden.lock.cause")     // why a lease was lost: refused, expired
	KeyLockHolder    = attribute.Key("warden.lock.holder")    // the holder an acquire found in its way
	KeyLockOwner     = attribute.Key("warden.lock.owner")     // the acquiring Locker's owner
	KeyLockToken     = attribute.Key("warden.lock.token")     // the lease's fencing token
	KeyLockWait      = attribute.Key("warden.lock.wait")      // seconds an acquire waited

	KeyCircuit        = attribute.Key("warden.breaker.circuit") // the circuit's name
	KeyBreakerOutcome = attribute.Key("warden.breaker.outcome") // success, failure, ignored, rejected
	KeyBreakerState   = attribute.Key("warden.breaker.state")   // closed, open, half-open
	KeyBreakerFrom    = attribute.Key("warden.breaker.from")    // a transition's old state
	KeyBreakerTo      = attribute.Key("warden.breaker.to")      // a transition's new state

	KeyCacheResult  = attribute.Key("warden.cache.result")  // hit, stale, negative, miss
	KeyCacheOutcome = attribute.Key("warden.cache.outcome") // a load's: success, absent, error
	KeyCacheRemote  = attribute.Key("warden.cache.remote")  // a load wait for another process

	KeyIdemOutcome = attribute.Key("warden.idempotency.outcome") // claimed, taken_over, completed, in_progress
	KeyIdemHolder  = attribute.Key("warden.idempotency.holder")  // the claimant a duplicate waited for
	KeyIdemWait    = attribute.Key("warden.idempotency.wait")    // seconds a duplicate waited

	KeyCheckpointResumed = attribute.Key("warden.checkpoint.resumed") // a run resumed from a checkpoint
	KeyCheckpointOutcome = attribute.Key("warden.checkpoint.outcome") // a save's: saved, stale, error
)

// Options configure a Telemetry. The zero value (or nil) reports to the
// global providers, without keys and without a namespace, and makes store
// operation spans only inside a caller's span (see AllowRoot).
type Options struct {
	// TracerProvider makes the spans. Nil: otel.GetTracerProvider(), the
	// global one, looked up once in New.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Nil: otel.GetMeterProvider(),
	// looked up once in New.
	MeterProvider metric.MeterProvider
	// IncludeKeys adds the key, circuit name or task id concerned to spans
	// as warden.key. Off by default: keys may carry personal data (user
	// ids, e-mail addresses). Metrics never carry keys, whatever this
	// says: every key would be a time series of its own.
	IncludeKeys bool
	// Namespace is reported as warden.namespace on every span and metric:
	// name the store's namespace (its ?prefix=) or the service, to tell
	// several stores apart. "": not reported.
	Namespace string
	// AllowRoot lets the store hook's reports make spans when their
	// context carries no span. Off by default, as in otelsql and the other
	// database instrumentations: a store operation (AfterOp) makes a span
	// only when the context carries a valid span context — the caller's
	// request or job span, or a parent propagated from another process —
	// and its span is then a child of that one. An operation outside any
	// trace (a cache read in a background loop, a lease refresh of a
	// lease taken outside a trace) makes no span, so no trace of one
	// span and no SDK work; its metrics are recorded all the same. The
	// same holds for scope's task spans, which come through the same
	// hook. With AllowRoot, such calls make root spans, each a trace of
	// its own.
	//
	// The wait spans (warden.lock.wait of Lock, warden.idempotency.wait of
	// Idempotency) do not depend on AllowRoot: they are made with or
	// without a caller's span. A wait is what the user sees (the time a
	// caller was held up, and who held it up), there is one per Acquire
	// or waiting duplicate rather than one per round trip, and in a
	// worker that runs outside any trace a root wait span is the only
	// record of which holder it waited for. The span events (lost leases,
	// breaker rejections) go on the caller's span only, as always.
	AllowRoot bool
}

// Telemetry turns warden's reports into OpenTelemetry spans and metrics.
// Make one per process (or per store) with New and pass it, or its
// methods, to the options of what it should observe:
//
//	tel := otelwarden.New(nil)
//	st, err := warden.OpenWith(ctx, url, &warden.Options{Hook: tel})
//	locker, err := lock.New(st, &lock.Options{Observe: tel.Lock})
//
// It is safe for concurrent use.
type Telemetry struct {
	tracer      trace.Tracer
	includeKeys bool
	allowRoot   bool
	ns          []attribute.KeyValue // the namespace attribute, if any

	// sets caches measurement options by what their attributes are made
	// of (see set), ops the spans' options of store operations (see op).
	setsMu sync.RWMutex
	sets   map[setKey]*measure
	opsMu  sync.RWMutex
	ops    map[[2]string]*opEntry

	storeDuration metric.Float64Histogram
	storeErrors   metric.Int64Counter

	lockAcquisitions metric.Int64Counter
	lockWait         metric.Float64Histogram
	lockHold         metric.Float64Histogram
	lockLost         metric.Int64Counter
	lockRefreshes    metric.Int64Counter
	lockRefreshTime  metric.Float64Histogram
	lockHandOff      metric.Float64Histogram

	breakerCalls       metric.Int64Counter
	breakerTransitions metric.Int64Counter
	breakerState       metric.Int64ObservableGauge
	circuitsMu         sync.Mutex
	circuits           map[string]string // circuit → state, for the gauge

	cacheLookups     metric.Int64Counter
	cacheLoads       metric.Float64Histogram
	cacheLoadWaits   metric.Float64Histogram
	cacheStoreErrors metric.Int64Counter
	cacheFallbacks   metric.Int64Counter

	idemOutcomes metric.Int64Counter
	idemWait     metric.Float64Histogram

	checkpointRuns  metric.Int64Counter
	checkpointSaves metric.Int64Counter
}

// Bucket boundaries (seconds) of the duration histograms: from 100 µs —
// an embedded store's round trip — to a minute-long lock wait.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New returns a Telemetry reporting to opts' providers (nil opts:
// defaults). Instruments that cannot be made are reported to
// otel.Handle and left out; New never fails.
func New(opts *Options) *Telemetry {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	t := &Telemetry{
		tracer:      o.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		includeKeys: o.IncludeKeys,
		allowRoot:   o.AllowRoot,
		circuits:    map[string]string{},
		sets:        map[setKey]*measure{},
		ops:         map[[2]string]*opEntry{},
	}
	if o.Namespace != "" {
		t.ns = []attribute.KeyValue{KeyNamespace.String(o.Namespace)}
	}
	m := o.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	i := instruments{m: m}
	t.storeDuration = i.histogram("warden.store.operation.duration", "Duration of store operations (round trips), by backend and operation.")
	t.storeErrors = i.counter("warden.store.errors", "{error}", "Store operations that failed, by backend, operation and error.type.")

	t.lockAcquisitions = i.counter("warden.lock.acquisitions", "{acquisition}", "Acquire and TryAcquire calls, by outcome (acquired, busy, canceled, error) and whether they met contention.")
	t.lockWait = i.histogram("warden.lock.wait.duration", "Time from an Acquire or TryAcquire call to its outcome, by outcome.")
	t.lockHold = i.histogram("warden.lock.hold.duration", "Time a lease was held, from acquisition to its release or loss (outcome released or lost).")
	t.lockLost = i.counter("warden.lock.leases.lost", "{lease}", "Leases lost, by cause (refused: force-released or taken over; expired: no refresh in time).")
	t.lockRefreshes = i.counter("warden.lock.refreshes", "{refresh}", "Lease refreshes, by outcome (renewed, lost, error).")
	t.lockRefreshTime = i.histogram("warden.lock.refresh.duration", "Round-trip time of lease refreshes, by outcome.")
	t.lockHandOff = i.histogram("warden.lock.handoff.duration", "Time from a lease's release to the next lease of a waiting Acquire of the same Locker.")

	t.breakerCalls = i.counter("warden.breaker.calls", "{call}", "Breaker calls, by circuit and outcome (success, failure, ignored, rejected).")
	t.breakerTransitions = i.counter("warden.breaker.transitions", "{transition}", "Changes of a breaker's view of its circuit, by circuit, from and to.")
	t.breakerState = i.gauge("warden.breaker.state", "{state}", "1 for the state each circuit is in (warden.breaker.state), 0 for the others.", t.observeCircuits)

	t.cacheLookups = i.counter("warden.cache.lookups", "{lookup}", "Cache lookups by Get and GetOrLoad, by result (hit, stale, negative, miss).")
	t.cacheLoads = i.histogram("warden.cache.load.duration", "Loader calls and their duration, by outcome (success, absent, error).")
	t.cacheLoadWaits = i.histogram("warden.cache.load.wait.duration", "GetOrLoad calls that waited for a load they did not start (stampede protection), and how long; remote: the load was another process's.")
	t.cacheStoreErrors = i.counter("warden.cache.store.errors", "{error}", "Store and codec errors met by caches, by error.type.")
	t.cacheFallbacks = i.counter("warden.cache.fallbacks", "{load}", "GetOrLoad calls that loaded without the store because it failed.")

	t.idemOutcomes = i.counter("warden.idempotency.outcomes", "{call}", "idempotency.Do calls, by the store's answer to their claim (claimed, taken_over, completed, in_progress).")
	t.idemWait = i.histogram("warden.idempotency.wait.duration", "Time duplicates waited for another caller's claim to complete or come free.")

	t.checkpointRuns = i.counter("warden.checkpoint.runs", "{run}", "checkpoint.Run starts, by whether they resumed from a saved checkpoint.")
	t.checkpointSaves = i.counter("warden.checkpoint.saves", "{save}", "Checkpoint saves, by outcome (saved, stale, error).")
	return t
}

// instruments makes instruments, reporting errors to otel.Handle.
type instruments struct{ m metric.Meter }

func (i instruments) counter(name, unit, desc string) metric.Int64Counter {
	c, err := i.m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil {
		otel.Handle(err)
	}
	return c
}

func (i instruments) histogram(name, desc string) metric.Float64Histogram {
	h, err := i.m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		otel.Handle(err)
	}
	return h
}

func (i instruments) gauge(name, unit, desc string, cb metric.Int64Callback) metric.Int64ObservableGauge {
	g, err := i.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithInt64Callback(cb))
	if err != nil {
		otel.Handle(err)
	}
	return g
}

// setKey names a combination of attribute values: the instrument's tag
// and up to three values (a struct, so that looking it up allocates
// nothing).
type setKey struct{ tag, a, b, c string }

// measure holds the measurement options of one attribute set as the
// slices an instrument's variadic options take (Add(ctx, 1, m.add...)):
// passing a slice made once allocates nothing, where passing the option
// itself would allocate a one-element slice on every report.
type measure struct {
	add []metric.AddOption
	rec []metric.RecordOption
	obs []metric.ObserveOption
}

// set returns the measurement options for the attributes attrs (plus the
// namespace), cached under k: building an attribute set allocates, and
// the combinations are few.
func (t *Telemetry) set(k setKey, attrs ...attribute.KeyValue) *measure {
	t.setsMu.RLock()
	m := t.sets[k]
	t.setsMu.RUnlock()
	if m != nil {
		return m
	}
	all := make([]attribute.KeyValue, 0, len(attrs)+len(t.ns))
	all = append(append(all, attrs...), t.ns...)
	o := metric.WithAttributeSet(attribute.NewSet(all...))
	m = &measure{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}, obs: []metric.ObserveOption{o}}
	t.setsMu.Lock()
	t.sets[k] = m
	t.setsMu.Unlock()
	return m
}

// seconds converts d for a histogram in seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// keyAttr returns the key attribute if keys are reported and key is not
// empty.
func (t *Telemetry) keyAttr(attrs []attribute.KeyValue, key string) []attribute.KeyValue {
	if t.includeKeys && key != "" {
		attrs = append(attrs, KeyKey.String(key))
	}
	return attrs
}

// ---------------------------------------------------------------------------
// store operations

// dbSystem maps warden's backend names to the semantic conventions'
// db.system values.
var dbSystem = map[string]attribute.KeyValue{
	"postgres": semconv.DBSystemPostgreSQL,
	"mysql":    semconv.DBSystemMySQL,
	"sqlite":   semconv.DBSystemSqlite,
	"mongodb":  semconv.DBSystemMongoDB,
	"redis":    semconv.DBSystemRedis,
	"dynamodb": semconv.DBSystemDynamoDB,
}

// system returns the db.system attribute of a backend: the convention's
// value, or the backend's own name ("memory").
func system(backend string) attribute.KeyValue {
	if kv, ok := dbSystem[backend]; ok {
		return kv
	}
	return semconv.DBSystemKey.String(backend)
}

// AfterOp reports one store operation (warden.Hook): its duration and
// error in the store metrics, always, and a client span named after the
// operation, with the operation's own start and end times, when ctx
// carries a span (the caller's, of which it is then a child) or
// Options.AllowRoot is set. The span is made after the operation
// returned, so spans of a database client's own instrumentation
// (otelpgx, redisotel) are its siblings, not its children. The reports
// of package scope (Op "scope.…") become internal spans, under the same
// rule, and no metrics.
func (t *Telemetry) AfterOp(ctx context.Context, op warden.OpInfo) {
	if strings.HasPrefix(op.Op, "scope.") {
		t.scopeOp(ctx, op)
		return
	}
	e := t.op(op.Store, op.Op)
	var et string
	if op.Err != nil {
		et = errorType(op.Err)
	}
	if t.traced(ctx) {
		t.opSpan(ctx, op, e, et)
	}
	t.storeDuration.Record(ctx, seconds(op.Duration), e.m.rec...)
	if op.Err != nil {
		t.storeErrors.Add(ctx, 1, t.set(setKey{"store.errors", op.Store, op.Op, et}, e.sys, KeyOperation.String(op.Op), semconv.ErrorTypeKey.String(et)).add...)
	}
}

// traced reports whether a store hook report with context ctx makes a
// span: if ctx carries a valid span context (a local or a propagated
// parent, sampled or not: the sampler decides), or roots are allowed.
func (t *Telemetry) traced(ctx context.Context) bool {
	return t.allowRoot || trace.SpanContextFromContext(ctx).IsValid()
}

// opSpan makes the span of store operation op (entry e; et: its
// error.type, if it failed).
func (t *Telemetry) opSpan(ctx context.Context, op warden.OpInfo, e *opEntry, et string) {
	var extra []attribute.KeyValue
	if t.includeKeys && op.Key != "" {
		extra = append(extra, KeyKey.String(op.Key))
	}
	if op.Err != nil {
		extra = append(extra, semconv.ErrorTypeKey.String(et))
	}
	var span trace.Span
	if extra == nil {
		_, span = t.tracer.Start(ctx, op.Op, e.kind, e.attrs, trace.WithTimestamp(op.Start))
	} else {
		_, span = t.tracer.Start(ctx, op.Op, e.kind, e.attrs, trace.WithAttributes(extra...), trace.WithTimestamp(op.Start))
	}
	end := op.Start.Add(op.Duration)
	if op.Err != nil {
		span.RecordError(op.Err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, op.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// opEntry holds what every report of one store operation on one backend
// shares, made once.
type opEntry struct {
	sys         attribute.KeyValue
	kind, attrs trace.SpanStartOption
	m           *measure // the store metrics' attributes
}

// op returns the entry of operation name on backend.
func (t *Telemetry) op(backend, name string) *opEntry {
	k := [2]string{backend, name}
	t.opsMu.RLock()
	e := t.ops[k]
	t.opsMu.RUnlock()
	if e != nil {
		return e
	}
	sys := system(backend)
	attrs := append([]attribute.KeyValue{sys, KeyOperation.String(name)}, t.ns...)
	e = &opEntry{
		sys:   sys,
		kind:  trace.WithSpanKind(trace.SpanKindClient),
		attrs: trace.WithAttributes(attrs...),
		m:     t.set(setKey{"store.op", backend, name, ""}, sys, KeyOperation.String(name)),
	}
	t.opsMu.Lock()
	t.ops[k] = e
	t.opsMu.Unlock()
	return e
}

// scopeOp reports a scope task's report as an internal span, when ctx
// carries a span or roots are allowed (task starts, which have no
// duration, are left out; a lost holding is an event on the task's
// span).
func (t *Telemetry) scopeOp(ctx context.Context, op warden.OpInfo) {
	if op.Duration == 0 && op.Err == nil {
		return // OpTaskStart
	}
	if op.Duration == 0 { // OpLeaseLost: an instant
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			attrs := append([]attribute.KeyValue{KeyOperation.String(op.Op)}, t.ns...)
			attrs = append(t.keyAttr(attrs, op.Key), semconv.ErrorTypeKey.String(errorType(op.Err)))
			span.AddEvent(op.Op, trace.WithTimestamp(op.Start), trace.WithAttributes(attrs...))
		}
		return
	}
	if !t.traced(ctx) {
		return
	}
	attrs := append([]attribute.KeyValue{KeyOperation.String(op.Op)}, t.ns...)
	attrs = t.keyAttr(attrs, op.Key)
	_, span := t.tracer.Start(ctx, op.Op, trace.WithTimestamp(op.Start), trace.WithAttributes(attrs...))
	if op.Err != nil {
		span.RecordError(op.Err, trace.WithTimestamp(op.Start.Add(op.Duration)))
		span.SetStatus(codes.Error, op.Err.Error())
	}
	span.End(trace.WithTimestamp(op.Start.Add(op.Duration)))
}

// errorType classifies an error for error.type: warden's sentinel
// errors and the context's by name, anything else (a database's error)
// as "_OTHER".
func errorType(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, warden.ErrStoreTimeout):
		return "store_timeout"
	case errors.Is(err, warden.ErrClosed):
		return "closed"
	case errors.Is(err, warden.ErrInvalidKey), errors.Is(err, warden.ErrInvalidPattern), errors.Is(err, warden.ErrInvalidArgument):
		return "invalid_argument"
	case errors.Is(err, warden.ErrValueTooLarge):
		return "value_too_large"
	case errors.Is(err, errors.ErrUnsupported):
		return "unsupported"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}
