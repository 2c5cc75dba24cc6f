// Package idempotency runs an operation at most once per key across every
// process that shares a warden store, and hands its stored result to every
// duplicate request:
//
//	opts := &idempotency.Options{Fingerprint: hashOf(order)}
//	receipt, err := idempotency.Do(ctx, st, "charge:"+requestID, opts, func(ctx context.Context) (Receipt, error) {
//		return chargeCard(ctx, order)
//	})
//
// The first caller claims the key in the store (one atomic operation) and
// runs fn; while it runs, the claim's lease is renewed in the background.
// Concurrent duplicates — in this process or any other — wait for the
// result and return it (or get ErrInProgress with NoWait). A success is
// stored for Retain; later duplicates return it without running fn.
//
// # Failures
//
// An error of fn is not stored by default: the claim is given back, so a
// retry runs fn again (and so does a duplicate that was waiting). With
// CacheErrors the error's message is stored instead, and every later
// duplicate gets a *StoredError (matching ErrStoredError) — never a zero
// value passed off as a success. A caller that gave up (its ctx ended) never
// stores its error.
//
// A claimant that dies keeps the key only until its lease lapses; then a
// duplicate takes it over and runs fn. Conversely, if a claimant cannot
// renew its lease in time (the store is unreachable) or finds it taken
// over, fn's context is cancelled with a cause matching ErrLeaseLost and
// Do reports ErrLeaseLost: another caller may be running fn by then, and
// this result is not stored.
//
// Claims follow the deadline rule of lock leases (docs/design.md): a
// claim is proven held until the local send time of its last successful
// claim or renewal, plus Lease, minus a margin (Lease/20, at most one
// second, at least 5 ms), and fn's context is done at that instant — its
// Err consults the clock — strictly before a duplicate can take over.
//
// A success whose result cannot be stored (too large for the store, or
// not encodable) never lets fn run again: the key keeps a stored failure
// that says so (duplicates get a *StoredError), and Do returns fn's value
// with an error matching ErrNotStored.
//
// # Results
//
// Results are encoded with Options.Codec (JSON by default) inside a small
// JSON envelope that tells a success from a stored error. A record written
// directly with st.Idempotency().Set (operators, go-go-scope-style use) is
// read as a bare encoded value.
package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/deadline"
	"github.com/warden-go/warden/internal/valid"
)

// Defaults of Options' zero values.
const (
	DefaultLease   = 30 * time.Second
	DefaultRetain  = 24 * time.Hour
	DefaultPollMin = 50 * time.Millisecond
	DefaultPollMax = time.Second
)

// MinLease is the shortest Options.Lease Do accepts: lock.MinTTL, for the
// same reason. A claim is proven for Lease − margin from each renewal's
// send time and renewed every Lease/3, so each renewal has the rest of
// that window — about 62 ms at this lease — for its timer to fire, its
// goroutine to run and the store to answer. Shorter leases would keep
// exclusion (the deadline rule needs only twice the 5 ms minimum margin)
// but not the claim: at 10 ms a renewal had under 2 ms, less than a loaded
// CPU's time slice, a garbage collection or one fsync on a busy disk, and
// one claim in five on the memory store was lost within 200 ms of fn.
const MinLease = 100 * time.Millisecond

