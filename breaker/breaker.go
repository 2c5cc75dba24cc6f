// Package breaker is a circuit breaker whose state is shared by every
// process that uses the same warden store: when a dependency fails
// Threshold times in a row anywhere in the fleet (or when ReadyToTrip says
// so on the fleet's counts), every process stops calling it for OpenFor,
// then HalfOpenProbes callers in the whole fleet (one by default) probe
// it, and their outcomes close or re-open the circuit for everybody.
//
//	b, err := breaker.New(st, "payments-api", &breaker.Options{Threshold: 5, OpenFor: 30 * time.Second})
//	if err != nil { … }
//	defer b.Close()
//
//	err = b.Do(ctx, func(ctx context.Context) error { return callPayments(ctx) })
//	if errors.Is(err, breaker.ErrOpen) { … fall back … }
//
// # Cost
//
// A Breaker keeps a local view of the shared record. The steady closed
// state costs nothing per call: no write, and at most one read per
// SyncInterval, and none at all on a store that delivers circuit
// notifications (warden.Circuits.CanWatch; memory does). The Breaker
// writes only when there is something to record: a failure (one atomic
// increment), the first success after failures, a probe, a transition.
// The price is that a process may learn of a change made elsewhere up to
// SyncInterval late (on stores without notifications), during which it may
// still admit calls to a circuit another process has just opened.
//
// The common calls do not even take the Breaker's lock: a call on a
// circuit the local view holds closed, a call rejected on one it holds
// open before the next probe is due, and a closed call's success that
// needs no write read an immutable snapshot of the view with one atomic
// load, allocate nothing and read the clock at most once. The snapshot is
// exactly as fresh as the view (see the design notes, docs/design.md).
//
// # States
//
// Closed: calls run; each failure is recorded in the store, and the
// Threshold-th consecutive failure (counted across the fleet) opens the
// circuit. Open: calls fail fast with an error matching ErrOpen, without
// running fn. Once OpenFor has passed, the next call asks the store for a
// probe slot (the circuit turns half-open); HalfOpenProbes callers in the
// fleet (one by default) get one and run fn as probes, at the same time,
// while everybody else still gets ErrOpen. HalfOpenProbes successful
// probes in a row close the circuit; a failed probe re-opens it for
// another OpenFor. Probe slots are leases of ProbeLease: if a prober dies,
// its slot is free again once ProbeLease has passed since the newest slot
// was granted.
//
// # Coming from sony/gobreaker
//
// gobreaker's Settings map onto Options: MaxRequests is HalfOpenProbes,
// Interval is Interval, Timeout is OpenFor, ReadyToTrip is ReadyToTrip
// (over Counts, which have gobreaker's shape but count the whole fleet),
// OnStateChange is OnStateChange, and IsSuccessful is IsFailure inverted.
// Without ReadyToTrip, Threshold decides inside the store, in the same
// atomic step that counts the failure; with it, the Breaker decides on
// the counts that step returned and opens the circuit with a second,
// conditional write (see Options.ReadyToTrip). The steady closed success
// path stays write-free either way.
//
// The open period runs on the local clock only from an opening this
// Breaker saw happen (its own failure, or a notification of it). A circuit
// found open by a read may have been open for any time — a new process
// after a deploy meets circuits that opened long ago — so its next call
// asks the store for the probe slot at once; the store's TryProbe judges
// by its own clock and refuses a probe that comes too early, after which
// the Breaker asks again at most every SyncInterval. No store timestamp is
// ever compared with the local clock.
//
// # Generations
//
// Every opening starts a new generation of the circuit (its OpenedAt),
// and every closing returns it to generation 0 (closing clears OpenedAt).
// A call carries the generation it was admitted in, and the store applies
// its outcome only if the circuit is still in that generation, in the
// same atomic operation: a slow call admitted while the circuit was
// closed cannot close it once it has re-opened or while another process
// probes it, its late failure does not count against the new generation,
// and a probe's late failure does not re-open a circuit other probes have
// closed since. A probe also carries its probe slot's epoch (the store's
// ProbeEpoch when it granted the slot): once the slot has lapsed and the
// store has granted slots again, to this Breaker or another process, the
// late probe's outcome is ignored too, so only the probes holding slots
// decide the half-open circuit.
//
// # When the store is unreachable or slow
//
// Store work made while a caller waits is bounded by the Breaker's own
// budget, StoreTimeout (200 ms by default, and at most half of what is left
// of the caller's deadline): a store that stops answering costs a call at
// most that much, and counts as unreachable (Stats.StoreDown, with
// ErrStoreTimeout). Outcomes are written by a goroutine of the Breaker's
// own; the caller waits for the write only within its budget, and a write
// it stopped waiting for still lands when the store answers (Close waits
// for it). Such a write is a store failure too: its failure counts on the
// local view at once, and the store counts as unreachable until the write
// ends, whatever reads return meanwhile.
//
// While the store is unreachable the Breaker keeps working on its local
// view and counts the store errors in Stats. By default it fails open:
// calls keep running, failures are counted locally and open the circuit
// locally at Threshold, and after OpenFor the local view lets one call at
// a time through as a probe. With FailClosed every call is rejected (with
// an error matching ErrOpen that wraps the store error) until the store
// answers again. Failures counted while the store was unreachable are not
// replayed: once the store answers (and the writes it owes have ended),
// its record is the truth again. The
// Breaker logs one warning per outage to the store's logger.
package breaker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/valid"
)

// State is the state of a circuit: Closed, Open or HalfOpen.
type State = driver.CircuitState

// Counts are a circuit's fleet-wide counts, passed to
// Options.ReadyToTrip. They have gobreaker's shape (Requests,
// TotalSuccesses, TotalFailures, ConsecutiveSuccesses,
// ConsecutiveFailures, all uint32, in that order), so a gobreaker
// ReadyToTrip function can be reused through a conversion:
//
//	ReadyToTrip: func(c breaker.Counts) bool { return tripFn(gobreaker.Counts(c)) }
//
// In the closed state they count the outcomes of the current period (see
// Options.Interval); Requests is TotalSuccesses + TotalFailures (calls
// still running are not counted).
type Counts = driver.Counts

// The circuit states.
const (
	// Closed: calls run.
	Closed = driver.Closed
	// Open: calls are rejected with ErrOpen until the open period ends.
	Open = driver.Open
	// HalfOpen: one caller in the fleet probes; the others are rejected.
	HalfOpen = driver.HalfOpen
)

// Defaults of Options' zero values.
const (
	DefaultThreshold    = 5
	DefaultOpenFor      = 30 * time.Second
	DefaultSyncInterval = time.Second
	DefaultStoreTimeout = 200 * time.Millisecond
)

