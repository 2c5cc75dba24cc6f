package recordlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/owner"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrLocked: the record is locked by another holder. The error is a
	// *LockedError naming the holder and until when.
	ErrLocked = errors.New("recordlock: record is locked")
	// ErrNotFound: no record has the id. Nothing was written: recordlock
	// never creates records in the user's data.
	ErrNotFound = errors.New("recordlock: no such record")
	// ErrNothingToClaim: no record matches Claim's filter and is unlocked.
	ErrNothingToClaim = errors.New("recordlock: no record to claim")
	// ErrNotHeld: Extend or Release of a lock that is no longer held (it
	// was lost, released, or force-released by an operator).
	ErrNotHeld = errors.New("recordlock: lock not held")
	// ErrReleased is the cause of a lock's context after Release.
	ErrReleased = errors.New("recordlock: released")
	// ErrLeaseLost is the cause of a lock's context when the lock could
	// no longer be proven held. It is warden.ErrLeaseLost.
	ErrLeaseLost = warden.ErrLeaseLost
	// ErrClosed: the Locker was closed. It is warden.ErrClosed.
	ErrClosed = warden.ErrClosed
)

// MinDuration is the shortest lock duration: long enough for the safety
// margin of the deadline rule (see Lock.Deadline) to leave most of it.
const MinDuration = 100 * time.Millisecond

// closeTimeout bounds the releases Close makes.
const closeTimeout = 5 * time.Second