// Errors matched with errors.Is.
var (
	// ErrInProgress: another caller runs the operation and Options.NoWait
	// is set. The error is an *InProgressError.
	ErrInProgress = errors.New("idempotency: operation in progress")
	// ErrMismatch: the key is claimed or completed with a different
	// request fingerprint. The error is a *MismatchError.
	ErrMismatch = errors.New("idempotency: request fingerprint mismatch")
	// ErrStoredError: the key's stored outcome is an error (CacheErrors).
	// The error is a *StoredError.
	ErrStoredError = errors.New("idempotency: stored error")
	// ErrLeaseLost: the claim was lost while fn ran — its lease could not
	// be renewed in time, or another caller took the key over, or an
	// operator deleted it. fn's context is cancelled with this cause and
	// its result is not stored.
	// It is warden.ErrLeaseLost, shared with lock.
	ErrLeaseLost = warden.ErrLeaseLost
	// ErrNotStored: fn ran and succeeded, but its result could not be
	// stored. Do returns fn's value with it. When the result could never
	// be stored (too large, not encodable) the key keeps a stored failure
	// saying so, so that no retry runs fn again; when the store failed,
	// the claim is left to lapse with its lease.
	ErrNotStored = errors.New("idempotency: result not stored")
	// ErrStoreTooSlow: the store granted the claim, but its answers kept
	// arriving after the claim's deadline, so fn was not run and the
	// claim was given back.
	// It is warden.ErrStoreTooSlow, shared with lock.
	ErrStoreTooSlow = warden.ErrStoreTooSlow
)

// maxLateAnswers bounds how often Do claims again when the store's
// answers keep coming after the claim's deadline.
const maxLateAnswers = 3

// InProgressError reports a key another caller is running.
type InProgressError struct {
	Key   string
	Owner string // the claimant
	// Until is when the claimant's lease lapses unless renewed, by the
	// store's clock.
	Until time.Time
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %q is in progress (claimed by %s until %s)",
		e.Key, e.Owner, e.Until.Format(time.RFC3339Nano))
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// MismatchError reports a key used with two different request
// fingerprints.
type MismatchError struct {
	Key    string
	Stored string // the fingerprint stored with the key
	Given  string // the caller's fingerprint
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("idempotency: key %q was used for a different request (fingerprint %q, this request's %q)",
		e.Key, e.Stored, e.Given)
}

// Is reports whether target is ErrMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// StoredError is the error a duplicate gets when the key's stored outcome
// is an error (Options.CacheErrors). Only the message survives storage.
type StoredError struct {
	Key     string
	Message string // the original error's message
}

func (e *StoredError) Error() string {
	return fmt.Sprintf("idempotency: key %q: stored error: %s", e.Key, e.Message)
}

// Is reports whether target is ErrStoredError.
func (e *StoredError) Is(target error) bool { return target == ErrStoredError }

// Options configure Do. The zero value (or nil) gives the defaults.
type Options struct {
	// Lease is the claim's lease: a claimant that dies holds the key at
	// most this long. It is renewed every Lease/3 while fn runs. 0:
	// DefaultLease (30 s). At least MinLease (100 ms, lock.MinTTL), so
	// that each renewal has time to be answered before the claim's
	// deadline.
	Lease time.Duration
	// Retain is how long a result is kept. 0: DefaultRetain (24 h).
	Retain time.Duration
	// NoWait makes a duplicate that finds the key in progress return an
	// *InProgressError at once. By default it waits for the result.
	NoWait bool
	// PollMin and PollMax bound the jittered exponential back-off of a
	// waiting duplicate between checks of the key. 0: DefaultPollMin
	// (50 ms) and DefaultPollMax (1 s).
	PollMin, PollMax time.Duration
	// CacheErrors stores fn's errors (their messages) like results:
	// duplicates get a *StoredError until the record lapses. By default
	// an error is not stored and a later call runs fn again.
	CacheErrors bool
	// Fingerprint identifies the request (for example a hash of its
	// body), at most 512 bytes. If both it and the fingerprint stored
	// with the key are non-empty and differ, Do returns a *MismatchError.
	Fingerprint string
	// Owner is a label naming this caller in the key's record; a suffix
	// unique to the process and the call is added ("billing#3f9a1c2b5d7e.42"),
	// so that two calls never share a claim, even in two processes given
	// the same label. "": host:pid.
	Owner string
	// Codec encodes results. Nil: warden.JSONCodec.
	Codec warden.Codec
	// Observe, if set, is told how the store answered the claim and of
	// the waits for another caller's claim (see Observation), for
	// telemetry: otelwarden.Telemetry.Idempotency is one. It is called
	// after the fact, on Do's goroutine, with Do's context. It must be
	// quick and safe for concurrent use, and must not panic. Nil: nothing
	// is observed, at no cost.
	Observe func(ctx context.Context, o Observation)
}

