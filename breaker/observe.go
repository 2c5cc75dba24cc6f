package breaker

import (
	"context"
	"errors"
	"time"
)

// ObservationKind says what an Observation reports.
type ObservationKind string

// The kinds of Observation a Breaker reports to Options.Observe.
const (
	// ObservedCall: a call the Breaker admitted ended; Outcome says how it
	// counted, Probe whether it was a half-open probe, Duration how long
	// fn ran, Err is fn's error.
	ObservedCall ObservationKind = "call"
	// ObservedRejection: a call was rejected without running fn; State
	// is the Breaker's view then, Err the *OpenError returned.
	ObservedRejection ObservationKind = "rejection"
	// ObservedStateChange: the Breaker's view of the circuit changed from
	// From to To, whoever caused it (as Options.OnStateChange reports).
	ObservedStateChange ObservationKind = "state-change"
)

// CallOutcome is how an admitted call counted (Observation.Outcome).
type CallOutcome string

// The outcomes of ObservedCall.
const (
	// CallSucceeded: fn returned nil, or an error IsFailure rejects.
	CallSucceeded CallOutcome = "success"
	// CallFailed: fn failed or panicked.
	CallFailed CallOutcome = "failure"
	// CallIgnored: fn returned a context error after the caller's ctx
	// ended; it counted neither way.
	CallIgnored CallOutcome = "ignored"
)

// Observation is one thing a Breaker did, reported to Options.Observe for
// telemetry: package otelwarden turns observations into OpenTelemetry
// spans, span events and metrics. Fields that do not apply to the Kind
// are zero.
type Observation struct {
	Kind    ObservationKind
	Circuit string // the circuit's name
	// Outcome is how the call counted (ObservedCall).
	Outcome CallOutcome
	// Probe reports a half-open probe (ObservedCall).
	Probe bool
	// Duration is how long fn ran (ObservedCall).
	Duration time.Duration
	// State is the Breaker's view when it rejected the call
	// (ObservedRejection): Open, HalfOpen, or Closed when it failed
	// closed because the store is unreachable.
	State State
	// From and To are the states of a change (ObservedStateChange).
	From, To State
	// Err is fn's error (ObservedCall) or the rejection's *OpenError
	// (ObservedRejection).
	Err error
}

// observeCall reports an admitted call that ended.
func (b *Breaker) observeCall(ctx context.Context, t ticket, out outcome, d time.Duration, err error) {
	o := Observation{Kind: ObservedCall, Circuit: b.name, Probe: t.kind != normalCall, Duration: d, Err: err}
	switch out {
	case outcomeSuccess:
		o.Outcome = CallSucceeded
	case outcomeFailure:
		o.Outcome = CallFailed
	default:
		o.Outcome = CallIgnored
	}
	b.observe(ctx, o)
}

// observeRejection reports a call admit refused, if it was a rejection
// (not the caller's context ending).
func (b *Breaker) observeRejection(ctx context.Context, err error) {
	var oe *OpenError
	if errors.As(err, &oe) {
		b.observe(ctx, Observation{Kind: ObservedRejection, Circuit: b.name, State: oe.State, Err: err})
	}
}