// LockedError is the error of a Lock refused because another holder has
// the record. It matches ErrLocked.
type LockedError struct {
	Table string
	ID    any
	Owner string    // the holder
	Until time.Time // the holding's expiry, on the store's clock
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("recordlock: %s %s is locked by %q until %s", e.Table, showID(e.ID), e.Owner, e.Until.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// Options configure a Locker. nil or the zero value gives the documented
// defaults.
type Options struct {
	// Owner is a label operators read in the lock fields; "": hostname:pid.
	// Every Locker adds a random suffix ("billing#3f9a1c2b5d7e"), so two
	// Lockers never share a holding; Locker.Owner returns the full
	// identity.
	Owner string
	// NoAutoExtend turns background extension off: a lock then lasts the
	// duration given to Lock or Claim unless Extend is called. Its context
	// is still done at its deadline. By default a held lock extends itself
	// by its duration every third of it until Release.
	NoAutoExtend bool
	// ClockSkew is the safety margin subtracted from a lock's local
	// deadline (see Lock.Deadline). 0: a twentieth of the duration, at
	// most one second. Never below 5 ms; values above half the duration
	// are reduced to half of it.
	ClockSkew time.Duration
	// Logger receives a Warn line when a lock is lost. nil: slog.Default().
	Logger *slog.Logger
}

// Locker locks records of one collection or table for one owner. Its
// methods are safe for concurrent use. It owns the background extension
// of its locks: Close stops it and releases them.
type Locker[F any] struct {
	d      driver.Records[F]
	owner  string
	seq    atomic.Uint64 // numbers the Locker's holdings
	opts   Options
	log    *slog.Logger
	mu     sync.Mutex
	closed bool
	held   map[*Lock]struct{}
}

// New returns a Locker over the records driver d — one of the stores'
// record drivers, such as sqlite.Records or mongo.Records.
func New[F any](d driver.Records[F], opts *Options) (*Locker[F], error) {
	if d == nil {
		return nil, fmt.Errorf("recordlock: nil driver: %w", warden.ErrInvalidArgument)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.ClockSkew < 0 {
		return nil, fmt.Errorf("recordlock: negative ClockSkew %v: %w", o.ClockSkew, warden.ErrInvalidArgument)
	}
	if err := warden.ValidateKey(o.Owner); o.Owner != "" && err != nil {
		return nil, fmt.Errorf("recordlock: Owner: %w", err)
	}
	lg := o.Logger
	if lg == nil {
		lg = slog.Default()
	}
	return &Locker[F]{d: d, owner: owner.ID(o.Owner), opts: o, log: lg, held: map[*Lock]struct{}{}}, nil
}

// Owner returns the identity of this Locker. Each of its holdings
// carries it in the record followed by "." and the holding's number
// (Lock.Owner), so that a holding is never mistaken for an earlier one of
// the same Locker — even when another program deleted and re-inserted the
// record, restarting its tokens.
func (l *Locker[F]) Owner() string { return l.owner }

// holder returns the identity of a new holding.
func (l *Locker[F]) holder() string {
	return l.owner + "." + strconv.FormatUint(l.seq.Add(1), 10)
}

func (l *Locker[F]) check(ctx context.Context, d time.Duration) error {
	if ctx == nil {
		return fmt.Errorf("recordlock: nil context: %w", warden.ErrInvalidArgument)
	}
	if d < MinDuration {
		return fmt.Errorf("recordlock: lock duration %v is under %v: %w", d, MinDuration, warden.ErrInvalidArgument)
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return ctx.Err()
}

func (l *Locker[F]) fail(op string, id any, err error) error {
	var we *warden.Error
	if errors.As(err, &we) {
		return err
	}
	key := l.d.Table()
	if id != nil {
		key += " " + showID(id)
	}
	return &warden.Error{Store: l.d.Backend(), Op: "record." + op, Key: key, Err: err}
}

// Lock locks the record id for d (≥ MinDuration, kept to whole
// milliseconds) if it is not locked, and returns the lock. It does not
// wait: a record locked by someone else gives a *LockedError (ErrLocked);
// an id no record has gives ErrNotFound, and nothing is created.
//
// The lock extends itself in the background (see Options.NoAutoExtend)
// until Release; its context is cancelled with ErrLeaseLost as soon as it
// can no longer be proven held.
func (l *Locker[F]) Lock(ctx context.Context, id any, d time.Duration) (*Lock, error) {
	if err := l.check(ctx, d); err != nil {
		return nil, err
	}
	if err := l.d.CheckID(id); err != nil {
		return nil, err
	}
	d = d.Truncate(time.Millisecond)
	owner := l.holder()
	sent := time.Now()
	rec, found, acquired, err := l.d.Lock(ctx, id, owner, d)
	switch {
	case err != nil:
		return nil, l.fail("lock", id, err)
	case !found:
		return nil, fmt.Errorf("%w: %s %s", ErrNotFound, l.d.Table(), showID(id))
	case !acquired:
		return nil, &LockedError{Table: l.d.Table(), ID: id, Owner: rec.Owner, Until: rec.Until}
	}
	return l.start(ctx, id, owner, rec, sent, d)
}

// Claim locks for d one record that matches filter and is not locked (or
// whose lock expired), the first in the filter's order, so that workers
// claiming concurrently never get the same record. With nothing to claim
// it returns ErrNothingToClaim at once. The filter's form is the store's
// own (see each store's Records).
func (l *Locker[F]) Claim(ctx context.Context, filter F, d time.Duration) (*Lock, error) {
	if err := l.check(ctx, d); err != nil {
		return nil, err
	}
	d = d.Truncate(time.Millisecond)
	owner := l.holder()
	sent := time.Now()
	rec, claimed, err := l.d.Claim(ctx, filter, owner, d)
	switch {
	case err != nil:
		return nil, l.fail("claim", nil, err)
	case !claimed:
		return nil, fmt.Errorf("%w in %s", ErrNothingToClaim, l.d.Table())
	}
	return l.start(ctx, rec.ID, owner, rec, sent, d)
}

// State is a record's lock state, as Locked reports it.
type State struct {
	ID any
	// Locked: a holder has the record now (by the store's clock).
	Locked bool
	// Owner and Until describe the holding (zero if there is none).
	Owner string
	Until time.Time
	// Token is the last fencing token issued for the record (0: never
	// locked).
	Token int64
}

func state(rec driver.RecordLock) State {
	s := State{ID: rec.ID, Locked: rec.Live(), Token: rec.Token}
	if s.Locked {
		s.Owner, s.Until = rec.Owner, rec.Until
	}
	return s
}

// Locked reports the lock state of record id; ErrNotFound if no record
// has that id.
func (l *Locker[F]) Locked(ctx context.Context, id any) (State, error) {
	if ctx == nil {
		return State{}, fmt.Errorf("recordlock: nil context: %w", warden.ErrInvalidArgument)
	}
	if err := l.d.CheckID(id); err != nil {
		return State{}, err
	}
	rec, found, err := l.d.Get(ctx, id)
	if err != nil {
		return State{}, l.fail("get", id, err)
	}
	if !found {
		return State{}, fmt.Errorf("%w: %s %s", ErrNotFound, l.d.Table(), showID(id))
	}
	return state(rec), nil
}

// Close releases every lock the Locker still holds (their contexts end
// with ErrReleased; bounded to a few seconds in all) and makes further
// calls return ErrClosed. It is idempotent and returns the releases'
// errors, if any.
func (l *Locker[F]) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	held := make([]*Lock, 0, len(l.held))
	for k := range l.held {
		held = append(held, k)
	}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	var errs []error
	for _, k := range held {
		if err := k.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	for _, k := range held {
		k.wg.Wait()
	}
	if len(errs) > 0 {
		return fmt.Errorf("recordlock: close: %d of %d locks not released (they lapse at their expiry): %w", len(errs), len(held), errors.Join(errs...))
	}
	return nil
}

// start turns an acquired holding into a Lock; a holding whose answer
// came after its deadline is given back and reported as too slow.
func (l *Locker[F]) start(ctx context.Context, id any, owner string, rec driver.RecordLock, sent time.Time, d time.Duration) (*Lock, error) {
	margin := deadline.Margin(d, l.opts.ClockSkew)
	k := &Lock{
		rel:     l.d,
		backend: l.d.Backend(),
		table:   l.d.Table(),
		id:      id,
		owner:   owner,
		token:   rec.Token,
		d:       d,
		margin:  margin,
		until:   rec.Until,
		ctx:     deadline.New(ctx, sent.Add(d-margin), ErrLeaseLost),
		log:     l.log,
		skew:    l.opts.ClockSkew,
	}
	k.stopCtx, k.stopCancel = context.WithCancel(context.Background())
	k.forget = func() {
		l.mu.Lock()
		delete(l.held, k)
		l.mu.Unlock()
	}
	if k.ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		_, _ = l.d.Release(rctx, id, owner, rec.Token)
		cancel()
		return nil, fmt.Errorf("recordlock: %s %s: the lock was granted after its deadline (the store answered in %v, the duration less its margin is %v): %w",
			l.d.Table(), showID(id), time.Since(sent).Round(time.Millisecond), d-margin, warden.ErrStoreTooSlow)
	}
	k.stopTimer = k.ctx.CancelAtDeadline()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = k.Release(context.WithoutCancel(ctx))
		return nil, ErrClosed
	}
	l.held[k] = struct{}{}
	l.mu.Unlock()
	if !l.opts.NoAutoExtend {
		k.wg.Add(1)
		go k.extendLoop(sent)
	}
	return k, nil
}

// Lock is one holding of a record's lock. Its methods are safe for
// concurrent use.
type Lock struct {
	rel interface {
		Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error)
		Release(ctx context.Context, id any, owner string, token int64) (bool, error)
		Get(ctx context.Context, id any) (driver.RecordLock, bool, error)
	}
	backend, table string
	id             any
	owner          string
	token          int64
	skew           time.Duration // Options.ClockSkew
	ctx            *deadline.Context
	log            *slog.Logger
	stopTimer      func()
	forget         func()
	stopCtx        context.Context // done when the lock ends
	stopCancel     context.CancelFunc
	wg             sync.WaitGroup

	mu    sync.Mutex
	ended bool
	lost  bool
	until time.Time
	// d is the lock's duration: what each extension asks for. It only
	// grows (Extend refuses a shorter one), so that with extensions made
	// one at a time the store's expiry never moves earlier; margin is the
	// safety margin of d.
	d, margin time.Duration
	// extending is set while an extension is in flight; extendDone is
	// closed when it ends.
	extending  bool
	extendDone chan struct{}
	// pendingSince is the send time of the earliest extension whose
	// outcome stayed unknown (zero if none), and pendingD its duration: a
	// read-back that shows the expiry moved proves only that some
	// extension sent at or after pendingSince, for at least pendingD,
	// applied.
	pendingSince time.Time
	pendingD     time.Duration
}

// ID returns the locked record's id.
func (k *Lock) ID() any { return k.id }

// Owner returns the holder identity written in the record.
func (k *Lock) Owner() string { return k.owner }

// Token returns the holding's fencing token: strictly greater than every
// earlier token of the record. Pass it with writes to the resource the
// lock protects, and have the resource refuse tokens smaller than the
// greatest it has seen.
func (k *Lock) Token() int64 { return k.token }

// Until returns the latest expiry the store reported, on its clock.
func (k *Lock) Until() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.until
}