// writeTimeout bounds the store writes of outcomes, which run in a
// goroutine of the Breaker's own. They do not follow the caller's
// cancellation: a failure must be recorded even when the caller has given
// up (the caller waits for the write only within its store budget).
const writeTimeout = 5 * time.Second

// maxPendingWrites caps the goroutines making outcome writes; the writes
// beyond wait in a queue, in order, for one of them.
const maxPendingWrites = 64

// maxQueuedWrites caps the queued failure writes; beyond it (a store that
// answers far slower than failures come) failures are counted on the local
// view only.
const maxQueuedWrites = 4096

// maxWatchBackoff caps the pause between attempts to resubscribe to
// circuit notifications.
const maxWatchBackoff = 30 * time.Second

// ErrOpen is matched (errors.Is) by the error of every call the Breaker
// rejects without running fn. The error is an *OpenError.
var ErrOpen = errors.New("breaker: circuit open")

// ErrStoreTimeout is matched by the store error a Breaker counts when the
// store did not answer within the Breaker's budget (Options.StoreTimeout,
// and at most half of what remained of the caller's deadline). Such a
// store counts as unreachable: see Stats.StoreDown and Options.FailClosed.
// It is warden.ErrStoreTimeout, shared with cache and lock.
var ErrStoreTimeout = warden.ErrStoreTimeout

// OpenError is the error of a rejected call. It matches ErrOpen. The calls
// rejected on one view of the circuit may share one *OpenError (a
// rejection allocates nothing): treat it as read-only.
type OpenError struct {
	// Name is the circuit's name.
	Name string
	// State is the Breaker's view of the circuit when it rejected the call:
	// Open, HalfOpen (another caller probes), or Closed when the call was
	// rejected only because the store is unreachable and FailClosed is set.
	State State
	// Until is the local time from which this Breaker will next try to
	// probe the circuit; zero if unknown. It is an estimate: another
	// process may close the circuit sooner.
	Until time.Time
	// StoreErr is the store's error when the call was rejected because the
	// store is unreachable (FailClosed); nil otherwise.
	StoreErr error
}

