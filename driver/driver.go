// Package driver defines the contract between warden's portable packages
// (lock, breaker, cache, idempotency, checkpoint) and the stores that keep
// their state (store/memory, store/sqlite, store/postgres, …).
//
// A driver implements atomic primitives only. Every method is one
// conditional operation on the database — one round trip where the database
// allows it — and decides on the database's side (or under the database's
// own lock) whether it applies. The portable layer never reads, decides and
// then writes across two driver calls; everything that must be decided
// atomically is decided inside one driver method.
//
// # Conventions for every method
//
//   - Arguments have already been validated by [github.com/warden-go/warden.Store]:
//     keys, names, task ids and owners are non-empty UTF-8 of at most
//     [MaxKeyBytes] bytes without NUL; values fit [Limits.MaxValueBytes];
//     durations are whole milliseconds and positive unless a method says
//     zero is allowed. Drivers need not check them again.
//   - Expected outcomes ("not acquired", "not held", "absent") are results,
//     never errors. An error means the operation failed or its outcome is
//     unknown: the caller may retry or read back.
//   - Keys are stored in the store's namespace (its prefix) and must
//     round-trip byte for byte. A store never reads, lists, changes or
//     deletes records outside its namespace, nor records of another kind.
//   - Expiry is decided by one clock per store: the database's clock where the
//     database offers one inside the same atomic operation, otherwise the
//     client's. An expired record is treated as absent by every method at
//     once; native TTL machinery is only garbage collection.
//   - Times returned are UTC with millisecond precision.
//   - If ctx ends, the method returns ctx.Err() (possibly wrapped).
//
// Optional capabilities (notifications, migrations, purging) are separate
// interfaces discovered by type assertion on [Store].
package driver

import (
	"context"
	"time"
)

// MaxKeyBytes is the largest key, name, task id or owner, in bytes.
const MaxKeyBytes = 512

// Store is one connection to a database in one namespace. It bundles the
// capability drivers. It is safe for concurrent use.
type Store interface {
	// Name is the backend's short name: "memory", "sqlite", "postgres", …
	Name() string
	// Limits reports the store's size limits.
	Limits() Limits
	Locks() Locks
	Circuits() Circuits
	Cache() Cache
	Idempotency() Idempotency
	Checkpoints() Checkpoints
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// Close releases the store's resources. Only resources the store
	// created are closed; a client handed to a store's New stays open.
	// Close stops every goroutine the store started.
	Close() error
}

// Limits are a store's size limits.
type Limits struct {
	// MaxValueBytes is the largest value (cache value, idempotency result,
	// checkpoint data) the store accepts. Larger values are refused with
	// warden.ErrValueTooLarge before any I/O, never truncated.
	MaxValueBytes int
}

// Migrator is implemented by stores that create tables, collections or
// indexes. Migrate is idempotent and also upgrades layouts created by the
// go-go-scope adapters (adds missing columns and indexes).
type Migrator interface {
	Migrate(ctx context.Context) error
}

// Purger is implemented by stores that keep records past their expiry:
// released lock records (kept for fencing), expired cache entries,
// lapsed idempotency records, checkpoint fence records. Purge deletes, in
// the store's namespace, expired cache and idempotency records, lock
// records that have been idle (released or expired) for at least
// lockRetention, and the fence records of tasks that have no checkpoint
// and whose fence has not changed for at least lockRetention (see
// [Checkpoints]). It returns the number of records deleted.
type Purger interface {
	Purge(ctx context.Context, lockRetention time.Duration) (int64, error)
}

// ---------------------------------------------------------------------------
// Locks

// LockRecord is the state of one lock.
type LockRecord struct {
	Key   string // the key without the store's prefix
	Owner string // the holder
	// Token is the fencing token of the current holding: strictly greater
	// than every token handed out before for this key on this store.
	Token      int64
	AcquiredAt time.Time // when the current holder first acquired it
	ExpiresAt  time.Time // the store clock's expiry of the holding
}

