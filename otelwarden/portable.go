package otelwarden

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
)

// Span and span event names.
const (
	SpanLockWait        = "warden.lock.wait"        // an Acquire or TryAcquire call
	SpanIdempotencyWait = "warden.idempotency.wait" // a duplicate's wait for another caller's claim
	EventLeaseLost      = "warden.lock.lease_lost"  // on the span current when the lease was acquired
	EventRejected       = "warden.breaker.rejected" // on the caller's span
)

// Lock reports a Locker's observation; pass it as lock.Options.Observe:
//
//	lock.New(st, &lock.Options{Observe: tel.Lock})
//
// Every Acquire and TryAcquire becomes a warden.lock.wait span (from the
// call to its outcome, with the holder it found in its way) — a child of
// the caller's span, or a root span without one, whatever
// Options.AllowRoot says: a wait is what the caller sees — and counts in
// warden.lock.acquisitions and warden.lock.wait.duration; refreshes,
// releases and losses count in the lock metrics, and a loss is also an
// event on the span that was current when the lease was acquired, if it
// is still recording.
func (t *Telemetry) Lock(ctx context.Context, o lock.Observation) {
	switch o.Kind {
	case lock.ObservedAcquire:
		outcome := "acquired"
		switch {
		case o.Err == nil:
		case errors.Is(o.Err, lock.ErrLocked):
			outcome = "busy"
		case errors.Is(o.Err, context.Canceled) || errors.Is(o.Err, context.DeadlineExceeded):
			outcome = "canceled"
		default:
			outcome = "error"
		}
		contended := "f"
		if o.Contended {
			contended = "t"
		}
		t.lockAcquisitions.Add(ctx, 1, t.set(setKey{"lock.acq", outcome, contended, ""}, KeyLockOutcome.String(outcome), KeyLockContended.Bool(o.Contended)).add...)
		t.lockWait.Record(ctx, seconds(o.Waited), t.set(setKey{"lock.wait", outcome, "", ""}, KeyLockOutcome.String(outcome)).rec...)
		if o.HandOff > 0 {
			t.lockHandOff.Record(ctx, seconds(o.HandOff), t.set(setKey{tag: "lock.handoff"}).rec...)
		}
		attrs := make([]attribute.KeyValue, 0, 9)
		attrs = append(attrs, KeyLockOwner.String(o.Owner), KeyLockOutcome.String(outcome), KeyLockContended.Bool(o.Contended), KeyLockWait.Float64(seconds(o.Waited)))
		if o.Holder != "" {
			attrs = append(attrs, KeyLockHolder.String(o.Holder))
		}
		if o.Token > 0 {
			attrs = append(attrs, KeyLockToken.Int64(o.Token))
		}
		attrs = append(attrs, t.ns...)
		attrs = t.keyAttr(attrs, o.Key)
		_, span := t.tracer.Start(ctx, SpanLockWait, trace.WithTimestamp(o.Start), trace.WithAttributes(attrs...))
		if outcome == "error" {
			span.RecordError(o.Err)
			span.SetStatus(codes.Error, o.Err.Error())
		}
		span.End(trace.WithTimestamp(o.Start.Add(o.Waited)))
	case lock.ObservedRefresh:
		outcome := "renewed"
		switch {
		case o.Err == nil:
		case errors.Is(o.Err, lock.ErrLeaseLost):
			outcome = "lost"
		default:
			outcome = "error"
		}
		set := t.set(setKey{"lock.refresh", outcome, "", ""}, KeyLockOutcome.String(outcome))
		t.lockRefreshes.Add(ctx, 1, set.add...)
		t.lockRefreshTime.Record(ctx, seconds(o.Duration), set.rec...)
	case lock.ObservedRelease:
		t.lockHold.Record(ctx, seconds(o.Held), t.set(setKey{"lock.hold", "released", "", ""}, KeyLockOutcome.String("released")).rec...)
	case lock.ObservedLoss:
		t.lockHold.Record(ctx, seconds(o.Held), t.set(setKey{"lock.hold", "lost", "", ""}, KeyLockOutcome.String("lost")).rec...)
		t.lockLost.Add(ctx, 1, t.set(setKey{"lock.lost", string(o.Cause), "", ""}, KeyLockCause.String(string(o.Cause))).add...)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			attrs := []attribute.KeyValue{KeyLockCause.String(string(o.Cause)), KeyLockToken.Int64(o.Token), KeyLockOwner.String(o.Owner)}
			span.AddEvent(EventLeaseLost, trace.WithAttributes(t.keyAttr(attrs, o.Key)...))
		}
	}
}