func (e *OpenError) Error() string {
	s := "breaker: circuit " + strconv.Quote(e.Name)
	if e.StoreErr != nil {
		return s + " rejects calls: the store is unreachable and the breaker fails closed: " + e.StoreErr.Error()
	}
	if e.State == HalfOpen {
		s += " is half-open (another caller probes)"
	} else {
		s += " is open"
	}
	if !e.Until.IsZero() {
		s += "; next probe after " + e.Until.Format(time.RFC3339Nano)
	}
	return s
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// Unwrap returns the store's error, if the call was rejected for it.
func (e *OpenError) Unwrap() error { return e.StoreErr }

// Options configure a Breaker. The zero value (or nil) gives the defaults.
type Options struct {
	// Threshold is the number of consecutive failures, counted across every
	// process sharing the circuit, that opens it: the store opens the
	// circuit in the same atomic step that counts the Threshold-th failure.
	// 0: DefaultThreshold (5), unless ReadyToTrip is set; Threshold and
	// ReadyToTrip cannot both be set.
	Threshold int
	// ReadyToTrip, if set, decides instead of Threshold when the circuit
	// opens, as gobreaker's ReadyToTrip does: after every failure counted
	// in the closed state it is called with the circuit's fleet-wide Counts
	// as that failure left them, and true opens the circuit. A Go function
	// cannot run in the store, so the Breaker opens the circuit with a
	// second, conditional write (driver.Circuits.Trip) that applies only if
	// nobody changed the circuit since those counts; otherwise it decides
	// again on the newer counts. Concurrent failures anywhere in the fleet
	// are all counted, and the circuit opens once.
	//
	// The counts are exact for failures. Successes in the closed state are
	// not written one by one (the steady closed success path stays
	// write-free): each Breaker counts them locally and writes them with
	// its next write — a failure, the first success after failures, or,
	// while the circuit has failures in its period, its periodic read
	// (which then becomes a write, at most every SyncInterval). So
	// TotalSuccesses and Requests lag by the successes of other processes
	// since their last write. Successes whose write fails are not counted.
	//
	// ReadyToTrip is called from the Breaker's own goroutines and, while
	// the store is unreachable, with the Breaker's lock held, on the local
	// view's counts: it must be quick and must not call the Breaker. A
	// panic in it counts as false and is logged.
	ReadyToTrip func(counts Counts) bool
	// Interval is gobreaker's Interval: the length of the closed state's
	// counting period. A write that finds the period over (by the store's
	// clock) resets the counts (ConsecutiveFailures included) before
	// counting and starts a new period. 0: no periods; the counts reset
	// only when the circuit changes state. At least one millisecond.
	Interval time.Duration
	// OpenFor is how long an open circuit rejects calls before a probe is
	// allowed. 0: DefaultOpenFor (30 s). At least one millisecond.
	OpenFor time.Duration
	// ProbeLease is how long a prober holds the half-open probe slot: if it
	// neither succeeds nor fails within it (it died, or its call is that
	// slow), another caller may probe, and once one does, the late
	// prober's outcome no longer counts. 0: OpenFor.
	ProbeLease time.Duration
	// HalfOpenProbes is gobreaker's MaxRequests: the number of probes
	// that may run at once across the fleet while the circuit is half-open,
	// and the number of successful probes in a row that close it. Each
	// probe holds one of HalfOpenProbes slots in the shared record (a
	// probe's success frees its slot; the slots lapse ProbeLease after the
	// newest grant, so a dead prober's slot is free again then), and every
	// other call is rejected. A failed probe re-opens the circuit. 0: 1.
	HalfOpenProbes int
	// IsFailure decides which errors of fn count as failures; an error it
	// rejects counts as a success (the dependency answered). Nil: every
	// non-nil error is a failure. Either way, context.Canceled and
	// context.DeadlineExceeded returned while the caller's ctx is done are
	// neither failures nor successes: the caller gave up, the dependency
	// did not fail. A panic in fn is a failure (and is re-raised), and so
	// is a panic in IsFailure: the call is recorded as a failure, then the
	// panic goes on from Do in the caller's goroutine.
	IsFailure func(err error) bool
	// SyncInterval is the longest the Breaker trusts its local view before
	// reading the shared record again, on stores without circuit
	// notifications (and while the store is unreachable). On stores with
	// notifications the view is updated as changes happen and the record
	// is read only when the notification stream starts or lost events.
	// 0: DefaultSyncInterval (1 s).
	SyncInterval time.Duration
	// FailClosed rejects every call while the store is unreachable. The
	// default (false) fails open: calls keep running on the local view.
	FailClosed bool
	// StoreTimeout is the Breaker's own budget for each store operation it
	// makes while a caller waits: the read of the shared record, the probe
	// request, and the caller's wait for an outcome to be written. Within a
	// call the budget is also at most half of the time left before the
	// caller's deadline, so a store that stops answering never turns into
	// an outage of the caller: the operation is abandoned, counted as a
	// store failure (matching ErrStoreTimeout; Stats.StoreDown), and the
	// call goes on by the FailClosed policy. An outcome write the caller
	// stopped waiting for is not abandoned: it goes on in the background
	// (for up to 5 s), its result updates the local view, and Close waits
	// for it. 0: DefaultStoreTimeout (200 ms).
	StoreTimeout time.Duration
	// OnStateChange, if set, is called after the Breaker's view of the
	// circuit changes state, whoever caused the change (this Breaker,
	// another process, an operator). The Breaker starts from Closed, so a
	// Breaker that first finds its circuit open reports Closed → Open.
	// Calls are made one at a time, in order, without any lock held, from
	// whichever goroutine observed the change; the function should be
	// quick and must not call Close. A panic in it is logged (to the
	// store's logger) and goes no further.
	OnStateChange func(name string, from, to State)
	// Observe, if set, is told of every call the Breaker admits or
	// rejects and of every change of its view's state (see Observation),
	// for telemetry: otelwarden.Telemetry.Breaker is one. Calls and
	// rejections are reported on the caller's goroutine with its context,
	// after the fact; state changes as OnStateChange is called (in
	// order, one at a time, from whichever goroutine observed the change)
	// with context.Background(). No lock of the Breaker is held. It must
	// be quick, safe for concurrent use, and must not call the Breaker; a
	// panic in a state change's report is logged like OnStateChange's.
	// Nil: nothing is observed, at no cost.
	Observe func(ctx context.Context, o Observation)
	// Owner identifies this Breaker as prober in the shared record. A
	// random suffix per Breaker and a number per probe are added, so two
	// Breakers never share a probe slot even with the same Owner. "":
	// host:pid.
	Owner string
}

// Stats are a Breaker's counters since New, and its current view.
type Stats struct {
	// State is the Breaker's local view of the circuit.
	State State
	// Failures is the consecutive failure count of the local view
	// (including failures that could not be recorded in the store).
	Failures int64
	// Calls is the number of times fn ran.
	Calls int64
	// Successes, CallFailures and Ignored classify the calls that ran:
	// Ignored calls ended because the caller's ctx did.
	Successes, CallFailures, Ignored int64
	// Rejections is the number of calls rejected with ErrOpen.
	Rejections int64
	// Probes is the number of probe slots this Breaker was granted.
	Probes int64
	// StoreErrors is the number of failed store operations.
	StoreErrors int64
	// StoreDown reports whether the last store operation failed; the
	// Breaker then works on its local view.
	StoreDown bool
	// LastStoreError is the most recent store error; nil if none.
	LastStoreError error
}

// Breaker is one circuit breaker, identified by its name in a store's
// namespace. Breakers with the same name on stores that share a database
// and namespace share the circuit. A Breaker is safe for concurrent use.
// Call Close when done with it to stop its notification subscription.
type Breaker struct {
	st          *warden.Store
	circ        *warden.Circuits
	log         *slog.Logger
	name        string
	owner       string
	threshold   int
	readyToTrip func(Counts) bool
	interval    time.Duration
	openFor     time.Duration
	probeLease  time.Duration
	probes      int
	syncEvery   time.Duration
	isFailure   func(error) bool
	failClosed  bool
	onChange    func(string, State, State)
	observe     func(context.Context, Observation)
	canWatch    bool
	storeTime   time.Duration

	probeSeq atomic.Uint64
	snap     atomic.Pointer[snapshot] // the local view's verdict (fastpath.go)

	calls, successes, failures, ignored  atomic.Int64
	rejections, probesGranted, storeErrs atomic.Int64

	mu        sync.Mutex
	rec       driver.CircuitRecord // last record applied from the store
	seq       uint64               // increases with every record applied
	state     State                // the local view
	fails     int64                // the view's consecutive failures
	nextProbe time.Time            // local time from which to try a probe
	lastSync  time.Time            // when the last read began
	syncing   bool                 // a read is in flight
	resyncing bool                 // the next call must read the record
	watching  bool                 // a notification stream is live
	storeDown bool
	storeErr  error
	probing   int    // probes of this Breaker running
	chain     string // a probe slot id an inconclusive probe left to reuse
	localFail int64  // failures of the local view not in the last record
	// pendingFail counts the failures of localFail whose writes are in
	// flight (late writes): the store will apply them, so a record that
	// does not have them yet must not erase them.
	pendingFail int64
	unflushed   int64 // closed-state successes not yet written (ReadyToTrip)

	writers  int           // outcome writes in flight, queued ones included
	runners  int           // goroutines making outcome writes
	queue    []*outWrite   // writes waiting for a runner, in issue order
	drained  chan struct{} // closed when writers drops to 0
	inflight []*outWrite   // outcome writes in flight, in the order issued
	late     int           // writes of inflight that outlasted their caller's budget

	started bool // the watcher was started
	closed  bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	pending    []transition // OnStateChange calls not yet made
	delivering bool         // a goroutine is making OnStateChange calls
}

type transition struct{ from, to State }

// New returns the Breaker for circuit name on st. It does no I/O. The
// error wraps warden.ErrInvalidKey for a bad name or owner and
// warden.ErrInvalidArgument for a nil store or a bad option (a negative
// count, a duration that is negative or under one millisecond).
func New(st *warden.Store, name string, opts *Options) (*Breaker, error) {
	if st == nil {
		return nil, valid.Nil("breaker", "store")
	}
	if err := warden.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("breaker: name: %w", err)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("breaker %q: %w: "+format, append([]any{name, warden.ErrInvalidArgument}, args...)...)
	}
	switch {
	case o.Threshold < 0:
		return nil, bad("negative threshold %d", o.Threshold)
	case o.Threshold > 0 && o.ReadyToTrip != nil:
		return nil, bad("Threshold %d and ReadyToTrip both set (ReadyToTrip decides alone; express the threshold in it)", o.Threshold)
	case o.HalfOpenProbes < 0:
		return nil, bad("negative HalfOpenProbes %d", o.HalfOpenProbes)
	}
	if err := valid.Durations(fmt.Sprintf("breaker %q", name), valid.D{Name: "Interval", V: o.Interval},
		valid.D{Name: "OpenFor", V: o.OpenFor}, valid.D{Name: "ProbeLease", V: o.ProbeLease},
		valid.D{Name: "SyncInterval", V: o.SyncInterval}, valid.D{Name: "StoreTimeout", V: o.StoreTimeout}); err != nil {
		return nil, err
	}
	if o.Threshold == 0 && o.ReadyToTrip == nil {
		o.Threshold = DefaultThreshold
	}
	if o.OpenFor == 0 {
		o.OpenFor = DefaultOpenFor
	}
	if o.ProbeLease == 0 {
		o.ProbeLease = o.OpenFor
	}
	if o.HalfOpenProbes == 0 {
		o.HalfOpenProbes = 1
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.StoreTimeout == 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.Owner == "" {
		o.Owner = defaultOwner()
	}
	o.Owner += "#" + randomHex()
	// Probe owners are Owner#random.n: check the longest one now.
	if err := warden.ValidateKey(o.Owner + ".18446744073709551615"); err != nil {
		return nil, fmt.Errorf("breaker %q: owner: %w", name, err)
	}
	circ := st.Circuits()
	b := &Breaker{
		st:          st,
		circ:        circ,
		log:         st.Logger(),
		name:        name,
		owner:       o.Owner,
		threshold:   o.Threshold,
		readyToTrip: o.ReadyToTrip,
		interval:    o.Interval,
		openFor:     o.OpenFor,
		probeLease:  o.ProbeLease,
		probes:      o.HalfOpenProbes,
		syncEvery:   o.SyncInterval,
		isFailure:   o.IsFailure,
		failClosed:  o.FailClosed,
		onChange:    o.OnStateChange,
		observe:     o.Observe,
		canWatch:    circ.CanWatch(),
		storeTime:   o.StoreTimeout,
		state:       Closed,
		rec:         driver.CircuitRecord{Name: name, State: Closed},
	}
	return b, nil
}

// defaultOwner is host:pid.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Name returns the circuit's name.
func (b *Breaker) Name() string { return b.name }

// Do runs fn if the circuit admits the call and records its outcome. A
// rejected call returns an error matching ErrOpen without running fn;
// otherwise Do returns fn's error. If ctx is already done, Do returns
// ctx.Err() without running fn. A nil fn is an error matching
// warden.ErrInvalidArgument.
func (b *Breaker) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if fn == nil {
		return valid.Nil("breaker", "function")
	}
	_, err := Call(ctx, b, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, fn(ctx)
	})
	return err
}