// Locks is the lock driver.
//
// Fencing tokens: a store hands each new holding a token strictly greater
// than every token handed out before for the same key, across releases,
// expiries, takeovers and restarts of the clients. A holder that acquires
// again while it still holds the lock keeps its token. See docs/design.md
// for the scheme the bundled stores use.
type Locks interface {
	// Acquire takes the lock for owner for ttl, atomically. It succeeds when
	// there is no live holding (absent, released or expired) or when owner
	// holds it already (then the expiry is renewed and the token kept). It
	// reports acquired=false with the current holder's record when someone
	// else holds it. Concurrent first acquires of a new key: exactly one
	// wins, the others get acquired=false — never an error, never a
	// deadlock.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (rec LockRecord, acquired bool, err error)
	// Refresh renews the expiry to now+ttl if owner still holds the holding
	// with this token and it has not expired. ok=false otherwise.
	Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (rec LockRecord, ok bool, err error)
	// Release ends the holding if owner holds it with this token (expired or
	// not, as long as nobody took it over). ok=false if not held.
	Release(ctx context.Context, key, owner string, token int64) (ok bool, err error)
	// ForceRelease ends any live holding of key. ok=false if none was live.
	ForceRelease(ctx context.Context, key string) (ok bool, err error)
	// Get returns the live holding of key; found=false if none.
	Get(ctx context.Context, key string) (rec LockRecord, found bool, err error)
	// List returns every live holding whose key matches pattern, sorted by
	// key, reading every page.
	List(ctx context.Context, pattern Pattern) ([]LockRecord, error)
}

// LockEventKind says what happened to a lock.
type LockEventKind int

const (
	// LockAcquired: a new holding began (Owner and Token are set).
	LockAcquired LockEventKind = iota + 1
	// LockReleased: a holding was released or force-released.
	LockReleased
	// LockExpired: a holding lapsed, seen by a store that can tell.
	LockExpired
	// EventsLost: the stream fell behind and events may be missing;
	// watchers should re-read the state they care about.
	EventsLost
)

func (k LockEventKind) String() string {
	switch k {
	case LockAcquired:
		return "acquired"
	case LockReleased:
		return "released"
	case LockExpired:
		return "expired"
	case EventsLost:
		return "events-lost"
	}
	return "unknown"
}

// LockEvent is one change of a lock, seen by every process.
type LockEvent struct {
	Kind  LockEventKind
	Key   string // without prefix; empty for EventsLost
	Owner string
	Token int64
	At    time.Time
	// Err, on an EventsLost, says why events may be missing when the
	// store could not be read (the poller of stores without notifications
	// reports the first failed listing of a run of failures); nil when
	// the receiver fell behind.
	Err error
}

// LockNotifier is the optional capability of stores that deliver lock events
// from every process: PostgreSQL LISTEN/NOTIFY, Redis pub/sub, a MongoDB
// capped collection, in-process delivery for SQLite and memory.
type LockNotifier interface {
	// WatchLocks delivers events for every lock of the store's namespace
	// until ctx ends or the store closes; then the channel is closed.
	// Delivery is best effort: a slow receiver gets EventsLost instead of
	// blocking the store.
	WatchLocks(ctx context.Context) (<-chan LockEvent, error)
}

// LockWaiter is the optional capability of stores that can queue the
// waiters of a lock in the store and hand a released key to the first of
// them (MySQL's named locks, GET_LOCK; SQLite's waiters' table; Redis's
// queue beside the lock record; DynamoDB's and MongoDB's queues in the
// lock item or document, where the release itself makes the first waiter
// the holder). The queue only orders and wakes; the lock record alone
// decides who holds the lock, exactly as without the capability.
//
// A waiter whose turn came keeps it — others queue behind it — until its
// Acquire turns it into a holding, or until LeaveLock. While it has its
// turn, the store may refuse other owners a key its holder has just
// released and handed to it (for a bounded time): that is what makes the
// hand-off fair, a releaser that asks again at once queues behind the
// waiters instead of taking the key back.
type LockWaiter interface {
	// WaitLock waits, for at most max, for owner's turn to acquire key:
	// until the holders and waiters ahead of it in the store's queue for
	// key have released it or ended. It returns true when the caller
	// should call Acquire at once: its turn came, or max passed. It
	// returns false at once when waiting in the store would not help — it
	// cannot wait now (every connection it keeps for waiting is busy), or
	// owner has its turn already and the holding it waits for is not in
	// the queue: the caller then backs off and polls as it would without
	// the capability. If ctx ends first it returns ctx's error.
	WaitLock(ctx context.Context, key, owner string, max time.Duration) (again bool, err error)
	// LeaveLock gives up owner's turn for key, if it has one that did not
	// become a holding. The lock package calls it when a waiting Acquire
	// ends without a lease.
	LeaveLock(key, owner string)
}

