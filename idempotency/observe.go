package idempotency

import (
	"context"
	"time"
)

// ObservationKind says what an Observation reports.
type ObservationKind string

// The kinds of Observation Do reports to Options.Observe.
const (
	// ObservedOutcome: Do ended after the store answered its claim;
	// Outcome is the claim's final outcome, Err is Do's error. (A Do whose
	// claims all failed in the store reports no outcome.)
	ObservedOutcome ObservationKind = "outcome"
	// ObservedWait: a duplicate stopped waiting for another caller's
	// claim: the key was completed or came free, or the wait ended with
	// Err (ctx ended, the store failed). Start is when it found the key
	// in progress, Waited how long it waited, Holder the claimant it saw
	// last.
	ObservedWait ObservationKind = "wait"
)

// Outcome is how the store answered a Do's claim (Observation.Outcome).
type Outcome string

// The outcomes of ObservedOutcome.
const (
	// OutcomeClaimed: the key was free; this Do claimed it and ran fn.
	OutcomeClaimed Outcome = "claimed"
	// OutcomeTakenOver: another caller's claim had lapsed; this Do took
	// the key over and ran fn.
	OutcomeTakenOver Outcome = "taken-over"
	// OutcomeCompleted: the key was completed; this Do returned the
	// stored result (or stored error) without running fn.
	OutcomeCompleted Outcome = "completed"
	// OutcomeInProgress: another caller ran fn and Options.NoWait was
	// set; this Do returned an *InProgressError.
	OutcomeInProgress Outcome = "in-progress"
)

// Observation is one thing Do did, reported to Options.Observe for
// telemetry: package otelwarden turns observations into OpenTelemetry
// spans and metrics. Fields that do not apply to the Kind are zero.
type Observation struct {
	Kind ObservationKind
	Key  string // the idempotency key
	// Outcome is the claim's outcome (ObservedOutcome).
	Outcome Outcome
	// Start is when the wait began (ObservedWait).
	Start time.Time
	// Waited is how long the duplicate waited (ObservedWait).
	Waited time.Duration
	// Holder is the claimant the duplicate saw last (ObservedWait).
	Holder string
	// Err is Do's error (ObservedOutcome), or the error that ended the
	// wait (ObservedWait; nil when the key was completed or came free).
	Err error
}

// doTrace follows one Do for Options.Observe.
type doTrace struct {
	observe   func(context.Context, Observation)
	key       string
	outcome   Outcome
	waitStart time.Time
	holder    string
}

// inProgress notes that the key was found in progress, held by owner.
func (d *doTrace) inProgress(owner string) {
	if d.waitStart.IsZero() {
		d.waitStart = time.Now()
	}
	d.holder = owner
}

// waitEnded reports the wait, if one began, ended by err.
func (d *doTrace) waitEnded(ctx context.Context, err error) {
	if d.waitStart.IsZero() {
		return
	}
	d.observe(ctx, Observation{Kind: ObservedWait, Key: d.key, Start: d.waitStart, Waited: time.Since(d.waitStart), Holder: d.holder, Err: err})
	d.waitStart = time.Time{}
}

// answered notes the claim's outcome, ending a wait unless the key is
// still in progress.
func (d *doTrace) answered(ctx context.Context, out Outcome) {
	d.outcome = out
	if out != OutcomeInProgress {
		d.waitEnded(ctx, nil)
	}
}

// done reports Do's end with err.
func (d *doTrace) done(ctx context.Context, err error) {
	d.waitEnded(ctx, err)
	if d.outcome != "" {
		d.observe(ctx, Observation{Kind: ObservedOutcome, Key: d.key, Outcome: d.outcome, Err: err})
	}
}