// Call is Do for functions that return a value: it runs fn if b admits the
// call and returns fn's results; a rejected call returns the zero T and an
// error matching ErrOpen.
func Call[T any](ctx context.Context, b *Breaker, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	switch {
	case b == nil:
		return zero, valid.Nil("breaker", "Breaker")
	case fn == nil:
		return zero, valid.Nil("breaker", "function")
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	t, err := b.admit(ctx)
	if err != nil {
		if b.observe != nil {
			b.observeRejection(ctx, err)
		}
		return zero, err
	}
	b.calls.Add(1)
	var start time.Time
	var ran time.Duration
	if b.observe != nil {
		start = time.Now()
	}
	returned := false
	defer func() {
		if !returned { // fn panicked: a failure; the panic goes on
			if b.observe != nil && ran == 0 {
				ran = time.Since(start)
			}
			b.finish(ctx, t, outcomeFailure)
			if b.observe != nil {
				b.observeCall(ctx, t, outcomeFailure, ran, nil)
			}
		}
	}()
	v, err := fn(ctx)
	if b.observe != nil {
		ran = time.Since(start)
	}
	// classify runs IsFailure: a panic in it is also a failure (the
	// deferred finish records it), and the panic goes on from Call.
	out := b.classify(ctx, err)
	returned = true
	b.finish(ctx, t, out)
	if b.observe != nil {
		b.observeCall(ctx, t, out, ran, err)
	}
	return v, err
}

// State reads the shared record from the store, updates the local view
// and returns the circuit's state. If the store cannot be read, it returns
// the local view's state with the error.
func (b *Breaker) State(ctx context.Context) (State, error) {
	b.startWatch()
	err := b.read(ctx)
	b.mu.Lock()
	defer b.unlockMu()
	return b.state, err
}

// read reads the shared record and applies it to the local view. It
// returns ctx's error or the store's (counted).
func (b *Breaker) read(ctx context.Context) error {
	b.mu.Lock()
	start := b.seq
	b.unlockMu()
	sctx, cancel := b.storeCtx(ctx)
	rec, _, err := b.circ.Get(sctx, b.name)
	cancel()
	b.mu.Lock()
	defer b.unlock()
	if err != nil {
		if cerr := ctxErr(ctx, err); cerr != nil {
			return cerr
		}
		err = b.storeErrLocked(sctx, err)
		b.storeFailedLocked(err)
		return err
	}
	b.storeOKLocked()
	b.applyLocked(rec, start, fromRead)
	return nil
}

// storeCtx returns the context of a store operation made while a caller
// waits: ctx bounded by the Breaker's budget, at most half of the time ctx
// has left.
func (b *Breaker) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := b.storeTime
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/2)
	}
	return context.WithTimeout(ctx, d)
}

// storeErrLocked returns the store error to count for err, an error of an
// operation run on sctx (from storeCtx) that the caller did not cause: a
// budget that ran out becomes ErrStoreTimeout.
func (b *Breaker) storeErrLocked(sctx context.Context, err error) error {
	if sctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return fmt.Errorf("%w: circuit %q: %v", ErrStoreTimeout, b.name, sctx.Err())
	}
	return err
}

// Stats returns the Breaker's counters and local view. It does no I/O.
func (b *Breaker) Stats() Stats {
	b.mu.Lock()
	defer b.unlockMu()
	return Stats{
		State:          b.state,
		Failures:       b.fails,
		Calls:          b.calls.Load(),
		Successes:      b.successes.Load(),
		CallFailures:   b.failures.Load(),
		Ignored:        b.ignored.Load(),
		Rejections:     b.rejections.Load(),
		Probes:         b.probesGranted.Load(),
		StoreErrors:    b.storeErrs.Load(),
		StoreDown:      b.storeDown,
		LastStoreError: b.storeErr,
	}
}

// Close stops the Breaker's notification subscription and waits for its
// goroutine, and for the outcome writes still in flight, to end. The Breaker stays usable afterwards; it then reads the
// shared record every SyncInterval instead. Close is idempotent and always
// returns nil.
func (b *Breaker) Close() error {
	b.mu.Lock()
	b.closed = true
	cancel := b.cancel
	b.unlockMu()
	if cancel != nil {
		cancel()
	}
	b.wg.Wait()
	_ = b.Flush(context.Background())
	return nil
}