// Breaker reports a Breaker's observation; pass it as
// breaker.Options.Observe:
//
//	breaker.New(st, "payments", &breaker.Options{Observe: tel.Breaker})
//
// Calls and rejections count in warden.breaker.calls, and a rejection is
// also an event on the caller's span; state changes count in
// warden.breaker.transitions and set the warden.breaker.state gauge of
// the circuit. Circuit names are reported as they are, in metrics too
// (they name configuration, not users).
func (t *Telemetry) Breaker(ctx context.Context, o breaker.Observation) {
	circuit := KeyCircuit.String(o.Circuit)
	switch o.Kind {
	case breaker.ObservedCall:
		t.knowCircuit(o.Circuit)
		out := string(o.Outcome)
		t.breakerCalls.Add(ctx, 1, t.set(setKey{"breaker.calls", o.Circuit, out, ""}, circuit, KeyBreakerOutcome.String(out)).add...)
	case breaker.ObservedRejection:
		t.knowCircuit(o.Circuit)
		t.breakerCalls.Add(ctx, 1, t.set(setKey{"breaker.calls", o.Circuit, "rejected", ""}, circuit, KeyBreakerOutcome.String("rejected")).add...)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.AddEvent(EventRejected, trace.WithAttributes(circuit, KeyBreakerState.String(string(o.State))))
		}
	case breaker.ObservedStateChange:
		t.circuitsMu.Lock()
		t.circuits[o.Circuit] = string(o.To)
		t.circuitsMu.Unlock()
		from, to := string(o.From), string(o.To)
		t.breakerTransitions.Add(ctx, 1, t.set(setKey{"breaker.transitions", o.Circuit, from, to}, circuit, KeyBreakerFrom.String(from), KeyBreakerTo.String(to)).add...)
	}
}

// knowCircuit adds a circuit to the state gauge, closed (as a Breaker
// starts) until a state change says otherwise.
func (t *Telemetry) knowCircuit(name string) {
	t.circuitsMu.Lock()
	if _, ok := t.circuits[name]; !ok {
		t.circuits[name] = string(breaker.Closed)
	}
	t.circuitsMu.Unlock()
}

var circuitStates = []string{string(breaker.Closed), string(breaker.Open), string(breaker.HalfOpen)}

// observeCircuits reports the state gauge: for each circuit seen, 1 for
// its state and 0 for the others.
func (t *Telemetry) observeCircuits(_ context.Context, obs metric.Int64Observer) error {
	t.circuitsMu.Lock()
	states := make(map[string]string, len(t.circuits))
	for c, s := range t.circuits {
		states[c] = s
	}
	t.circuitsMu.Unlock()
	for c, cur := range states {
		for _, s := range circuitStates {
			v := int64(0)
			if s == cur {
				v = 1
			}
			obs.Observe(v, t.set(setKey{"breaker.state", c, s, ""}, KeyCircuit.String(c), KeyBreakerState.String(s)).obs...)
		}
	}
	return nil
}