// Deadline returns the local time at which the lock's context is done
// with ErrLeaseLost unless an extension succeeds first: the local send
// time of the last successful lock or extension, plus the duration, minus
// the safety margin (Options.ClockSkew).
func (k *Lock) Deadline() time.Time { return k.ctx.When() }

// Context returns a context cancelled the moment the lock is lost
// (context.Cause: ErrLeaseLost) or released (ErrReleased). Its Err
// consults the clock: from the deadline on it reports the loss even
// before the timer that closes Done has fired. Check it before each
// write that relies on the lock.
func (k *Lock) Context() context.Context { return k.ctx }

// Done is Context().Done().
func (k *Lock) Done() <-chan struct{} { return k.ctx.Done() }

// Err returns nil while the lock is held, otherwise why it ended
// (ErrLeaseLost or ErrReleased).
func (k *Lock) Err() error {
	if k.ctx.Err() == nil {
		return nil
	}
	return context.Cause(k.ctx)
}

func (k *Lock) name() string { return k.table + " " + showID(k.id) }

// Extend extends the lock to d from now, on the store's clock, and makes
// d the lock's duration: the background extension (if on) then extends
// by d too. d may not be shorter than the lock's duration (the one given
// to Lock or Claim, or to an earlier Extend): a lock is never shortened —
// Release it instead. ErrNotHeld (matching ErrLeaseLost when the lock was
// lost) if the lock is no longer held; the store's error if it failed —
// the lock then stays held until its deadline, and the background
// extension keeps trying.
func (k *Lock) Extend(ctx context.Context, d time.Duration) error {
	if ctx == nil {
		return fmt.Errorf("recordlock: nil context: %w", warden.ErrInvalidArgument)
	}
	d = d.Truncate(time.Millisecond)
	k.mu.Lock()
	if k.ended {
		err := k.endErr()
		k.mu.Unlock()
		return err
	}
	cur := k.d
	if d >= cur {
		k.d, k.margin = d, deadline.Margin(d, k.skew)
	}
	k.mu.Unlock()
	if d < cur {
		return fmt.Errorf("recordlock: %s: Extend by %v is shorter than the lock's duration %v (a lock is never shortened; Release it instead): %w", k.name(), d, cur, warden.ErrInvalidArgument)
	}
	return k.extend(ctx, false)
}