// Flush waits until the outcome writes in flight — those whose callers
// stopped waiting for them after their store budget — have ended (landed
// in the store or failed), or until ctx ends, and returns ctx's error in
// that case. A call's outcome is in the store once Flush returns nil
// (unless the store failed it; see Stats). Close flushes too.
func (b *Breaker) Flush(ctx context.Context) error {
	b.mu.Lock()
	if b.writers == 0 {
		b.unlockMu()
		return nil
	}
	ch := b.drained
	b.unlockMu()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---------------------------------------------------------------------------
// admission

type ticketKind int

const (
	normalCall ticketKind = iota // closed circuit
	probeCall                    // the store granted this Breaker the probe slot
	localProbe                   // the store is unreachable; the local view probes
)

// ticket is an admitted call: its kind, and the generation of the circuit
// it was admitted in (the record's OpenedAt as driver.Generation counts
// it) and, for a probe, the probe epoch of its slot, which its outcome
// carries to the store: the store ignores it once the slot is no longer
// granted (it lapsed and was granted again).
type ticket struct {
	kind  ticketKind
	gen   int64
	epoch int64  // probeCall: the granted record's ProbeEpoch
	id    string // probeCall: the probe slot's owner id
}

type outcome int

const (
	outcomeSuccess outcome = iota
	outcomeFailure
	outcomeIgnored
)

func (b *Breaker) classify(ctx context.Context, err error) outcome {
	switch {
	case err == nil:
		return outcomeSuccess
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return outcomeIgnored
	case b.isFailure != nil && !b.isFailure(err):
		return outcomeSuccess
	}
	return outcomeFailure
}

// admit decides whether a call may run: the returned error is ErrOpen's
// or ctx's.
func (b *Breaker) admit(ctx context.Context) (ticket, error) {
	if t, ok, err := b.fastAdmit(); ok {
		return t, err
	}
	b.startWatch()
	if err := b.maybeSync(ctx); err != nil {
		return ticket{}, err
	}
	b.mu.Lock()
	now := time.Now()
	if b.failClosed && b.storeDown {
		err := b.rejectLocked(now)
		b.unlock()
		return ticket{}, err
	}
	if b.state == Closed {
		gen := b.rec.Generation()
		b.unlockMu()
		return ticket{kind: normalCall, gen: gen}, nil
	}
	// Open or half-open: only a probe may run, one at a time per Breaker.
	if b.probing >= b.probes || (b.chain == "" && now.Before(b.nextProbe)) {
		err := b.rejectLocked(now)
		b.unlock()
		return ticket{}, err
	}
	if b.storeDown {
		// Fail open on the local view, whose open period has passed: this
		// call is a local probe. (The periodic read finds out when the
		// store answers again.)
		b.probing++
		b.unlockMu()
		return ticket{kind: localProbe}, nil
	}
	id := b.chain
	b.chain = ""
	if id == "" {
		id = b.owner + "." + strconv.FormatUint(b.probeSeq.Add(1), 10)
	}
	b.probing++
	start := b.seq
	b.unlockMu()

	sctx, cancel := b.storeCtx(ctx)
	rec, granted, err := b.circ.TryProbes(sctx, b.name, id, b.openFor, b.probeLease, b.probes)
	cancel()

	b.mu.Lock()
	defer b.unlock()
	now = time.Now()
	if err != nil {
		b.probing--
		if cerr := ctxErr(ctx, err); cerr != nil {
			// The slot may have been granted: keep the id so that the
			// next call renews it instead of waiting for it to lapse.
			b.chain = id
			return ticket{}, cerr
		}
		b.storeFailedLocked(b.storeErrLocked(sctx, err))
		b.chain = id
		if b.failClosed {
			return ticket{}, b.rejectLocked(now)
		}
		b.probing++
		return ticket{kind: localProbe}, nil
	}
	b.storeOKLocked()
	b.applyLocked(rec, start, fromRead)
	if granted {
		b.probesGranted.Add(1)
		return ticket{kind: probeCall, gen: rec.Generation(), epoch: rec.ProbeEpoch, id: id}, nil
	}
	b.probing--
	if b.state == Closed {
		return ticket{kind: normalCall, gen: b.rec.Generation()}, nil
	}
	if !b.nextProbe.After(now) {
		// The store says not yet although the local estimate had passed:
		// try again after a short pause rather than on every call.
		b.nextProbe = now.Add(min(b.syncEvery, b.openFor))
	}
	return ticket{}, b.rejectLocked(now)
}

// rejectLocked counts and returns a rejection; b.mu is held.
func (b *Breaker) rejectLocked(now time.Time) error {
	b.rejections.Add(1)
	e := &OpenError{Name: b.name, State: b.state}
	if b.nextProbe.After(now) && b.state != Closed {
		e.Until = b.nextProbe
	}
	if b.failClosed && b.storeDown {
		e.StoreErr = b.storeErr
	}
	return e
}

// finish records a call's outcome.
func (b *Breaker) finish(ctx context.Context, t ticket, out outcome) {
	switch out {
	case outcomeIgnored:
		b.ignored.Add(1)
		if t.kind != normalCall {
			// An inconclusive probe: its slot stays ours (b.chain), so the
			// next call may probe at once.
			b.mu.Lock()
			b.probing--
			if t.kind == probeCall {
				b.chain = t.id
			}
			b.unlockMu()
		}
	case outcomeSuccess:
		b.successes.Add(1)
		if t.kind == normalCall && b.quietSuccess() {
			return // nothing to write (see succeeded)
		}
		b.succeeded(ctx, t)
	case outcomeFailure:
		b.failures.Add(1)
		b.failed(ctx, t)
	}
}

func (b *Breaker) succeeded(ctx context.Context, t ticket) {
	b.mu.Lock()
	switch t.kind {
	case normalCall:
		// Write only the first success after failures — failures of the
		// view or failure writes still in flight, which the store will
		// count before this success (see write) — unless the last write
		// issued is a success already; with ReadyToTrip the others are
		// counted with the next write.
		failing := b.failWritesLocked()
		last := len(b.inflight) > 0 && b.inflight[len(b.inflight)-1].success
		if b.state != Closed || last || b.fails == 0 && !failing {
			if b.readyToTrip != nil && b.state == Closed {
				b.unflushed++
			}
			b.unlockMu()
			return
		}
		if !failing && b.storeDown {
			b.forgetFailuresLocked()
			b.unlockMu()
			return
		}
	case localProbe:
		b.probing--
		b.chain = ""
		b.fails = 0
		b.setStateLocked(Closed)
		b.unlock()
		return
	}
	o := b.outcomeLocked(driver.OutcomeSuccess, t)
	start := b.seq
	w := b.issueLocked(ctx, true, func(wctx context.Context) (driver.CircuitRecord, error) {
		return b.circ.RecordOutcome(wctx, b.name, o)
	}, func(wctx context.Context, rec driver.CircuitRecord, err error, w *outWrite) {
		if t.kind != normalCall {
			b.probing--
		}
		if err != nil {
			b.storeFailedLocked(b.storeErrLocked(wctx, err))
			// The local view closes (or stays closed) and forgets failures.
			b.forgetFailuresLocked()
			b.setStateLocked(Closed)
			return
		}
		b.storeOKLocked()
		b.applyLocked(rec, start, fromWrite)
	})
	b.unlockMu()
	b.await(ctx, w, func(w *outWrite) {
		if t.kind == normalCall {
			b.forgetFailuresLocked()
		}
	})
}

func (b *Breaker) failed(ctx context.Context, t ticket) {
	b.mu.Lock()
	switch t.kind {
	case normalCall:
		if b.state != Closed {
			// A late failure of a call admitted before the circuit
			// opened: nothing new to record.
			b.unlockMu()
			return
		}
		if b.storeDown || len(b.queue) >= maxQueuedWrites {
			b.countLocallyLocked()
			b.unlock()
			return
		}
	case localProbe:
		b.probing--
		b.openLocallyLocked(time.Now())
		b.unlock()
		return
	}
	o := b.outcomeLocked(driver.OutcomeFailure, t)
	start := b.seq
	w := b.issueLocked(ctx, false, func(wctx context.Context) (driver.CircuitRecord, error) {
		rec, err := b.circ.RecordOutcome(wctx, b.name, o)
		if err != nil || b.readyToTrip == nil || t.kind != normalCall {
			return rec, err
		}
		return b.tripIfReady(wctx, rec, t.gen)
	}, func(wctx context.Context, rec driver.CircuitRecord, err error, w *outWrite) {
		if t.kind == probeCall {
			b.probing--
		}
		if err != nil {
			b.storeFailedLocked(b.storeErrLocked(wctx, err))
			if t.kind == probeCall {
				b.openLocallyLocked(time.Now())
				return
			}
			if !w.late { // a late failure was counted when it became late
				b.countLocallyLocked()
			}
			return
		}
		b.storeOKLocked()
		b.applyLocked(rec, start, fromWrite)
	})
	b.unlockMu()
	b.await(ctx, w, func(w *outWrite) {
		if t.kind == normalCall && b.state == Closed {
			// Counted now, so that the policy applies to it; the store
			// will have it too once the write lands.
			w.counted = true
			b.pendingFail++
			b.countLocallyLocked()
		}
	})
}

// issueLocked issues an outcome write, of a success or a failure; b.mu is
// held. op runs in a goroutine of the Breaker's own on a context that
// ignores the caller's cancellation and is bounded by writeTimeout (from
// now), then after applies its result with b.mu held. At most
// maxPendingWrites goroutines write at once; the writes beyond wait in
// order for one of them (none is dropped). Close waits for them all.
//
// Writes of successes and of failures reach the store in the order they
// were issued: a write waits for those of the other kind issued before it,
// so that the store's consecutive counts follow the calls' order. Writes
// of one kind commute and run at once.
func (b *Breaker) issueLocked(ctx context.Context, success bool, op func(wctx context.Context) (driver.CircuitRecord, error), after func(wctx context.Context, rec driver.CircuitRecord, err error, w *outWrite)) *outWrite {
	w := &outWrite{done: make(chan struct{}), success: success}
	var deps []chan struct{}
	for _, p := range b.inflight {
		if p.success != success {
			deps = append(deps, p.done)
		}
	}
	if b.writers == 0 {
		b.drained = make(chan struct{})
	}
	b.writers++
	b.inflight = append(b.inflight, w)
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	w.run = func() {
		defer wcancel()
		for _, d := range deps {
			select {
			case <-d:
			case <-wctx.Done(): // op fails at once on wctx
			}
		}
		rec, err := op(wctx)
		b.mu.Lock()
		w.ended = true
		if w.late {
			b.late--
		}
		if w.counted {
			// Landed, the failure is in rec; failed, it stays counted
			// locally only, like any failure the store could not record.
			w.counted = false
			b.pendingFail--
			if err == nil {
				b.localFail--
			}
		}
		after(wctx, rec, err, w)
		for i, p := range b.inflight {
			if p == w {
				b.inflight = append(b.inflight[:i], b.inflight[i+1:]...)
				break
			}
		}
		b.writers--
		// Those waiting for the write see its result on the fast paths
		// too (they need not take b.mu).
		b.publishLocked()
		if b.writers == 0 {
			close(b.drained)
		}
		close(w.done)
		b.unlock()
	}
	if b.runners < maxPendingWrites {
		b.runners++
		go b.runWrites(w)
	} else {
		b.queue = append(b.queue, w)
	}
	return w
}

// runWrites runs w, then the queued writes, until none is left. The
// queue is in issue order, so the writes a queued one must follow have
// started before it.
func (b *Breaker) runWrites(w *outWrite) {
	for w != nil {
		w.run()
		b.mu.Lock()
		w = nil
		if len(b.queue) > 0 {
			w = b.queue[0]
			b.queue[0] = nil
			b.queue = b.queue[1:]
		} else {
			b.runners--
		}
		b.unlockMu()
	}
}

// await waits for the write w within the caller's store budget
// (storeCtx): a store that does not answer delays the caller by that much
// at most, and the write goes on.
//
// A write that outlasts the caller's budget (and not because the caller
// gave up) is a store failure: the store counts as down until every such
// write has ended, and late, if set, updates the local view at once
// (with b.mu held), as if the write had failed; the write's after is then
// told (by w.late) that it did.
func (b *Breaker) await(ctx context.Context, w *outWrite, late func(w *outWrite)) {
	wait, cancel := b.storeCtx(ctx)
	defer cancel()
	select {
	case <-w.done:
	case <-wait.Done():
		b.mu.Lock()
		if !w.ended && ctx.Err() == nil {
			w.late = true
			b.late++
			b.storeFailedLocked(b.storeErrLocked(wait, context.DeadlineExceeded))
			if late != nil {
				late(w)
			}
		}
		b.unlock()
	}
}

// failWritesLocked reports whether failure writes are in flight; b.mu is
// held.
func (b *Breaker) failWritesLocked() bool {
	for _, w := range b.inflight {
		if !w.success {
			return true
		}
	}
	return false
}

// outWrite is an outcome write in flight; its fields but done, success
// and run are guarded by b.mu.
type outWrite struct {
	done    chan struct{} // closed when it has ended and its result is applied
	success bool          // a success's write, not a failure's
	run     func()        // makes the write and applies its result
	ended   bool          // its result is being or has been applied
	late    bool          // it outlasted its caller's budget
	counted bool          // its failure is counted in pendingFail
}

// forgetFailuresLocked resets the local view's consecutive failures, those
// whose writes are in flight included; b.mu is held.
func (b *Breaker) forgetFailuresLocked() {
	b.fails, b.localFail, b.pendingFail = 0, 0, 0
	for _, w := range b.inflight {
		w.counted = false
	}
}

// countLocallyLocked counts a failure the store could not record; b.mu is
// held.
func (b *Breaker) countLocallyLocked() {
	b.fails++
	b.localFail++
	if b.state == Closed && b.tripsLocallyLocked() {
		b.openLocallyLocked(time.Now())
	}
}

// tripsLocallyLocked reports whether the local view's counts open the
// circuit; b.mu is held.
func (b *Breaker) tripsLocallyLocked() bool {
	if b.readyToTrip == nil {
		return b.fails >= int64(b.threshold)
	}
	return b.ready(b.localCountsLocked())
}

// localCountsLocked returns the counts of the last record with the
// failures counted locally since, and the successes not yet written;
// b.mu is held.
func (b *Breaker) localCountsLocked() Counts {
	r := b.rec
	r.TotalFailures += b.localFail
	r.Successes += b.unflushed
	r.Failures = b.fails
	return r.Counts()
}

// outcomeLocked returns the outcome to write for a call of ticket t, with
// the closed-state successes not yet written; b.mu is held.
func (b *Breaker) outcomeLocked(kind driver.OutcomeKind, t ticket) driver.Outcome {
	o := driver.Outcome{Kind: kind, Gen: t.gen, ProbeEpoch: t.epoch, CloseAfter: b.probes, Interval: b.interval}
	if kind == driver.OutcomeFailure && b.readyToTrip == nil {
		o.Threshold = b.threshold
	}
	if t.kind == normalCall {
		o.Successes, b.unflushed = b.unflushed, 0
	}
	return o
}

// tripIfReady opens the circuit with Trip if ReadyToTrip says so on the
// counts of rec, the record the failure of generation gen returned: Trip
// applies only if the circuit is still at rec's version, and on a newer
// version the decision is made again on its counts.
func (b *Breaker) tripIfReady(ctx context.Context, rec driver.CircuitRecord, gen int64) (driver.CircuitRecord, error) {
	if rec.Generation() != gen {
		return rec, nil // the failure was not counted: its generation is over
	}
	for range maxTripAttempts {
		if rec.State != Closed || !b.ready(rec.Counts()) {
			return rec, nil
		}
		next, tripped, err := b.circ.Trip(ctx, b.name, rec.Version)
		if err != nil || tripped {
			return next, err
		}
		rec = next
	}
	return rec, nil
}

// maxTripAttempts bounds the Trips of one failure: each one that does not
// apply means another process changed the circuit, and decides again.
const maxTripAttempts = 16

// ready calls ReadyToTrip; a panic in it counts as false and is logged.
func (b *Breaker) ready(c Counts) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("breaker: ReadyToTrip panicked", "circuit", b.name, "panic", r)
			ok = false
		}
	}()
	return b.readyToTrip(c)
}