// ---------------------------------------------------------------------------
// Circuits

// CircuitState is the state of a circuit breaker.
type CircuitState string

// The circuit states, spelled as the go-go-scope adapters store them.
const (
	Closed   CircuitState = "closed"
	Open     CircuitState = "open"
	HalfOpen CircuitState = "half-open"
)

// Valid reports whether s is one of the three states.
func (s CircuitState) Valid() bool { return s == Closed || s == Open || s == HalfOpen }

// CircuitRecord is the shared state of one circuit breaker.
type CircuitRecord struct {
	Name        string
	State       CircuitState
	Failures    int64     // consecutive failures
	LastFailure time.Time // zero if never
	LastSuccess time.Time // zero if never
	OpenedAt    time.Time // open or half-open: when it last opened; zero when closed (closing clears it)
	ProbeOwner  string    // holder of the newest half-open probe slot
	ProbeUntil  time.Time // when the probe slots lapse (the newest grant's lease)
	Version     int64     // increases on every change
	UpdatedAt   time.Time

	// The counts of the current counting period (see Counts): closed, since
	// IntervalStart; half-open, since the circuit turned half-open. Opening
	// and closing the circuit reset them. Records written before these
	// fields existed, or by writers that do not keep them, read 0.
	Successes            int64     // successes counted in the period
	TotalFailures        int64     // failures counted in the period
	ConsecutiveSuccesses int64     // successes since the last failure, in the period
	IntervalStart        time.Time // when the closed state's period began; zero if unknown
	// Probes is the number of half-open probe slots granted and not yet
	// ended by an outcome. All of them lapse at ProbeUntil: a live count
	// is Probes while ProbeUntil is in the future, 0 afterwards.
	Probes int64
	// ProbeEpoch names the current set of probe slots, the slots granted
	// since the last grant that found none held: the grant that turned
	// the circuit half-open, or the first grant after every slot lapsed,
	// adds one to it (as Set does, which clears the slots); the other
	// grants keep it. A probe's outcome carries the ProbeEpoch its grant
	// returned (Outcome.ProbeEpoch), and applies only while it is still
	// the circuit's: a probe whose slot lapsed and was granted again, to
	// any caller, no longer decides the circuit. Records of writers that
	// do not keep it read 0.
	ProbeEpoch int64
}

// Counts are a circuit's counts in its current counting period, in the
// shape of sony/gobreaker's Counts (same field names, types and order, so
// a gobreaker.Counts conversion compiles). Requests is the number of
// outcomes counted (successes plus failures); unlike gobreaker it does not
// include calls still running. ConsecutiveFailures is the record's
// Failures. Values above the uint32 range read as math.MaxUint32.
type Counts struct {
	Requests             uint32
	TotalSuccesses       uint32
	TotalFailures        uint32
	ConsecutiveSuccesses uint32
	ConsecutiveFailures  uint32
}

// Counts returns the record's counts.
func (r CircuitRecord) Counts() Counts {
	return Counts{
		Requests:             clampU32(r.Successes + r.TotalFailures),
		TotalSuccesses:       clampU32(r.Successes),
		TotalFailures:        clampU32(r.TotalFailures),
		ConsecutiveSuccesses: clampU32(r.ConsecutiveSuccesses),
		ConsecutiveFailures:  clampU32(r.Failures),
	}
}