func (k *Lock) endErr() error {
	if k.lost {
		return fmt.Errorf("%w: %s: %w", ErrNotHeld, k.name(), ErrLeaseLost)
	}
	return fmt.Errorf("%w: %s was released", ErrNotHeld, k.name())
}

// extend makes one extension by the lock's duration, after any in flight.
func (k *Lock) extend(ctx context.Context, auto bool) error {
	k.mu.Lock()
	for k.extending {
		done := k.extendDone
		k.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		k.mu.Lock()
		if auto {
			// The extension that ran meanwhile did this one's work.
			k.mu.Unlock()
			return nil
		}
	}
	if k.ended {
		err := k.endErr()
		k.mu.Unlock()
		return err
	}
	sent := time.Now()
	if k.ctx.Expire(sent) {
		k.lose("no extension succeeded before the lock's local deadline")
		return k.lostErr()
	}
	d, margin := k.d, k.margin
	base, baseD := sent, d
	if !k.pendingSince.IsZero() {
		base, baseD = k.pendingSince, k.pendingD
	}
	prevUntil, dl := k.until, k.ctx.When()
	k.extending = true
	k.extendDone = make(chan struct{})
	k.mu.Unlock()

	// No answer after the deadline can help.
	rctx, cancel := context.WithDeadline(ctx, dl)
	rec, found, ok, err := k.rel.Extend(rctx, k.id, k.owner, k.token, d)
	var back driver.RecordLock
	var backFound, readBack bool
	if err != nil && rctx.Err() == nil {
		var gerr error
		back, backFound, gerr = k.rel.Get(rctx, k.id)
		readBack = gerr == nil
	}
	cancel()

	k.mu.Lock()
	k.extending = false
	close(k.extendDone)
	if k.ended {
		err := k.endErr()
		k.mu.Unlock()
		return err
	}
	ours := backFound && back.Owner == k.owner && back.Token == k.token
	switch {
	case err == nil && ok:
		return k.prove(sent, d, margin, rec.Until)
	case err == nil:
		why := "an extension was refused: "
		if !found {
			why += "the record is gone"
		} else {
			why += describe(rec)
		}
		k.lose(why)
		return k.lostErr()
	case readBack && ours && back.Until.After(prevUntil):
		return k.prove(base, baseD, deadline.Margin(baseD, k.skew), back.Until)
	case readBack && !ours:
		why := "an extension failed (" + err.Error() + ") and reading back showed "
		if !backFound {
			why += "the record is gone"
		} else {
			why += describe(back)
		}
		k.lose(why)
		return k.lostErr()
	}
	if k.pendingSince.IsZero() {
		k.pendingSince, k.pendingD = sent, d
	}
	if k.ctx.Expire(time.Now()) {
		k.lose("no extension succeeded before the lock's local deadline (" + err.Error() + ")")
		return k.lostErr()
	}
	k.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &warden.Error{Store: k.backend, Op: "record.extend", Key: k.name(), Err: err}
}