// Cache reports a Cache's observation; pass it as cache.Options.Observe:
//
//	cache.New[User](st, &cache.Options{TTL: time.Minute, Observe: tel.Cache})
//
// Lookups, loads, waits for another caller's load, store errors and
// fallbacks count in the cache metrics.
func (t *Telemetry) Cache(ctx context.Context, o cache.Observation) {
	switch o.Kind {
	case cache.ObservedLookup:
		r := string(o.Result)
		t.cacheLookups.Add(ctx, 1, t.set(setKey{"cache.lookups", r, "", ""}, KeyCacheResult.String(r)).add...)
	case cache.ObservedLoad:
		outcome := "success"
		switch {
		case o.Err == nil:
		case errors.Is(o.Err, cache.ErrNotFound):
			outcome = "absent"
		default:
			outcome = "error"
		}
		t.cacheLoads.Record(ctx, seconds(o.Duration), t.set(setKey{"cache.loads", outcome, "", ""}, KeyCacheOutcome.String(outcome)).rec...)
	case cache.ObservedLoadWait:
		t.cacheLoadWaits.Record(ctx, seconds(o.Duration), t.set(setKey{"cache.waits", strconv.FormatBool(o.Remote), "", ""}, KeyCacheRemote.Bool(o.Remote)).rec...)
	case cache.ObservedStoreError:
		et := errorType(o.Err)
		t.cacheStoreErrors.Add(ctx, 1, t.set(setKey{"cache.errors", et, "", ""}, semconv.ErrorTypeKey.String(et)).add...)
	case cache.ObservedFallback:
		t.cacheFallbacks.Add(ctx, 1, t.set(setKey{tag: "cache.fallbacks"}).add...)
	}
}

// Idempotency reports an observation of idempotency.Do; pass it as
// idempotency.Options.Observe:
//
//	idempotency.Do(ctx, st, key, &idempotency.Options{Observe: tel.Idempotency}, fn)
//
// Every Do that got an answer counts in warden.idempotency.outcomes; a
// duplicate's wait for another caller's claim becomes a
// warden.idempotency.wait span (with the claimant it waited for; a root
// span without a caller's span, like a lock wait's) and counts in
// warden.idempotency.wait.duration.
func (t *Telemetry) Idempotency(ctx context.Context, o idempotency.Observation) {
	switch o.Kind {
	case idempotency.ObservedOutcome:
		out := strings.ReplaceAll(string(o.Outcome), "-", "_")
		t.idemOutcomes.Add(ctx, 1, t.set(setKey{"idem.outcomes", out, "", ""}, KeyIdemOutcome.String(out)).add...)
	case idempotency.ObservedWait:
		t.idemWait.Record(ctx, seconds(o.Waited), t.set(setKey{tag: "idem.wait"}).rec...)
		attrs := []attribute.KeyValue{KeyIdemHolder.String(o.Holder), KeyIdemWait.Float64(seconds(o.Waited))}
		attrs = append(attrs, t.ns...)
		attrs = t.keyAttr(attrs, o.Key)
		_, span := t.tracer.Start(ctx, SpanIdempotencyWait, trace.WithTimestamp(o.Start), trace.WithAttributes(attrs...))
		if o.Err != nil {
			span.RecordError(o.Err)
			span.SetStatus(codes.Error, o.Err.Error())
		}
		span.End(trace.WithTimestamp(o.Start.Add(o.Waited)))
	}
}

// Checkpoint reports an observation of checkpoint.Run; pass it as
// checkpoint.Options.Observe:
//
//	checkpoint.Run(ctx, st, "import", &checkpoint.Options{Observe: tel.Checkpoint}, fn)
//
// Runs count in warden.checkpoint.runs (resumed or not), saves in
// warden.checkpoint.saves by outcome.
func (t *Telemetry) Checkpoint(ctx context.Context, o checkpoint.Observation) {
	switch o.Kind {
	case checkpoint.ObservedStart:
		t.checkpointRuns.Add(ctx, 1, t.set(setKey{"checkpoint.runs", strconv.FormatBool(o.Resumed), "", ""}, KeyCheckpointResumed.Bool(o.Resumed)).add...)
	case checkpoint.ObservedSave:
		outcome := "saved"
		switch {
		case o.Err == nil:
		case errors.Is(o.Err, checkpoint.ErrStale):
			outcome = "stale"
		default:
			outcome = "error"
		}
		t.checkpointSaves.Add(ctx, 1, t.set(setKey{"checkpoint.saves", outcome, "", ""}, KeyCheckpointOutcome.String(outcome)).add...)
	}
}