// settings are resolved Options.
type settings struct {
	lease, retain    time.Duration
	margin           time.Duration // the claim deadline's safety margin
	pollMin, pollMax time.Duration
	noWait           bool
	cacheErrors      bool
	fingerprint      string
	owner            string
	codec            warden.Codec
	observe          func(context.Context, Observation)
}

var (
	// processLabel is the default owner label: host:pid.
	processLabel = func() string {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown-host"
		}
		return host + ":" + strconv.Itoa(os.Getpid())
	}()
	// processNonce makes owners unique across processes that give the
	// same Options.Owner label.
	processNonce = func() string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}()
	callSeq atomic.Uint64
)

// resolve resolves opts, refusing a Lease under minLease: MinLease for
// Do and Result; the package's tests of the deadline rule go down to
// deadline.MinTTL (see do).
func resolve(opts *Options, minLease time.Duration) (settings, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	bad := func(format string, args ...any) (settings, error) {
		return settings{}, fmt.Errorf("idempotency: %w: "+format, append([]any{warden.ErrInvalidArgument}, args...)...)
	}
	if err := valid.Durations("idempotency", valid.D{Name: "Lease", V: o.Lease}, valid.D{Name: "Retain", V: o.Retain},
		valid.D{Name: "PollMin", V: o.PollMin}, valid.D{Name: "PollMax", V: o.PollMax}); err != nil {
		return settings{}, err
	}
	if o.Lease != 0 && o.Lease < minLease {
		return bad("Lease %v is under the minimum of %v: so short a claim is lost to ordinary scheduling and store delays", o.Lease, minLease)
	}
	s := settings{
		lease:       or(o.Lease, DefaultLease),
		retain:      or(o.Retain, DefaultRetain),
		pollMin:     or(o.PollMin, DefaultPollMin),
		pollMax:     or(o.PollMax, DefaultPollMax),
		noWait:      o.NoWait,
		cacheErrors: o.CacheErrors,
		fingerprint: o.Fingerprint,
		codec:       o.Codec,
		observe:     o.Observe,
	}
	if o.PollMax == 0 && s.pollMax < s.pollMin {
		s.pollMax = s.pollMin
	}
	if s.pollMax < s.pollMin {
		return bad("PollMax %v is under PollMin %v", s.pollMax, s.pollMin)
	}
	if s.codec == nil {
		s.codec = warden.JSONCodec{}
	}
	s.margin = deadline.Margin(s.lease, 0)
	base := o.Owner
	if base == "" {
		base = processLabel
	}
	s.owner = base + "#" + processNonce + "." + strconv.FormatUint(callSeq.Add(1), 10)
	if err := warden.ValidateKey(s.owner); err != nil {
		return settings{}, fmt.Errorf("idempotency: owner: %w", err)
	}
	return s, nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Do runs fn once for key across every process sharing st's namespace and
// returns its result; duplicates return the stored result. See the package
// documentation for the details. Errors: ctx's error (unchanged) if ctx
// ends first; *InProgressError (NoWait); *MismatchError; *StoredError; an
// error matching ErrLeaseLost if the claim was lost while fn ran; a store
// error (*warden.Error); or fn's own error. When fn ran and succeeded but
// its result could not be stored, Do returns fn's value together with the
// error.
func Do[T any](ctx context.Context, st *warden.Store, key string, opts *Options, fn func(ctx context.Context) (T, error)) (T, error) {
	return do(ctx, st, key, opts, fn, MinLease)
}

// do is Do accepting leases down to minLease. The package's tests of the
// deadline rule use leases down to deadline.MinTTL, where the rule still
// holds and claims are lost often, which is what they test.
func do[T any](ctx context.Context, st *warden.Store, key string, opts *Options, fn func(ctx context.Context) (T, error), minLease time.Duration) (_ T, err error) {
	var zero T
	switch {
	case st == nil:
		return zero, valid.Nil("idempotency", "store")
	case fn == nil:
		return zero, valid.Nil("idempotency", "function")
	}
	s, err := resolve(opts, minLease)
	if err != nil {
		return zero, err
	}
	var tr *doTrace
	if s.observe != nil {
		tr = &doTrace{observe: s.observe, key: key}
		defer func() { tr.done(ctx, err) }()
	}
	idem := st.Idempotency()
	backoff := s.pollMin
	late := 0
	for {
		sent := time.Now()
		rec, out, err := idem.Claim(ctx, key, s.owner, s.lease, s.fingerprint)
		if err != nil {
			return zero, err
		}
		if tr != nil {
			switch out {
			case driver.Claimed:
				tr.answered(ctx, OutcomeClaimed)
			case driver.TakenOver:
				tr.answered(ctx, OutcomeTakenOver)
			case driver.Completed:
				tr.answered(ctx, OutcomeCompleted)
			case driver.InProgress:
				tr.answered(ctx, OutcomeInProgress)
				if !s.noWait {
					tr.inProgress(rec.Owner)
				}
			}
		}
		switch out {
		case driver.Claimed, driver.TakenOver:
			if !time.Now().Before(sent.Add(s.lease - s.margin)) {
				// Answered after the claim's deadline: a duplicate may
				// already have taken it over. Claim again — the store
				// renews a claim that is still ours — and never run fn
				// on a claim that is not proven.
				if late++; late < maxLateAnswers && ctx.Err() == nil {
					continue
				}
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lease)
				abandon(fctx, idem, st.Logger(), key, s.owner)
				cancel()
				return zero, fmt.Errorf("idempotency: key %q: %w: the store answered %d claims in a row only after their deadline (Lease %v less margin %v); fn was not run",
					key, ErrStoreTooSlow, late, s.lease, s.margin)
			}
			return run(ctx, st, key, fn, &s, sent)
		case driver.Completed:
			if err := s.checkFingerprint(key, rec); err != nil {
				return zero, err
			}
			return decode[T](key, rec.Result, s.codec)
		case driver.InProgress:
			if err := s.checkFingerprint(key, rec); err != nil {
				return zero, err
			}
			if s.noWait {
				return zero, &InProgressError{Key: key, Owner: rec.Owner, Until: rec.ExpiresAt}
			}
			if err := pause(ctx, backoff, rec); err != nil {
				return zero, err
			}
			backoff = min(backoff*2, s.pollMax)
		default:
			return zero, fmt.Errorf("idempotency: key %q: the %s store answered an unknown claim outcome %d", key, st.Name(), out)
		}
	}
}

