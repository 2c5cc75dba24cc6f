package lock

import (
	"context"
	"time"
)

// ObservationKind says what an Observation reports.
type ObservationKind string

// The kinds of Observation a Locker reports to Options.Observe.
const (
	// ObservedAcquire: an Acquire or TryAcquire call ended. Err is nil
	// when it returned a lease, a *HeldError (matching ErrLocked) when
	// TryAcquire found the key held, or the call's error.
	ObservedAcquire ObservationKind = "acquire"
	// ObservedRefresh: a store refresh of a lease ended (a background one
	// or Lease.Refresh). Err is nil when it renewed the lease,
	// ErrLeaseLost when the lease turned out lost, or the store's error
	// when the outcome stayed unknown.
	ObservedRefresh ObservationKind = "refresh"
	// ObservedRelease: a held lease was released (the first Release of a
	// lease held until then). Err is the release's error: nil, ErrNotHeld
	// when the store no longer had the holding, or the store's error.
	ObservedRelease ObservationKind = "release"
	// ObservedLoss: a lease was lost; Cause says why, Err is ErrLeaseLost.
	ObservedLoss ObservationKind = "loss"
)

// LossCause says why a lease was lost (Observation.Cause).
type LossCause string

// The causes of ObservedLoss.
const (
	// LostRefused: the store refused a refresh — the holding was
	// force-released, deleted, or taken over after it lapsed.
	LostRefused LossCause = "refused"
	// LostExpired: no refresh proved the lease held before its local
	// deadline (the store was slow or unreachable, or auto-refresh was
	// off and nobody called Lease.Refresh in time).
	LostExpired LossCause = "expired"
)

// Observation is one thing a Locker did, reported to Options.Observe for
// telemetry: package otelwarden turns observations into OpenTelemetry
// spans and metrics. Fields that do not apply to the Kind are zero.
type Observation struct {
	Kind  ObservationKind
	Key   string // the lock's key
	Owner string // this Locker's Owner
	// Token is the lease's fencing token (0 when ObservedAcquire returned
	// no lease).
	Token int64
	// Start is when the Acquire or TryAcquire call began
	// (ObservedAcquire), or when the refresh was sent (ObservedRefresh).
	Start time.Time
	// Waited is how long the call took, from Start to its outcome
	// (ObservedAcquire).
	Waited time.Duration
	// Contended reports that the call found the key held, or waited its
	// turn behind another waiter of this Locker, at least once
	// (ObservedAcquire).
	Contended bool
	// Holder is the owner of the last holding the call found in its way
	// (ObservedAcquire): another Locker's Owner, or this Locker's own when
	// another of its leases held the key; "" if it found none.
	Holder string
	// HandOff is the time from the end of this Locker's previous lease on
	// the key to this Acquire's lease, when the Acquire waited for that
	// lease to end and its next store attempt took the key
	// (ObservedAcquire); 0 when not measured: the key was free, or the
	// previous holder was another Locker, whose release time this one
	// does not know.
	HandOff time.Duration
	// Duration is the refresh's round trip, a read-back included
	// (ObservedRefresh).
	Duration time.Duration
	// Held is how long the lease was held, from its acquisition to its
	// release or loss (ObservedRelease, ObservedLoss).
	Held time.Duration
	// Cause says why the lease was lost (ObservedLoss).
	Cause LossCause
	// Err is the outcome's error; see the ObservationKind constants.
	Err error
}

// acquireTrace collects what an Acquire call saw, for its
// ObservedAcquire; nil when the Locker has no Options.Observe.
type acquireTrace struct {
	start     time.Time
	contended bool
	holder    string
	handOff   time.Duration
}

// observeAcquire reports an ended Acquire or TryAcquire call.
func (l *Locker) observeAcquire(ctx context.Context, key string, s *Lease, err error, tr *acquireTrace) {
	o := Observation{Kind: ObservedAcquire, Key: key, Owner: l.owner, Start: tr.start, Waited: time.Since(tr.start),
		Contended: tr.contended, Holder: tr.holder, HandOff: tr.handOff, Err: err}
	if s != nil {
		o.Token = s.token
	}
	l.observe(ctx, o)
}

// emit reports an observation about the lease, filling in its key, owner
// and token; a no-op without Options.Observe.
func (s *Lease) emit(ctx context.Context, o Observation) {
	if s.l.observe == nil {
		return
	}
	o.Key, o.Owner, o.Token = s.key, s.l.owner, s.token
	s.l.observe(ctx, o)
}
