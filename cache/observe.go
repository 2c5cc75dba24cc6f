package cache

import (
	"context"
	"strings"
	"time"
)

// ObservationKind says what an Observation reports.
type ObservationKind string

// The kinds of Observation a Cache reports to Options.Observe.
const (
	// ObservedLookup: Get or GetOrLoad looked key up; Result says what it
	// found.
	ObservedLookup ObservationKind = "lookup"
	// ObservedLoad: a loader call of this Cache ended; Duration is how
	// long it ran, Err its error (one wrapping ErrNotFound for an
	// absence).
	ObservedLoad ObservationKind = "load"
	// ObservedLoadWait: a GetOrLoad call waited for a load it did not
	// start: another caller's in this process, or (Remote) one that found
	// another process's load lease in its way and waited for that
	// process's value or lease. Stampede protection made it wait instead
	// of loading. Duration is how long it waited, Err the error it got
	// (nil with a value).
	ObservedLoadWait ObservationKind = "load-wait"
	// ObservedStoreError: a store or codec error (Stats.Errors counts
	// them), Err; reported with context.Background().
	ObservedStoreError ObservationKind = "store-error"
	// ObservedFallback: GetOrLoad loaded without the store because it
	// failed or timed out (Stats.StoreFallbacks); Err is the store's
	// error.
	ObservedFallback ObservationKind = "fallback"
)

// LookupResult is what a lookup found (Observation.Result).
type LookupResult string

// The results of ObservedLookup.
const (
	LookupHit      LookupResult = "hit"      // a fresh value
	LookupStale    LookupResult = "stale"    // a stale value served while it is reloaded (StaleWhileRevalidate)
	LookupNegative LookupResult = "negative" // a cached absence
	LookupMiss     LookupResult = "miss"     // nothing usable
)

// Observation is one thing a Cache did, reported to Options.Observe for
// telemetry: package otelwarden turns observations into OpenTelemetry
// metrics. Fields that do not apply to the Kind are zero.
type Observation struct {
	Kind ObservationKind
	// Key is the key concerned, without Options.Prefix ("" for
	// ObservedStoreError).
	Key string
	// Result is what the lookup found (ObservedLookup).
	Result LookupResult
	// Duration is how long the load ran (ObservedLoad) or the caller
	// waited (ObservedLoadWait).
	Duration time.Duration
	// Remote reports a wait that included waiting for another process's
	// load (ObservedLoadWait).
	Remote bool
	// Err is the outcome's error; see the ObservationKind constants.
	Err error
}

// lookedUp reports a lookup of key that found r.
func (c *Cache[T]) lookedUp(ctx context.Context, key string, r LookupResult) {
	if c.opts.Observe != nil {
		c.opts.Observe(ctx, Observation{Kind: ObservedLookup, Key: key, Result: r})
	}
}

// observeKey reports o about the stored key sk.
func (c *Cache[T]) observeKey(ctx context.Context, sk string, o Observation) {
	o.Key = strings.TrimPrefix(sk, c.opts.Prefix)
	c.opts.Observe(ctx, o)
}
