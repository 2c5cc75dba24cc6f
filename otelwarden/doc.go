// Package otelwarden reports warden to OpenTelemetry: a span per store
// operation within a caller's trace and per user-visible wait (a lock
// acquire, an idempotency duplicate waiting for another caller), span
// events for breaker rejections and lost leases, and metrics for every
// capability — lock acquisitions, wait, hold, refresh and hand-off times
// and leases lost by cause; breaker calls by outcome, transitions and a
// state gauge per circuit; cache lookups, loads, stampede waits and store
// errors; idempotency outcomes and waits; checkpoint runs and saves; store
// round trips and errors by backend and operation. The README's
// Observability section lists every metric and what it means.
//
// It is a module of its own, on the OpenTelemetry API only, so that the
// root module stays standard-library only: warden's packages report
// through warden.Hook and their Options' Observe functions, which carry
// no OpenTelemetry types, and a Telemetry turns those reports into
// telemetry. One Telemetry serves a whole service:
//
//	tel := otelwarden.New(nil) // the global providers; see Options
//	st, err := warden.OpenWith(ctx, url, &warden.Options{Hook: tel})
//	locker, err := lock.New(st, &lock.Options{Observe: tel.Lock})
//	b, err := breaker.New(st, "payments", &breaker.Options{Observe: tel.Breaker})
//	prices, err := cache.New[Price](st, &cache.Options{Observe: tel.Cache})
//	v, err := idempotency.Do(ctx, st, key, &idempotency.Options{Observe: tel.Idempotency}, fn)
//	err = checkpoint.Run(ctx, st, task, &checkpoint.Options{Observe: tel.Checkpoint}, fn)
//
// Keys (lock keys, cache keys, idempotency keys, task ids) may carry
// personal data: they go on spans, as warden.key, only with
// Options.IncludeKeys, and never on metrics. Attribute names follow the
// semantic conventions where they have one (db.system, error.type) and
// are warden.* otherwise.
//
// Store operations make spans only inside a caller's span (a request's
// or a job's, or one propagated from another process), as children of
// it: outside any trace they make no span, only their metrics, as in
// otelsql and the other database instrumentations — Options.AllowRoot
// makes them root spans instead. Scope's task spans, reported through the
// same hook, follow the same rule. The wait spans of locks and
// idempotency duplicates are made with or without a caller's span.
//
// Reports come after the fact (a hook cannot wrap the call it reports),
// so spans are made when the operation or wait has ended, with its real
// start and end times: a store operation's span is a sibling of the
// spans a database client's own instrumentation makes for it, not their
// parent.
package otelwarden