// Result returns key's stored result without claiming the key or running
// anything: found=false if no result is stored (absent, lapsed, or still
// in progress). A stored error is returned as a *StoredError with
// found=true. opts supplies the Codec and Fingerprint; nil: JSON, none.
func Result[T any](ctx context.Context, st *warden.Store, key string, opts *Options) (v T, found bool, err error) {
	if st == nil {
		return v, false, valid.Nil("idempotency", "store")
	}
	s, err := resolve(opts, MinLease)
	if err != nil {
		return v, false, err
	}
	rec, ok, err := st.Idempotency().Get(ctx, key)
	if err != nil || !ok || rec.Status != driver.IdemCompleted {
		return v, false, err
	}
	if err := s.checkFingerprint(key, rec); err != nil {
		return v, true, err
	}
	v, err = decode[T](key, rec.Result, s.codec)
	return v, true, err
}

func (s *settings) checkFingerprint(key string, rec driver.IdemRecord) error {
	if s.fingerprint != "" && rec.Fingerprint != "" && s.fingerprint != rec.Fingerprint {
		return &MismatchError{Key: key, Stored: rec.Fingerprint, Given: s.fingerprint}
	}
	return nil
}

// pause waits before the next claim attempt: a jittered back-off, and no
// longer than the claimant's lease can still run. The record's times are
// the store's: the lease lapses at most ExpiresAt−CreatedAt after this
// record was read (the claim began at CreatedAt, before the read), so that
// duration bounds the wait without comparing the store's clock with ours.
func pause(ctx context.Context, backoff time.Duration, rec driver.IdemRecord) error {
	d := backoff/2 + mrand.N(backoff/2+1)
	if left := rec.ExpiresAt.Sub(rec.CreatedAt); left > 0 && d > left {
		d = left
	}
	d = max(d, time.Millisecond)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run runs fn under a claim made at sent, renewing the claim while fn
// runs, and stores the outcome.
func run[T any](ctx context.Context, st *warden.Store, key string, fn func(context.Context) (T, error), s *settings, sent time.Time) (T, error) {
	idem := st.Idempotency()
	log := st.Logger()
	claim := deadline.New(ctx, sent.Add(s.lease-s.margin),
		fmt.Errorf("%w: key %q: the claim was not renewed before its deadline", ErrLeaseLost, key))
	runCtx, stopRun := claim.Child(ctx)
	defer stopRun()
	// The claim ends at its deadline even while a renewal hangs in the
	// store.
	defer claim.CancelAtDeadline()()
	ext := startRenewal(ctx, claim, idem, log, key, s)

	// Writes after fn returns do not follow ctx's cancellation: the
	// outcome must be stored (or the claim given back) even if the caller
	// has gone. They are bounded by the lease.
	finalCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), s.lease)
	}
	returned := false
	defer func() {
		if returned {
			return
		}
		// fn panicked: give the key back; the panic goes on.
		if ext.stop() == nil {
			fctx, cancel := finalCtx()
			abandon(fctx, idem, log, key, s.owner)
			cancel()
		}
	}()
	v, ferr := fn(runCtx)
	returned = true
	if lost := ext.stop(); lost != nil {
		if ferr != nil {
			return v, fmt.Errorf("%w (fn returned: %w)", lost, ferr)
		}
		return v, lost
	}
	fctx, cancel := finalCtx()
	defer cancel()

	if ferr != nil {
		callerGone := ctx.Err() != nil && (errors.Is(ferr, context.Canceled) || errors.Is(ferr, context.DeadlineExceeded))
		if s.cacheErrors && !callerGone {
			data, err := json.Marshal(envelope{Marker: 1, OK: false, Error: ferr.Error()})
			if err == nil {
				err = complete(fctx, idem, key, s.owner, data, s.retain)
			}
			if err != nil {
				log.Warn("idempotency: cannot store the error of fn", "key", key, "err", err)
				abandon(fctx, idem, log, key, s.owner)
			}
			return v, ferr
		}
		abandon(fctx, idem, log, key, s.owner)
		return v, ferr
	}
	data, err := encode(s.codec, v)
	if err != nil {
		return v, keepBlocked(fctx, idem, log, key, s, fmt.Errorf("its result cannot be encoded: %w", err))
	}
	if err := complete(fctx, idem, key, s.owner, data, s.retain); err != nil {
		switch {
		case errors.Is(err, ErrLeaseLost):
			return v, fmt.Errorf("%w: key %q: fn succeeded: %w", ErrNotStored, key, err)
		case errors.Is(err, warden.ErrValueTooLarge) || errors.Is(err, warden.ErrInvalidArgument):
			return v, keepBlocked(fctx, idem, log, key, s, fmt.Errorf("its result cannot be stored: %w", err))
		}
		// The store failed: the claim is left to lapse rather than given
		// back, so that a retry does not run fn again at once.
		return v, fmt.Errorf("%w: key %q: fn succeeded but storing its result failed; the claim lapses with its lease (%v), and a call after that runs fn again: %w",
			ErrNotStored, key, s.lease, err)
	}
	return v, nil
}