// openLocallyLocked opens the local view without the store; b.mu is held.
func (b *Breaker) openLocallyLocked(now time.Time) {
	b.chain = ""
	b.nextProbe = now.Add(b.openFor)
	b.setStateLocked(Open)
}

// ---------------------------------------------------------------------------
// the local view

// source says where a record applied to the local view comes from.
type source int

const (
	fromRead   source = iota // a read or a probe request
	fromWrite                // an outcome this Breaker wrote
	fromNotify               // a notification of a change
)

// applyLocked makes rec, read from the store or returned by a write, the
// local view, unless it is older than the view; b.mu is held. start is
// b.seq when the operation that returned rec began: a record with a lower
// version than the view's is accepted only from an operation that began
// after the view was last updated (the circuit was deleted and recreated).
// A notification with version 0 is a deletion.
//
// The open period (and a probe slot's lease) runs on the local clock only
// from a change this Breaker saw happen: its own write or a notification
// of the change that opened the circuit (or granted the slot). A record
// found by a read may have been open for any time: the next call asks the
// store for the probe at once, and the store's TryProbe judges by its own
// clock (refusing a probe that is too early, after which the Breaker asks
// again at most every SyncInterval). No store timestamp is ever compared
// with the local clock, and the age of an opening is never guessed from
// the record.
func (b *Breaker) applyLocked(rec driver.CircuitRecord, start uint64, src source) {
	notified := src == fromNotify
	if rec.Version < b.rec.Version {
		if notified && rec.Version != 0 || !notified && start != b.seq {
			return
		}
	}
	if rec.Name == "" {
		rec.Name = b.name
	}
	if !rec.State.Valid() {
		rec.State = Closed
	}
	prev, prevState := b.rec, b.state
	b.rec = rec
	b.seq++
	// Failures counted locally that rec lacks are kept while their writes
	// are in flight, and all of them while the store still owes late
	// writes (it has not answered yet); otherwise the record is the truth.
	keep := b.pendingFail
	if b.late > 0 {
		keep = b.localFail
	}
	b.localFail = keep
	b.fails = rec.Failures + keep
	now := time.Now()
	switch rec.State {
	case Open:
		if prevState != Open || prev.State != Open || !prev.OpenedAt.Equal(rec.OpenedAt) {
			if src != fromRead && rec.UpdatedAt.Equal(rec.OpenedAt) {
				// This change is the opening: the open period starts now.
				b.nextProbe = now.Add(b.openFor)
			} else {
				// Open for an unknown time: the store judges.
				b.nextProbe = now
			}
		}
	case HalfOpen:
		if prevState != HalfOpen || prev.ProbeOwner != rec.ProbeOwner || !prev.ProbeUntil.Equal(rec.ProbeUntil) || prev.Probes != rec.Probes {
			if src != fromRead && rec.Probes >= int64(b.probes) {
				// The slot was granted at UpdatedAt and lapses at ProbeUntil.
				b.nextProbe = now.Add(max(rec.ProbeUntil.Sub(rec.UpdatedAt), 0))
			} else {
				b.nextProbe = now
			}
		}
	}
	if rec.State != HalfOpen || rec.ProbeOwner != b.chain {
		b.chain = ""
	}
	if rec.State == Closed && keep > 0 && b.tripsLocallyLocked() {
		if b.state != Open {
			b.openLocallyLocked(now)
		}
		return
	}
	b.setStateLocked(rec.State)
}