func clampU32(n int64) uint32 {
	switch {
	case n <= 0:
		return 0
	case n > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(n)
}

// LiveProbes returns the number of probe slots still held at now (a time
// of the store's clock): Probes while ProbeUntil is after now, else 0.
func (r CircuitRecord) LiveProbes(now time.Time) int64 {
	if r.State != HalfOpen || !r.ProbeUntil.After(now) || r.Probes < 0 {
		return 0
	}
	return r.Probes
}

// OutcomeKind says what an Outcome records.
type OutcomeKind int

// The outcome kinds.
const (
	// OutcomeNone records no call: only the Outcome's Successes are
	// counted (a closed circuit's successes written in a batch).
	OutcomeNone OutcomeKind = iota
	// OutcomeSuccess records one successful call.
	OutcomeSuccess
	// OutcomeFailure records one failed call.
	OutcomeFailure
)

// Outcome is what Circuits.RecordOutcome records in one atomic step. Its
// zero value records nothing (OutcomeNone, no successes) for generation 0.
type Outcome struct {
	// Kind is the call's outcome.
	Kind OutcomeKind
	// Gen is the generation (CircuitRecord.Generation) the call was
	// admitted in, or AnyGeneration. An outcome of another generation
	// changes nothing, its Successes included.
	Gen int64
	// ProbeEpoch is, for a half-open probe, the ProbeEpoch of the record
	// TryProbes returned when it granted the probe its slot; 0 for a call
	// admitted while the circuit was closed (and for operators). An
	// outcome whose ProbeEpoch is not 0 and not the circuit's changes
	// nothing: its slot is no longer granted (it lapsed and slots were
	// granted again, or Set cleared it). ≥ 0.
	ProbeEpoch int64
	// Successes is a number of successes of calls made while the circuit
	// was closed and not written one by one (the steady closed success path
	// is write-free). They are counted before the call, only if the circuit
	// is closed, and only in Successes (and so Requests): they are older
	// than this write, so they change neither consecutive count. ≥ 0.
	Successes int64
	// Threshold is the number of consecutive failures at which a failure
	// opens a closed circuit. 0: the count never opens it (the caller
	// decides on the counts returned and opens it with Trip). ≥ 0.
	Threshold int
	// CloseAfter is the number of successes in a row that close a
	// half-open circuit (ConsecutiveSuccesses counted since it turned
	// half-open). 0 or 1: the first.
	CloseAfter int
	// Interval, in the closed state, is the length of a counting period:
	// before the outcome counts, a circuit whose IntervalStart+Interval is
	// not after now (the store's clock) has its counts (Successes,
	// TotalFailures, ConsecutiveSuccesses and Failures) reset and
	// IntervalStart set to now; a zero IntervalStart is set to now without
	// a reset. 0: no periods (counts reset only when the state changes).
	Interval time.Duration
}

// Failure returns the Outcome of one failure of generation gen opening the
// circuit at threshold consecutive failures: what RecordFailure records.
func Failure(gen int64, threshold int) Outcome {
	return Outcome{Kind: OutcomeFailure, Gen: gen, Threshold: threshold}
}

// Success returns the Outcome of one success of generation gen that closes
// a half-open circuit: what RecordSuccess records.
func Success(gen int64) Outcome { return Outcome{Kind: OutcomeSuccess, Gen: gen} }

// Generation returns the circuit's generation: OpenedAt in Unix
// milliseconds, 0 while closed. It changes every time the circuit opens
// (a circuit probed only after at least one millisecond open, as every
// Breaker's is, re-opens in a later millisecond) and every time it closes
// (closing, by its probes' successes or by Set, clears OpenedAt): a
// half-open circuit keeps the generation of its last opening, a closed
// circuit is of generation 0. An outcome carries the generation of the
// record its call was admitted on, and the store ignores outcomes of
// another generation: a late success of a call admitted before the
// circuit re-opened never closes it, nor ends the probing of the new
// generation; a late outcome of a probe whose generation other probes
// have closed never re-opens the closed circuit nor counts in its period.
// (Every closed period is generation 0, so an outcome of a call admitted
// while closed that outlives a whole open, half-open and closed cycle
// counts in the later closed period.)
func (r CircuitRecord) Generation() int64 {
	if r.OpenedAt.IsZero() {
		return 0
	}
	return r.OpenedAt.UnixMilli()
}

// AnyGeneration, as the generation of RecordFailure or RecordSuccess,
// applies the outcome to whatever generation the circuit is in
// (operators, tools).
const AnyGeneration int64 = -1

// Circuits is the circuit-breaker state driver. An absent circuit is closed
// with no failures.
type Circuits interface {
	// RecordFailure atomically adds one failure: closed → open when the
	// count reaches threshold (threshold ≥ 1); half-open → open; open stays
	// open. Opening sets OpenedAt to now and clears the probe slot.
	// Concurrent calls never lose an increment.
	//
	// gen is the generation (CircuitRecord.Generation) the failing call
	// was admitted in, or AnyGeneration. If the circuit's generation is
	// another one (an absent circuit's is 0), the failure belongs to a
	// generation that is over: nothing changes, and the current record is
	// returned. The comparison and the change are one atomic step.
	RecordFailure(ctx context.Context, name string, threshold int, gen int64) (CircuitRecord, error)
	// RecordSuccess atomically records a success: closed → failures reset;
	// half-open → closed, failures reset, probe slot and OpenedAt cleared; open stays open
	// (a late success of a call begun before opening proves nothing). gen
	// is as for RecordFailure: a success of another generation changes
	// nothing.
	RecordSuccess(ctx context.Context, name string, gen int64) (CircuitRecord, error)
	// RecordOutcome records o in one atomic step and returns the new
	// record (or, for an outcome of another generation, the current one,
	// unchanged). RecordFailure is RecordOutcome(Failure(gen, threshold))
	// and RecordSuccess is RecordOutcome(Success(gen)). In order:
	//
	//   - o.Gen is not the circuit's generation (and not AnyGeneration),
	//     or o.ProbeEpoch is not 0 and not the circuit's ProbeEpoch (a
	//     probe whose slot is no longer granted): nothing changes.
	//   - closed, o.Interval > 0: the counting period is renewed if over
	//     (see Outcome.Interval); then o.Successes add to Successes.
	//   - failure: Failures+1 and LastFailure = now in every state. Closed:
	//     TotalFailures+1, ConsecutiveSuccesses = 0, and the circuit opens
	//     if o.Threshold > 0 and Failures ≥ o.Threshold. Half-open: it
	//     opens. Open: it stays open.
	//   - success: LastSuccess = now in every state. Closed: Failures = 0,
	//     Successes+1, ConsecutiveSuccesses+1. Half-open: Successes+1,
	//     ConsecutiveSuccesses+1, one live probe slot ends (Probes−1, not
	//     below 0), and the circuit closes once ConsecutiveSuccesses ≥
	//     max(o.CloseAfter, 1). Open: it stays open.
	//
	// Opening sets OpenedAt to now and clears the probe slots; opening and
	// turning half-open reset the counts (Successes, TotalFailures,
	// ConsecutiveSuccesses; Failures is kept); closing resets them,
	// Failures included, sets IntervalStart to now, clears the probe
	// slots and clears OpenedAt (generation 0). Concurrent calls
	// never lose an increment.
	RecordOutcome(ctx context.Context, name string, o Outcome) (CircuitRecord, error)
	// Trip opens a closed circuit whose Version is still version, in one
	// atomic step, as a failure at the threshold would: the caller decided
	// on the counts of that version (a Go function cannot run in the
	// store) and nothing has changed since. tripped=false, with the
	// current record, if the circuit is not closed or its version moved
	// on (decide again on that record's counts).
	Trip(ctx context.Context, name string, version int64) (rec CircuitRecord, tripped bool, err error)
	// TryProbe grants the half-open probe slot to exactly one caller across
	// the fleet. Open with OpenedAt+openFor passed → half-open, slot to
	// owner until now+lease, granted. Half-open with the slot lapsed or held
	// by owner → slot to owner, granted. Otherwise not granted; the record
	// tells why (closed: just call; open: not yet; half-open: someone else
	// probes).
	TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (rec CircuitRecord, granted bool, err error)
	// TryProbes grants one of maxProbes concurrent half-open probe slots
	// across the fleet (TryProbe is TryProbes with maxProbes 1). Open with
	// OpenedAt+openFor passed → half-open, counts reset, Probes = 1, granted.
	// Half-open: owner holds the newest slot (ProbeOwner, ProbeUntil after
	// now) → granted again, Probes unchanged; else, with the live count
	// (LiveProbes) below maxProbes → Probes = live count + 1, granted.
	// Every grant sets ProbeOwner = owner and ProbeUntil = now+lease, so
	// the slots lapse together, lease after the newest grant: a dead
	// prober's slot is free again once no slot was granted for a lease.
	// The grant from open, and a grant in half-open with every slot lapsed
	// (ProbeUntil not after now), begin a new set of slots: ProbeEpoch+1;
	// the others keep ProbeEpoch. The granted record's ProbeEpoch is the
	// probe's, for its outcome (Outcome.ProbeEpoch).
	// Otherwise not granted; the record tells why (closed: just call;
	// open: not yet; half-open: maxProbes probes run). maxProbes ≥ 1.
	TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (rec CircuitRecord, granted bool, err error)
	// Get returns the circuit's record; found=false if absent.
	Get(ctx context.Context, name string) (rec CircuitRecord, found bool, err error)
	// Set forces a state (operators). Closed resets the failure count
	// and clears OpenedAt (generation 0); open sets OpenedAt to now; every
	// state clears the probe slots (ProbeEpoch+1: the outcomes of probes
	// still running change nothing) and resets the counts (closed also
	// sets IntervalStart to now).
	Set(ctx context.Context, name string, state CircuitState) (CircuitRecord, error)
	// Delete removes the circuit's record (it reads as closed afterwards).
	Delete(ctx context.Context, name string) (ok bool, err error)
	// List returns every circuit whose name matches pattern, sorted.
	List(ctx context.Context, pattern Pattern) ([]CircuitRecord, error)
}

// CircuitNotifier is the optional capability of stores that deliver circuit
// state changes from every process.
type CircuitNotifier interface {
	// WatchCircuits delivers the new record after every change in the
	// namespace until ctx ends or the store closes. Best effort, like
	// LockNotifier; a record with an empty Name means events were lost.
	WatchCircuits(ctx context.Context) (<-chan CircuitRecord, error)
}

// ---------------------------------------------------------------------------
// Cache

// CacheEntry is one cached value.
type CacheEntry struct {
	Key       string
	Value     []byte
	ExpiresAt time.Time // zero: no expiry
}

// Cache is the cache driver. A ttl of zero means no expiry.
type Cache interface {
	// Get returns the live entry; found=false if absent or expired.
	Get(ctx context.Context, key string) (e CacheEntry, found bool, err error)
	// Set stores value, replacing any entry.
	Set(ctx context.Context, key string, value []byte, ttl time.Duration) error
	// SetIfAbsent stores value only if there is no live entry, atomically.
	SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (stored bool, err error)
	// Delete removes the entry; ok=false if there was no live entry.
	Delete(ctx context.Context, key string) (ok bool, err error)
	// Has reports whether a live entry exists.
	Has(ctx context.Context, key string) (bool, error)
	// Clear deletes every cache entry of the namespace (and nothing else)
	// and returns how many live entries it deleted.
	Clear(ctx context.Context) (int64, error)
	// Keys returns every live key matching pattern, sorted, reading every page.
	Keys(ctx context.Context, pattern Pattern) ([]string, error)
}

// ---------------------------------------------------------------------------
// Idempotency

// IdemStatus is the status of an idempotency record.
type IdemStatus string

const (
	// IdemPending: a claimant is running the operation.
	IdemPending IdemStatus = "pending"
	// IdemCompleted: the result is stored.
	IdemCompleted IdemStatus = "completed"
)

// IdemRecord is the state of one idempotency key.
type IdemRecord struct {
	Key         string
	Status      IdemStatus
	Owner       string // the claimant (pending); the completer (completed)
	Fingerprint string // the claimant's request fingerprint, may be empty
	Result      []byte // completed only
	CreatedAt   time.Time
	// ExpiresAt is the claim lease's expiry (pending) or the end of the
	// result's retention (completed; zero: kept until deleted).
	ExpiresAt time.Time
}

// ClaimOutcome is the answer to a claim.
type ClaimOutcome int

const (
	// Claimed: the key was free; the caller runs the operation.
	Claimed ClaimOutcome = iota + 1
	// TakenOver: a previous claimant's lease lapsed; the caller runs it.
	TakenOver
	// InProgress: another live claimant runs it; Record.ExpiresAt tells
	// until when its lease runs.
	InProgress
	// Completed: the result is stored in Record.Result.
	Completed
)

func (o ClaimOutcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case TakenOver:
		return "taken-over"
	case InProgress:
		return "in-progress"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// Idempotency is the idempotency-key driver.
type Idempotency interface {
	// Claim atomically claims key for owner with a lease: absent or lapsed
	// completed record → Claimed; pending record whose lease lapsed →
	// TakenOver; pending record of owner itself → Claimed (lease renewed);
	// live pending record of another → InProgress; live completed record →
	// Completed. Among concurrent claimers exactly one gets Claimed or
	// TakenOver. The fingerprint is stored with a new claim; comparing
	// fingerprints is the caller's business.
	Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (rec IdemRecord, outcome ClaimOutcome, err error)
	// Extend renews owner's pending claim to now+lease. ok=false if owner
	// is no longer the claimant.
	Extend(ctx context.Context, key, owner string, lease time.Duration) (ok bool, err error)
	// Complete stores result if owner is still the claimant of a pending
	// record, and keeps it for retain (0: until deleted). ok=false otherwise.
	Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (ok bool, err error)
	// Abandon deletes owner's pending claim. ok=false if owner is not the
	// claimant.
	Abandon(ctx context.Context, key, owner string) (ok bool, err error)
	// Get returns the live record (pending within its lease, completed
	// within its retention); found=false otherwise.
	Get(ctx context.Context, key string) (rec IdemRecord, found bool, err error)
	// Set stores a completed record directly, replacing any record
	// (operators and go-go-scope-style use). ttl 0: until deleted.
	Set(ctx context.Context, key string, result []byte, ttl time.Duration) error
	// Delete removes the record; ok=false if there was no live record.
	Delete(ctx context.Context, key string) (ok bool, err error)
	// List returns every live record whose key matches pattern, sorted.
	List(ctx context.Context, pattern Pattern) ([]IdemRecord, error)
}

// ---------------------------------------------------------------------------
// Checkpoints

// Checkpoint is one saved state of a task.
type Checkpoint struct {
	ID       string // CheckpointID(TaskID, Sequence)
	TaskID   string
	Sequence int64 // 1, 2, 3, … per task, assigned by the store (see Checkpoints)
	Time     time.Time
	Progress float64 // 0–100
	Data     []byte
	// ETA is the estimated time remaining; zero: unknown.
	ETA time.Duration
	// Token is the fencing token of the lease the saver held; 0: none.
	Token int64
}

// CheckpointInput is what a saver provides; the store assigns the rest.
type CheckpointInput struct {
	TaskID   string
	Progress float64
	Data     []byte
	ETA      time.Duration
	Token    int64
}

// Checkpoints is the checkpoint driver.
//
// Fencing: each task has a fence record, kept by the store apart from the
// task's checkpoints, that survives Cleanup and DeleteAll. It holds the
// greatest fencing token ever saved with or fenced for the task (0 at
// first) and the last sequence assigned to the task (0 at first). A save
// with a token below the fence is refused, so a zombie lease holder's late
// save is refused as soon as a newer holder has called Fence — before the
// newer holder's first save, and after the task's checkpoints have been
// deleted. Sequences continue from the fence record, so they do not
// restart and checkpoint ids are not reused after Cleanup or DeleteAll.
//
// Deletions are fenced too: Cleanup and DeleteAll take the caller's token
// and delete nothing (ok=false) when the task's fence is above it, so a
// zombie's late DeleteAll after its successor took over does not delete
// the successor's checkpoints. Token 0 is not fenced (operators).
//
// Deletions are final, also against saves under way: once Cleanup or
// DeleteAll has returned, no checkpoint it deleted or whose sequence is at
// or below the newest sequence it deleted (for DeleteAll: every sequence
// assigned before it) is returned by Load, Latest or List, or makes Tasks
// list the task — not even a checkpoint whose Save had passed the fence
// before the deletion and writes it afterwards. (A store whose Save is
// one atomic write gets this for free; a store whose Save is two writes —
// the fence record's update, then the checkpoint — keeps the deleted
// sequences' upper bound in the fence record and its reads skip
// checkpoints at or below it.) So the next holder of a task whose run
// succeeded never resumes from a zombie's stale state.
//
// A store that implements [Purger] may delete the fence record of a task
// that has no checkpoint and whose fence has not changed for the lock
// retention, by the same reasoning as for idle lock records: a lock token
// handed out after that long is greater than any token the fence held
// (see [TokenBase]), and the task's sequences may then start again at 1.
type Checkpoints interface {
	// Save stores a checkpoint with the task's next sequence: the fence
	// record's last sequence + 1, assigned atomically (concurrent savers
	// never share a sequence, and a sequence is not handed out twice while
	// the fence record is kept). If in.Token > 0
	// and in.Token is less than the task's fence, the save is refused
	// (ok=false) and nothing is written: a newer lease holder exists, so
	// the caller is a zombie. An accepted save raises the fence to
	// in.Token if that is greater. A save with Token 0 is not fenced (it
	// neither is refused nor raises the fence) but still takes the next
	// sequence.
	Save(ctx context.Context, in CheckpointInput) (cp Checkpoint, ok bool, err error)
	// Fence raises the task's fence to token (> 0), atomically, if token
	// is at least the fence (ok=true; an equal token is accepted and
	// changes nothing), so that every later save with a smaller token is
	// refused. ok=false if the fence is already greater: the caller's
	// token is stale. A new lease holder calls it before reading the
	// task's state. Fence creates the record if the task has none; it
	// does not create checkpoints, so the task is not listed by Tasks.
	Fence(ctx context.Context, taskID string, token int64) (ok bool, err error)
	// Load returns the checkpoint with this id; found=false if absent.
	Load(ctx context.Context, id string) (cp Checkpoint, found bool, err error)
	// Latest returns the task's checkpoint with the highest sequence.
	Latest(ctx context.Context, taskID string) (cp Checkpoint, found bool, err error)
	// List returns the task's checkpoints in increasing numeric sequence.
	List(ctx context.Context, taskID string) ([]Checkpoint, error)
	// Cleanup deletes all but the keep newest checkpoints of the task
	// (keep ≥ 0) and returns how many it deleted. If token > 0 and the
	// task's fence is above token, it deletes nothing and returns ok=false
	// (the caller is a zombie). The check and the deletion act as one
	// step: a checkpoint saved after a Fence with a greater token is never
	// deleted by it, whenever its requests arrive. Token 0: not fenced.
	// The fence record stays.
	Cleanup(ctx context.Context, taskID string, keep int, token int64) (n int64, ok bool, err error)
	// DeleteAll deletes every checkpoint of the task, fenced by token as
	// Cleanup is. The fence record stays.
	DeleteAll(ctx context.Context, taskID string, token int64) (n int64, ok bool, err error)
	// Tasks returns the ids of tasks with checkpoints whose id matches
	// pattern, sorted. A task with a fence record but no checkpoint is not
	// listed.
	Tasks(ctx context.Context, pattern Pattern) ([]string, error)
}