// keepBlocked records, for a success whose result can never be stored,
// a stored failure that says so: duplicates get it as a *StoredError
// instead of running fn again. If even that cannot be stored, the claim
// is left to lapse with its lease. It returns the error for the caller.
func keepBlocked(ctx context.Context, idem *warden.Idempotency, log *slog.Logger, key string, s *settings, why error) error {
	msg := "fn succeeded, but " + why.Error() + "; it is not run again for this key"
	data, err := json.Marshal(envelope{Marker: 1, OK: false, Error: msg})
	if err == nil {
		err = complete(ctx, idem, key, s.owner, data, s.retain)
	}
	if err != nil {
		log.Warn("idempotency: cannot record that the result was not stored; the claim lapses with its lease", "key", key, "err", err)
		return fmt.Errorf("%w: key %q: fn succeeded, but %w; the claim lapses with its lease (%v), and a call after that runs fn again (recording the failure failed too: %v)",
			ErrNotStored, key, why, s.lease, err)
	}
	return fmt.Errorf("%w: key %q: fn succeeded, but %w; the key keeps a stored failure for %v so that fn is not run again", ErrNotStored, key, why, s.retain)
}

// complete stores the outcome, retrying a failed attempt twice. An attempt
// whose answer was lost may have been applied: a refusal after a failed
// attempt is checked by reading the record back.
func complete(ctx context.Context, idem *warden.Idempotency, key, owner string, data []byte, retain time.Duration) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(attempt) * 50 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return err
			}
		}
		var ok bool
		ok, err = idem.Complete(ctx, key, owner, data, retain)
		if err == nil {
			if ok {
				return nil
			}
			if attempt > 0 {
				rec, found, gerr := idem.Get(ctx, key)
				if gerr == nil && found && rec.Status == driver.IdemCompleted && rec.Owner == owner {
					return nil
				}
			}
			return fmt.Errorf("%w: key %q was taken over or deleted before the result was stored", ErrLeaseLost, key)
		}
		if errors.Is(err, warden.ErrValueTooLarge) || errors.Is(err, warden.ErrInvalidArgument) ||
			errors.Is(err, warden.ErrClosed) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// abandon gives the claim back so that a retry may run fn; a failure is