// setStateLocked changes the local view's state and queues the
// OnStateChange call; b.mu is held.
func (b *Breaker) setStateLocked(to State) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if b.onChange != nil || b.observe != nil {
		b.pending = append(b.pending, transition{from, to})
	}
}

// unlock releases b.mu and then makes the queued OnStateChange (and
// Observe) calls,
// unless another goroutine is already making them (it will make these
// too). Calls are thus made in order, one at a time, without b.mu held.
func (b *Breaker) unlock() {
	if b.delivering || len(b.pending) == 0 {
		b.unlockMu()
		return
	}
	b.delivering = true
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.unlockMu()
		for _, tr := range batch {
			b.stateChanged(tr)
		}
		b.mu.Lock()
	}
	b.delivering = false
	b.unlockMu()
}

// stateChanged calls OnStateChange; a panic in it is logged and goes no
// further. The call may be made from a goroutine of the Breaker's own (an
// outcome write, the notification watcher), where a panic would end the
// process, or from a caller's in the middle of the Breaker's bookkeeping
// (a probe slot just granted), which a panic would leave unfinished.
func (b *Breaker) stateChanged(tr transition) {
	if b.onChange != nil {
		b.contain("OnStateChange", tr, func() { b.onChange(b.name, tr.from, tr.to) })
	}
	if b.observe != nil {
		b.contain("Observe", tr, func() {
			b.observe(context.Background(), Observation{Kind: ObservedStateChange, Circuit: b.name, From: tr.from, To: tr.to})
		})
	}
}