func (k *Lock) lostErr() error {
	return fmt.Errorf("recordlock: %s: %w", k.name(), ErrLeaseLost)
}

func describe(rec driver.RecordLock) string {
	if !rec.Live() {
		return "the record is not locked"
	}
	return fmt.Sprintf("locked by %q with token %d", rec.Owner, rec.Token)
}

// prove records an extension by d (margin its margin) sent at base that
// applied; k.mu is held and prove unlocks it. A proof settles every
// extension whose outcome was unknown: they were sent before this one and
// none can move the expiry earlier than this one did.
func (k *Lock) prove(base time.Time, d, margin time.Duration, until time.Time) error {
	if !k.ctx.Extend(base.Add(d - margin)) {
		k.lose("an extension was answered only after the lock's local deadline")
		return k.lostErr()
	}
	if until.After(k.until) {
		k.until = until
	}
	k.pendingSince, k.pendingD = time.Time{}, 0
	k.mu.Unlock()
	return nil
}

// lose ends the lock as lost; k.mu is held and lose unlocks it. The
// holder is told first (its context is cancelled), then the loss is
// logged.
func (k *Lock) lose(reason string) {
	k.ctx.Cancel(ErrLeaseLost)
	k.ended, k.lost = true, true
	k.mu.Unlock()
	k.finish()
	k.log.Warn("warden: record lock lost", "store", k.backend, "table", k.table, "id", showID(k.id), "owner", k.owner, "token", k.token, "reason", reason)
}

// finish stops the lock's background work; called once, when it ends.
func (k *Lock) finish() {
	k.stopTimer()
	k.stopCancel()
	k.forget()
}

// Release ends the lock: its context is cancelled with ErrReleased at
// once, then the record's lock fields are cleared (the token stays). It
// returns nil on success (also when called again), an error matching
// ErrNotHeld if the lock had been lost or was force-released, or the
// store's error — the holding then lapses at its expiry.
func (k *Lock) Release(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("recordlock: nil context: %w", warden.ErrInvalidArgument)
	}
	k.mu.Lock()
	if k.ended {
		lost := k.lost
		k.mu.Unlock()
		if lost {
			return k.endErr()
		}
		return nil
	}
	// A lock whose deadline passed is lost, even if nothing noticed yet:
	// the record is still cleared if it is ours, but the caller learns
	// that its holding was not proven to the end.
	lapsed := k.ctx.Err() != nil
	if lapsed {
		k.ctx.Cancel(ErrLeaseLost)
	} else {
		k.ctx.Cancel(ErrReleased)
	}
	k.ended, k.lost = true, lapsed
	k.mu.Unlock()
	k.finish()
	ok, err := k.rel.Release(ctx, k.id, k.owner, k.token)
	if lapsed {
		return k.endErr()
	}
	if err != nil {
		return &warden.Error{Store: k.backend, Op: "record.release", Key: k.name(), Err: err}
	}
	if !ok {
		return fmt.Errorf("%w: %s was no longer locked by %q (lost or force-released)", ErrNotHeld, k.name(), k.owner)
	}
	return nil
}

// extendLoop extends the lock every third of its duration until it ends.
// A failed extension is retried with a short back-off until the deadline.
func (k *Lock) extendLoop(sent time.Time) {
	defer k.wg.Done()
	next := sent.Add(k.interval())
	failures := 0
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	for {
		select {
		case <-k.stopCtx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		err := k.extend(k.stopCtx, true)
		switch {
		case err == nil:
			failures = 0
			next = start.Add(k.interval())
		case errors.Is(err, ErrNotHeld) || errors.Is(err, ErrLeaseLost):
			return
		default:
			d := min(5*time.Millisecond<<min(failures, 10), time.Second)
			failures++
			next = time.Now().Add(d/2 + rand.N(d/2+1))
		}
		t.Reset(time.Until(next))
	}
}

// interval is the time between extensions: a third of what an extension
// proves, less up to a tenth at random.
func (k *Lock) interval() time.Duration {
	k.mu.Lock()
	iv := (k.d - k.margin) / 3
	k.mu.Unlock()
	return iv - rand.N(iv/10+1)
}

// showID formats an id for messages, cut short.
func showID(id any) string {
	s := fmt.Sprintf("%v", id)
	if _, ok := id.(string); ok {
		s = fmt.Sprintf("%q", id)
	}
	if len(s) > 64 {
		cut := 61
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = strings.ToValidUTF8(s[:cut], "") + "..."
	}
	return s
}