// logged (the claim then lapses with its lease).
func abandon(ctx context.Context, idem *warden.Idempotency, log *slog.Logger, key, owner string) {
	if _, err := idem.Abandon(ctx, key, owner); err != nil {
		log.Warn("idempotency: cannot give the claim back; it lapses with its lease", "key", key, "err", err)
	}
}

// renewal renews a claim in the background while fn runs. Its goroutine
// is owned by run, which stops it and waits for it before returning.
type renewal struct {
	claim  *deadline.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func startRenewal(parent context.Context, claim *deadline.Context, idem *warden.Idempotency, log *slog.Logger, key string, s *settings) *renewal {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	r := &renewal{claim: claim, cancel: cancel, done: make(chan struct{})}
	go r.run(ctx, idem, log, key, s)
	return r
}

// run renews every lease/3. The claim is proven held until its deadline:
// the local time at which the last successful renewal was sent, plus the
// lease, minus the margin. A renewal that fails is retried sooner; when
// the store says the claim is no longer ours, or the deadline comes
// first, the claim (and so fn's context) is cancelled with ErrLeaseLost.
// An answer that arrives after the deadline is too late: the claim's
// context is done by then.
func (r *renewal) run(ctx context.Context, idem *warden.Idempotency, log *slog.Logger, key string, s *settings) {
	defer close(r.done)
	claim := r.claim
	every := max(s.lease/3, time.Millisecond)
	t := time.NewTimer(min(every, time.Until(claim.When())))
	defer t.Stop()
	var lastErr error // the last failed renewal's error
	lost := func(format string, args ...any) {
		claim.Cancel(fmt.Errorf("%w: key %q: "+format, append([]any{ErrLeaseLost, key}, args...)...))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-claim.Done():
			return
		case <-t.C:
		}
		at := time.Now()
		// Past the deadline the claim ends, with the cause SetCause gave
		// it (naming the last renewal error, if any).
		if claim.Expire(at) {
			return
		}
		wait := claim.When().Sub(at)
		// No answer after the deadline can help: bound the call by it.
		rctx, rcancel := context.WithTimeout(ctx, wait)
		ok, err := idem.Extend(rctx, key, s.owner, s.lease)
		timedOut := rctx.Err() == context.DeadlineExceeded
		rcancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil && ok:
			if !claim.Extend(at.Add(s.lease - s.margin)) {
				return // answered after the deadline: lost
			}
			lastErr = nil
			t.Reset(min(every, time.Until(claim.When())))
			continue
		case err == nil:
			lost("the claim is no longer ours (taken over after its lease lapsed, or deleted)")
			return
		}
		// A renewal cut short by the deadline says less than the store
		// error before it.
		if !timedOut || lastErr == nil {
			lastErr = err
			// If the deadline passes first (by the clock, or by the
			// claim's timer), the loss names this error.
			claim.SetCause(fmt.Errorf("%w: key %q: the claim could not be renewed before its deadline: %w", ErrLeaseLost, key, lastErr))
		}
		left := time.Until(claim.When())
		if left <= 0 {
			lost("the claim could not be renewed before its deadline: %w", lastErr)
			return
		}
		log.Warn("idempotency: cannot renew the claim; retrying", "key", key, "err", err)
		t.Reset(max(min(every/4, left/2), time.Millisecond))
	}
}