// contain calls f, logging a panic in it (a callback named what, told of
// tr) instead of letting it go further.
func (b *Breaker) contain(what string, tr transition, f func()) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("breaker: "+what+" panicked", "circuit", b.name, "from", string(tr.from), "to", string(tr.to), "panic", r)
		}
	}()
	f()
}

func (b *Breaker) storeFailedLocked(err error) {
	b.storeErrs.Add(1)
	if !b.storeDown {
		mode := "failing open on its local view"
		if b.failClosed {
			mode = "failing closed"
		}
		b.log.Warn("breaker: store unreachable, "+mode, "circuit", b.name, "err", err)
	}
	b.storeDown = true
	b.storeErr = err
}

func (b *Breaker) storeOKLocked() {
	if b.late > 0 {
		return // the store still owes writes
	}
	if b.storeDown {
		b.log.Info("breaker: store reachable again", "circuit", b.name)
	}
	b.storeDown = false
}

// maybeSync reads the shared record if the local view is due for it. Only
// a ctx error is returned; a store error is counted and the local view
// kept.
func (b *Breaker) maybeSync(ctx context.Context) error {
	b.mu.Lock()
	now := time.Now()
	due := b.resyncing || b.lastSync.IsZero() ||
		((!b.watching || b.storeDown) && now.Sub(b.lastSync) >= b.syncEvery)
	if !due || b.syncing {
		b.unlockMu()
		return nil
	}
	prevSync, prevResync := b.lastSync, b.resyncing
	b.syncing, b.resyncing, b.lastSync = true, false, now
	start := b.seq
	// While the circuit has failures in its period, the successes not yet
	// written matter to ReadyToTrip elsewhere in the fleet: the read
	// writes them (and returns the record as a read does).
	var flush driver.Outcome
	if b.unflushed > 0 && b.state == Closed && !b.storeDown && (b.rec.TotalFailures > 0 || b.rec.Failures > 0) {
		flush = driver.Outcome{Kind: driver.OutcomeNone, Gen: b.rec.Generation(), Successes: b.unflushed, Interval: b.interval}
		b.unflushed = 0
	}
	b.unlockMu()

	sctx, cancel := b.storeCtx(ctx)
	var rec driver.CircuitRecord
	var err error
	if flush.Successes > 0 {
		rec, err = b.circ.RecordOutcome(sctx, b.name, flush)
	} else {
		rec, _, err = b.circ.Get(sctx, b.name)
	}
	cancel()

	b.mu.Lock()
	defer b.unlock()
	b.syncing = false
	if err != nil {
		if cerr := ctxErr(ctx, err); cerr != nil {
			b.lastSync, b.resyncing = prevSync, prevResync || b.resyncing
			return cerr
		}
		b.storeFailedLocked(b.storeErrLocked(sctx, err))
		return nil
	}
	b.storeOKLocked()
	b.applyLocked(rec, start, fromRead)
	return nil
}

// startWatch starts the notification subscription once, if the store has
// notifications.
func (b *Breaker) startWatch() {
	if !b.canWatch {
		return
	}
	b.mu.Lock()
	defer b.unlockMu()
	if b.started || b.closed {
		return
	}
	b.started = true
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Add(1)
	go b.watch(ctx)
}

// watch applies circuit notifications to the local view until ctx ends
// (Close) or the store closes, resubscribing with back-off when the
// stream breaks.
func (b *Breaker) watch(ctx context.Context) {
	defer b.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		ch, err := b.circ.Watch(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, warden.ErrClosed) || errors.Is(err, errors.ErrUnsupported) {
				return
			}
			b.log.Warn("breaker: cannot subscribe to circuit notifications; reading the record every SyncInterval", "circuit", b.name, "err", err)
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, maxWatchBackoff)
			continue
		}
		backoff = 100 * time.Millisecond
		b.mu.Lock()
		b.watching = true
		b.unlockMu()
		// Changes made before the subscription began were not delivered:
		// read the record now.
		b.resync(ctx)
		for rec := range ch {
			switch rec.Name {
			case "": // events were lost
				b.resync(ctx)
			case b.name:
				b.mu.Lock()
				b.applyLocked(rec, 0, fromNotify)
				b.unlock()
			}
		}
		b.mu.Lock()
		b.watching = false
		b.resyncing = true
		b.unlockMu()
		if ctx.Err() != nil || b.st.Closed() {
			return
		}
		if !sleep(ctx, backoff) {
			return
		}
	}
}

// resync reads the record for the watcher; if that fails, the next call
// reads it instead.
func (b *Breaker) resync(ctx context.Context) {
	if err := b.read(ctx); err != nil {
		b.mu.Lock()
		b.resyncing = true
		b.unlockMu()
	}
}

// sleep waits for d or ctx; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// ctxErr returns ctx's error if err was caused by ctx ending.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, cerr)) {
		return cerr
	}
	return nil
}