// stop ends the renewal, waits for its goroutine and reports why the claim
// was lost, if it was (by the clock too).
func (r *renewal) stop() error {
	r.cancel()
	<-r.done
	if r.claim.Err() != nil {
		return context.Cause(r.claim)
	}
	return nil
}

// envelope is how a stored outcome is written: {"$warden":1,"ok":true,
// "value":…} for a success encoded as JSON, "data" (base64) for another
// codec's bytes, {"$warden":1,"ok":false,"error":"…"} for an error.
type envelope struct {
	Marker int             `json:"$warden"`
	OK     bool            `json:"ok"`
	Value  json.RawMessage `json:"value,omitempty"`
	Data   []byte          `json:"data,omitempty"`
	Error  string          `json:"error,omitempty"`
}

func encode(c warden.Codec, v any) ([]byte, error) {
	b, err := c.Marshal(v)
	if err != nil {
		return nil, err
	}
	env := envelope{Marker: 1, OK: true}
	// JSON goes in "value" only if the envelope keeps it byte for byte
	// (encoding/json compacts and escapes a RawMessage), so that a codec
	// gets back exactly what it wrote.
	if rb, err := json.Marshal(json.RawMessage(b)); err == nil && bytes.Equal(rb, b) {
		env.Value = b
	} else {
		env.Data = b
	}
	return json.Marshal(env)
}

func decode[T any](key string, stored []byte, c warden.Codec) (T, error) {
	var v T
	var env envelope
	if err := json.Unmarshal(stored, &env); err != nil || env.Marker != 1 {
		// Not written by Do: a bare value (st.Idempotency().Set).
		if err := c.Unmarshal(stored, &v); err != nil {
			return v, fmt.Errorf("idempotency: key %q: cannot decode the stored result: %w", key, err)
		}
		return v, nil
	}
	if !env.OK {
		return v, &StoredError{Key: key, Message: env.Error}
	}
	raw := []byte(env.Value)
	if raw == nil {
		raw = env.Data
		if raw == nil {
			raw = []byte{} // a codec's empty encoding
		}
	}
	if err := c.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("idempotency: key %q: cannot decode the stored result: %w", key, err)
	}
	return v, nil
}
