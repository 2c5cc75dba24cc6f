package warden

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/warden-go/warden/driver"
)

// This file holds the checked entry points to each capability's driver:
// store.Locks(), store.Circuits(), store.Cache(), store.Idempotency(),
// store.Checkpoints(). The portable packages and the CLI call these; they
// validate, then make exactly one driver call.

// Locks returns the store's lock primitives.
func (s *Store) Locks() *Locks { return &Locks{s: s, d: s.drv.Locks()} }

// Circuits returns the store's circuit-breaker primitives.
func (s *Store) Circuits() *Circuits { return &Circuits{s: s, d: s.drv.Circuits()} }

// Cache returns the store's cache primitives.
func (s *Store) Cache() *Cache { return &Cache{s: s, d: s.drv.Cache()} }

// Idempotency returns the store's idempotency primitives.
func (s *Store) Idempotency() *Idempotency { return &Idempotency{s: s, d: s.drv.Idempotency()} }

// Checkpoints returns the store's checkpoint primitives.
func (s *Store) Checkpoints() *Checkpoints { return &Checkpoints{s: s, d: s.drv.Checkpoints()} }

// ---------------------------------------------------------------------------
// argument checks

// positive checks a duration that must be at least one millisecond and
// rounds it up to whole milliseconds.
func positive(name string, d time.Duration) (time.Duration, error) {
	if d < time.Millisecond {
		return 0, fmt.Errorf("%w: %s %v is under one millisecond", ErrInvalidArgument, name, d)
	}
	return time.Duration(driver.Millis(d)) * time.Millisecond, nil
}

// optional checks a duration where zero means "none".
func optional(name string, d time.Duration) (time.Duration, error) {
	if d == 0 {
		return 0, nil
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: %s %v is negative", ErrInvalidArgument, name, d)
	}
	return positive(name, d)
}

func (s *Store) checkValue(v []byte) error {
	if max := s.drv.Limits().MaxValueBytes; max > 0 && len(v) > max {
		return fmt.Errorf("%w: %d bytes, the %s store's limit is %d", ErrValueTooLarge, len(v), s.drv.Name(), max)
	}
	return nil
}

// firstErr returns the first failed check.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// Locks

// Locks are the checked lock primitives of a Store; see driver.Locks for
// the semantics. Most users want package lock instead.
type Locks struct {
	s *Store
	d driver.Locks
}

// Acquire takes key for owner for ttl (≥ 1 ms) if nobody else holds it.
func (l *Locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (rec driver.LockRecord, acquired bool, err error) {
	ttl, terr := positive("ttl", ttl)
	err = l.s.check(ctx, "lock.acquire", key, firstErr(ValidateKey(key), ownerErr(owner), terr), func() (err error) {
		rec, acquired, err = l.d.Acquire(ctx, key, owner, ttl)
		return err
	})
	return rec, acquired, err
}

// Refresh renews owner's holding of key (with token) to now+ttl.
func (l *Locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (rec driver.LockRecord, ok bool, err error) {
	ttl, terr := positive("ttl", ttl)
	err = l.s.check(ctx, "lock.refresh", key, firstErr(ValidateKey(key), ownerErr(owner), tokenErr(token), terr), func() (err error) {
		rec, ok, err = l.d.Refresh(ctx, key, owner, token, ttl)
		return err
	})
	return rec, ok, err
}

// Release ends owner's holding of key with token; ok=false if not held.
func (l *Locks) Release(ctx context.Context, key, owner string, token int64) (ok bool, err error) {
	err = l.s.check(ctx, "lock.release", key, firstErr(ValidateKey(key), ownerErr(owner), tokenErr(token)), func() (err error) {
		ok, err = l.d.Release(ctx, key, owner, token)
		return err
	})
	return ok, err
}

// ForceRelease ends any holding of key; ok=false if none was live.
func (l *Locks) ForceRelease(ctx context.Context, key string) (ok bool, err error) {
	err = l.s.check(ctx, "lock.force-release", key, ValidateKey(key), func() (err error) {
		ok, err = l.d.ForceRelease(ctx, key)
		return err
	})
	return ok, err
}

// Get returns the live holding of key.
func (l *Locks) Get(ctx context.Context, key string) (rec driver.LockRecord, found bool, err error) {
	err = l.s.check(ctx, "lock.get", key, ValidateKey(key), func() (err error) {
		rec, found, err = l.d.Get(ctx, key)
		return err
	})
	return rec, found, err
}

// List returns the live holdings whose keys match the glob pattern.
func (l *Locks) List(ctx context.Context, pattern string) (recs []driver.LockRecord, err error) {
	p, perr := ParsePattern(pattern)
	err = l.s.check(ctx, "lock.list", "", perr, func() (err error) {
		recs, err = l.d.List(ctx, p)
		return err
	})
	return recs, err
}

// CanWatch reports whether the store delivers lock events (notifications)
// from every process. Without them, waiters poll.
func (l *Locks) CanWatch() bool {
	_, ok := l.s.drv.(driver.LockNotifier)
	return ok
}

// Watch delivers the namespace's lock events until ctx ends or the store
// closes. It returns an error wrapping errors.ErrUnsupported if the store
// has no notifications.
func (l *Locks) Watch(ctx context.Context) (ch <-chan driver.LockEvent, err error) {
	n, ok := l.s.drv.(driver.LockNotifier)
	var uerr error
	if !ok {
		uerr = fmt.Errorf("%w: the %s store has no lock notifications", errors.ErrUnsupported, l.s.drv.Name())
	}
	err = l.s.check(ctx, "lock.watch", "", uerr, func() (err error) {
		ch, err = n.WatchLocks(ctx)
		return err
	})
	return ch, err
}

func ownerErr(owner string) error {
	if err := ValidateKey(owner); err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	return nil
}

func tokenErr(token int64) error {
	if token <= 0 {
		return fmt.Errorf("%w: fencing token %d is not positive", ErrInvalidArgument, token)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Circuits

// Circuits are the checked circuit-breaker primitives of a Store; see
// driver.Circuits. Most users want package breaker instead.
type Circuits struct {
	s *Store
	d driver.Circuits
}

// RecordFailure adds one failure to the circuit, whatever its generation
// (RecordFailureGen with driver.AnyGeneration); see driver.Circuits.
func (c *Circuits) RecordFailure(ctx context.Context, name string, threshold int) (rec driver.CircuitRecord, err error) {
	return c.RecordFailureGen(ctx, name, threshold, driver.AnyGeneration)
}

// RecordFailureGen adds one failure to the circuit if it is still in
// generation gen (driver.CircuitRecord.Generation), or whatever its
// generation with driver.AnyGeneration; otherwise it changes nothing and
// returns the current record. See driver.Circuits.
func (c *Circuits) RecordFailureGen(ctx context.Context, name string, threshold int, gen int64) (rec driver.CircuitRecord, err error) {
	var aerr error
	switch {
	case threshold < 1:
		aerr = fmt.Errorf("%w: threshold %d is under 1", ErrInvalidArgument, threshold)
	case gen < driver.AnyGeneration:
		aerr = fmt.Errorf("%w: circuit generation %d", ErrInvalidArgument, gen)
	}
	err = c.s.check(ctx, "circuit.record-failure", name, firstErr(ValidateKey(name), aerr), func() (err error) {
		rec, err = c.d.RecordFailure(ctx, name, threshold, gen)
		return err
	})
	return rec, err
}

// RecordSuccess records a success, whatever the circuit's generation
// (RecordSuccessGen with driver.AnyGeneration); see driver.Circuits.
func (c *Circuits) RecordSuccess(ctx context.Context, name string) (rec driver.CircuitRecord, err error) {
	return c.RecordSuccessGen(ctx, name, driver.AnyGeneration)
}

// RecordSuccessGen records a success if the circuit is still in
// generation gen, or whatever its generation with driver.AnyGeneration;
// otherwise it changes nothing and returns the current record. See
// driver.Circuits.
func (c *Circuits) RecordSuccessGen(ctx context.Context, name string, gen int64) (rec driver.CircuitRecord, err error) {
	var aerr error
	if gen < driver.AnyGeneration {
		aerr = fmt.Errorf("%w: circuit generation %d", ErrInvalidArgument, gen)
	}
	err = c.s.check(ctx, "circuit.record-success", name, firstErr(ValidateKey(name), aerr), func() (err error) {
		rec, err = c.d.RecordSuccess(ctx, name, gen)
		return err
	})
	return rec, err
}

// TryProbe asks for the half-open probe slot; see driver.Circuits.
func (c *Circuits) TryProbe(ctx context.Context, name, owner string, openFor, lease time.Duration) (rec driver.CircuitRecord, granted bool, err error) {
	openFor, oerr := optional("open duration", openFor)
	lease, lerr := positive("probe lease", lease)
	err = c.s.check(ctx, "circuit.try-probe", name, firstErr(ValidateKey(name), ownerErr(owner), oerr, lerr), func() (err error) {
		rec, granted, err = c.d.TryProbe(ctx, name, owner, openFor, lease)
		return err
	})
	return rec, granted, err
}

// RecordOutcome records an outcome with its counts in one atomic step;
// see driver.Circuits and driver.Outcome. Hooks see it as
// circuit.record-failure, circuit.record-success or, for
// driver.OutcomeNone, circuit.record-successes.
func (c *Circuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (rec driver.CircuitRecord, err error) {
	var aerr error
	switch {
	case o.Kind != driver.OutcomeNone && o.Kind != driver.OutcomeSuccess && o.Kind != driver.OutcomeFailure:
		aerr = fmt.Errorf("%w: outcome kind %d", ErrInvalidArgument, o.Kind)
	case o.Gen < driver.AnyGeneration:
		aerr = fmt.Errorf("%w: circuit generation %d", ErrInvalidArgument, o.Gen)
	case o.ProbeEpoch < 0:
		aerr = fmt.Errorf("%w: negative probe epoch %d", ErrInvalidArgument, o.ProbeEpoch)
	case o.Successes < 0:
		aerr = fmt.Errorf("%w: negative successes %d", ErrInvalidArgument, o.Successes)
	case o.Threshold < 0:
		aerr = fmt.Errorf("%w: negative threshold %d", ErrInvalidArgument, o.Threshold)
	case o.CloseAfter < 0:
		aerr = fmt.Errorf("%w: negative CloseAfter %d", ErrInvalidArgument, o.CloseAfter)
	}
	var ierr error
	o.Interval, ierr = optional("counting interval", o.Interval)
	op := "circuit.record-successes"
	switch o.Kind {
	case driver.OutcomeFailure:
		op = "circuit.record-failure"
	case driver.OutcomeSuccess:
		op = "circuit.record-success"
	}
	err = c.s.check(ctx, op, name, firstErr(ValidateKey(name), aerr, ierr), func() (err error) {
		rec, err = c.d.RecordOutcome(ctx, name, o)
		return err
	})
	return rec, err
}

// Trip opens a closed circuit if its version is still version; see
// driver.Circuits.
func (c *Circuits) Trip(ctx context.Context, name string, version int64) (rec driver.CircuitRecord, tripped bool, err error) {
	var verr error
	if version < 0 {
		verr = fmt.Errorf("%w: negative circuit version %d", ErrInvalidArgument, version)
	}
	err = c.s.check(ctx, "circuit.trip", name, firstErr(ValidateKey(name), verr), func() (err error) {
		rec, tripped, err = c.d.Trip(ctx, name, version)
		return err
	})
	return rec, tripped, err
}

// TryProbes asks for one of maxProbes concurrent half-open probe slots;
// see driver.Circuits.
func (c *Circuits) TryProbes(ctx context.Context, name, owner string, openFor, lease time.Duration, maxProbes int) (rec driver.CircuitRecord, granted bool, err error) {
	openFor, oerr := optional("open duration", openFor)
	lease, lerr := positive("probe lease", lease)
	var merr error
	if maxProbes < 1 {
		merr = fmt.Errorf("%w: maxProbes %d is under 1", ErrInvalidArgument, maxProbes)
	}
	err = c.s.check(ctx, "circuit.try-probe", name, firstErr(ValidateKey(name), ownerErr(owner), oerr, lerr, merr), func() (err error) {
		rec, granted, err = c.d.TryProbes(ctx, name, owner, openFor, lease, maxProbes)
		return err
	})
	return rec, granted, err
}

// Get returns the circuit's record; found=false if it was never written.
func (c *Circuits) Get(ctx context.Context, name string) (rec driver.CircuitRecord, found bool, err error) {
	err = c.s.check(ctx, "circuit.get", name, ValidateKey(name), func() (err error) {
		rec, found, err = c.d.Get(ctx, name)
		return err
	})
	return rec, found, err
}

// Set forces the circuit's state.
func (c *Circuits) Set(ctx context.Context, name string, state driver.CircuitState) (rec driver.CircuitRecord, err error) {
	var serr error
	if !state.Valid() {
		serr = fmt.Errorf("%w: circuit state %q (want closed, open or half-open)", ErrInvalidArgument, string(state))
	}
	err = c.s.check(ctx, "circuit.set", name, firstErr(ValidateKey(name), serr), func() (err error) {
		rec, err = c.d.Set(ctx, name, state)
		return err
	})
	return rec, err
}

// Delete removes the circuit's record.
func (c *Circuits) Delete(ctx context.Context, name string) (ok bool, err error) {
	err = c.s.check(ctx, "circuit.delete", name, ValidateKey(name), func() (err error) {
		ok, err = c.d.Delete(ctx, name)
		return err
	})
	return ok, err
}

// List returns the circuits whose names match the glob pattern.
func (c *Circuits) List(ctx context.Context, pattern string) (recs []driver.CircuitRecord, err error) {
	p, perr := ParsePattern(pattern)
	err = c.s.check(ctx, "circuit.list", "", perr, func() (err error) {
		recs, err = c.d.List(ctx, p)
		return err
	})
	return recs, err
}

// CanWatch reports whether the store delivers circuit changes from every
// process.
func (c *Circuits) CanWatch() bool {
	_, ok := c.s.drv.(driver.CircuitNotifier)
	return ok
}

// Watch delivers the namespace's circuit changes until ctx ends or the
// store closes; errors.ErrUnsupported if the store has no notifications.
func (c *Circuits) Watch(ctx context.Context) (ch <-chan driver.CircuitRecord, err error) {
	n, ok := c.s.drv.(driver.CircuitNotifier)
	var uerr error
	if !ok {
		uerr = fmt.Errorf("%w: the %s store has no circuit notifications", errors.ErrUnsupported, c.s.drv.Name())
	}
	err = c.s.check(ctx, "circuit.watch", "", uerr, func() (err error) {
		ch, err = n.WatchCircuits(ctx)
		return err
	})
	return ch, err
}

// ---------------------------------------------------------------------------
// Cache

// Cache is the checked cache primitives of a Store over raw bytes; see
// driver.Cache. Most users want the typed package cache instead.
type Cache struct {
	s *Store
	d driver.Cache
}

// Get returns the live entry for key.
func (c *Cache) Get(ctx context.Context, key string) (e driver.CacheEntry, found bool, err error) {
	err = c.s.check(ctx, "cache.get", key, ValidateKey(key), func() (err error) {
		e, found, err = c.d.Get(ctx, key)
		return err
	})
	return e, found, err
}

// Set stores value for ttl (0: no expiry).
func (c *Cache) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	ttl, terr := optional("ttl", ttl)
	return c.s.check(ctx, "cache.set", key, firstErr(ValidateKey(key), c.s.checkValue(value), terr), func() error {
		return c.d.Set(ctx, key, value, ttl)
	})
}

// SetIfAbsent stores value only if there is no live entry.
func (c *Cache) SetIfAbsent(ctx context.Context, key string, value []byte, ttl time.Duration) (stored bool, err error) {
	ttl, terr := optional("ttl", ttl)
	err = c.s.check(ctx, "cache.set-if-absent", key, firstErr(ValidateKey(key), c.s.checkValue(value), terr), func() (err error) {
		stored, err = c.d.SetIfAbsent(ctx, key, value, ttl)
		return err
	})
	return stored, err
}

// Delete removes key's entry.
func (c *Cache) Delete(ctx context.Context, key string) (ok bool, err error) {
	err = c.s.check(ctx, "cache.delete", key, ValidateKey(key), func() (err error) {
		ok, err = c.d.Delete(ctx, key)
		return err
	})
	return ok, err
}

// Has reports whether key has a live entry.
func (c *Cache) Has(ctx context.Context, key string) (ok bool, err error) {
	err = c.s.check(ctx, "cache.has", key, ValidateKey(key), func() (err error) {
		ok, err = c.d.Has(ctx, key)
		return err
	})
	return ok, err
}

// Clear deletes every cache entry of the store's namespace.
func (c *Cache) Clear(ctx context.Context) (n int64, err error) {
	err = c.s.call(ctx, "cache.clear", "", func() (err error) {
		n, err = c.d.Clear(ctx)
		return err
	})
	return n, err
}

// Keys returns the live keys matching the glob pattern.
func (c *Cache) Keys(ctx context.Context, pattern string) (keys []string, err error) {
	p, perr := ParsePattern(pattern)
	err = c.s.check(ctx, "cache.keys", "", perr, func() (err error) {
		keys, err = c.d.Keys(ctx, p)
		return err
	})
	return keys, err
}

// ---------------------------------------------------------------------------
// Idempotency

// Idempotency is the checked idempotency primitives of a Store; see
// driver.Idempotency. Most users want idempotency.Do instead.
type Idempotency struct {
	s *Store
	d driver.Idempotency
}

// Claim claims key for owner for lease.
func (i *Idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (rec driver.IdemRecord, out driver.ClaimOutcome, err error) {
	lease, lerr := positive("lease", lease)
	var ferr error
	if len(fingerprint) > driver.MaxKeyBytes {
		ferr = fmt.Errorf("%w: fingerprint longer than %d bytes", ErrInvalidArgument, driver.MaxKeyBytes)
	}
	err = i.s.check(ctx, "idempotency.claim", key, firstErr(ValidateKey(key), ownerErr(owner), lerr, ferr), func() (err error) {
		rec, out, err = i.d.Claim(ctx, key, owner, lease, fingerprint)
		return err
	})
	return rec, out, err
}

// Extend renews owner's claim to now+lease.
func (i *Idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (ok bool, err error) {
	lease, lerr := positive("lease", lease)
	err = i.s.check(ctx, "idempotency.extend", key, firstErr(ValidateKey(key), ownerErr(owner), lerr), func() (err error) {
		ok, err = i.d.Extend(ctx, key, owner, lease)
		return err
	})
	return ok, err
}

// Complete stores owner's result, kept for retain (0: until deleted).
func (i *Idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (ok bool, err error) {
	retain, rerr := optional("retention", retain)
	err = i.s.check(ctx, "idempotency.complete", key, firstErr(ValidateKey(key), ownerErr(owner), i.s.checkValue(result), rerr), func() (err error) {
		ok, err = i.d.Complete(ctx, key, owner, result, retain)
		return err
	})
	return ok, err
}

// Abandon gives owner's claim back.
func (i *Idempotency) Abandon(ctx context.Context, key, owner string) (ok bool, err error) {
	err = i.s.check(ctx, "idempotency.abandon", key, firstErr(ValidateKey(key), ownerErr(owner)), func() (err error) {
		ok, err = i.d.Abandon(ctx, key, owner)
		return err
	})
	return ok, err
}

// Get returns key's live record.
func (i *Idempotency) Get(ctx context.Context, key string) (rec driver.IdemRecord, found bool, err error) {
	err = i.s.check(ctx, "idempotency.get", key, ValidateKey(key), func() (err error) {
		rec, found, err = i.d.Get(ctx, key)
		return err
	})
	return rec, found, err
}

// Set stores a completed result directly (ttl 0: until deleted).
func (i *Idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	ttl, terr := optional("ttl", ttl)
	return i.s.check(ctx, "idempotency.set", key, firstErr(ValidateKey(key), i.s.checkValue(result), terr), func() error {
		return i.d.Set(ctx, key, result, ttl)
	})
}

// Delete removes key's record.
func (i *Idempotency) Delete(ctx context.Context, key string) (ok bool, err error) {
	err = i.s.check(ctx, "idempotency.delete", key, ValidateKey(key), func() (err error) {
		ok, err = i.d.Delete(ctx, key)
		return err
	})
	return ok, err
}

// List returns the live records whose keys match the glob pattern.
func (i *Idempotency) List(ctx context.Context, pattern string) (recs []driver.IdemRecord, err error) {
	p, perr := ParsePattern(pattern)
	err = i.s.check(ctx, "idempotency.list", "", perr, func() (err error) {
		recs, err = i.d.List(ctx, p)
		return err
	})
	return recs, err
}

// ---------------------------------------------------------------------------
// Checkpoints

// Checkpoints is the checked checkpoint primitives of a Store; see
// driver.Checkpoints. Most users want checkpoint.Run instead.
type Checkpoints struct {
	s *Store
	d driver.Checkpoints
}

// Save stores a checkpoint with the task's next sequence. ok=false: refused,
// because in.Token (> 0) is below the task's fence — a greater token has
// been saved or fenced for the task; see driver.Checkpoints.
func (c *Checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (cp driver.Checkpoint, ok bool, err error) {
	var aerr error
	switch {
	case math.IsNaN(in.Progress) || in.Progress < 0 || in.Progress > 100:
		aerr = fmt.Errorf("%w: progress %v is outside 0–100", ErrInvalidArgument, in.Progress)
	case in.ETA < 0:
		aerr = fmt.Errorf("%w: negative ETA", ErrInvalidArgument)
	case in.Token < 0:
		aerr = fmt.Errorf("%w: negative fencing token", ErrInvalidArgument)
	}
	in.ETA = time.Duration(driver.Millis(in.ETA)) * time.Millisecond
	err = c.s.check(ctx, "checkpoint.save", in.TaskID, firstErr(ValidateKey(in.TaskID), c.s.checkValue(in.Data), aerr), func() (err error) {
		cp, ok, err = c.d.Save(ctx, in)
		return err
	})
	return cp, ok, err
}

// Fence raises the task's fence to token (> 0), so that the store refuses
// every later save with a smaller token. ok=false: the fence is already
// greater, so the caller's token is stale. See driver.Checkpoints.
func (c *Checkpoints) Fence(ctx context.Context, taskID string, token int64) (ok bool, err error) {
	var aerr error
	if token <= 0 {
		aerr = fmt.Errorf("%w: fencing token %d is not positive", ErrInvalidArgument, token)
	}
	err = c.s.check(ctx, "checkpoint.fence", taskID, firstErr(ValidateKey(taskID), aerr), func() (err error) {
		ok, err = c.d.Fence(ctx, taskID, token)
		return err
	})
	return ok, err
}

// Load returns the checkpoint with this id.
func (c *Checkpoints) Load(ctx context.Context, id string) (cp driver.Checkpoint, found bool, err error) {
	err = c.s.check(ctx, "checkpoint.load", id, checkpointIDErr(id), func() (err error) {
		cp, found, err = c.d.Load(ctx, id)
		return err
	})
	return cp, found, err
}

// Latest returns the task's newest checkpoint.
func (c *Checkpoints) Latest(ctx context.Context, taskID string) (cp driver.Checkpoint, found bool, err error) {
	err = c.s.check(ctx, "checkpoint.latest", taskID, ValidateKey(taskID), func() (err error) {
		cp, found, err = c.d.Latest(ctx, taskID)
		return err
	})
	return cp, found, err
}

// List returns the task's checkpoints in sequence order.
func (c *Checkpoints) List(ctx context.Context, taskID string) (cps []driver.Checkpoint, err error) {
	err = c.s.check(ctx, "checkpoint.list", taskID, ValidateKey(taskID), func() (err error) {
		cps, err = c.d.List(ctx, taskID)
		return err
	})
	return cps, err
}

// Cleanup keeps the task's keep newest checkpoints and deletes the rest,
// unfenced (for operators): CleanupFenced with token 0.
func (c *Checkpoints) Cleanup(ctx context.Context, taskID string, keep int) (n int64, err error) {
	n, _, err = c.CleanupFenced(ctx, taskID, keep, 0)
	return n, err
}

// CleanupFenced keeps the task's keep newest checkpoints and deletes the
// rest, unless token (> 0) is below the task's fence: then it deletes
// nothing and returns ok=false (a newer lease holder exists). Token 0 is
// not fenced. See driver.Checkpoints.
func (c *Checkpoints) CleanupFenced(ctx context.Context, taskID string, keep int, token int64) (n int64, ok bool, err error) {
	var aerr error
	switch {
	case keep < 0:
		aerr = fmt.Errorf("%w: keep %d is negative", ErrInvalidArgument, keep)
	case token < 0:
		aerr = fmt.Errorf("%w: negative fencing token", ErrInvalidArgument)
	}
	err = c.s.check(ctx, "checkpoint.cleanup", taskID, firstErr(ValidateKey(taskID), aerr), func() (err error) {
		n, ok, err = c.d.Cleanup(ctx, taskID, keep, token)
		return err
	})
	return n, ok, err
}

// DeleteAll deletes every checkpoint of the task, unfenced (for
// operators): DeleteAllFenced with token 0.
func (c *Checkpoints) DeleteAll(ctx context.Context, taskID string) (n int64, err error) {
	n, _, err = c.DeleteAllFenced(ctx, taskID, 0)
	return n, err
}

// DeleteAllFenced deletes every checkpoint of the task, unless token (> 0)
// is below the task's fence: then it deletes nothing and returns ok=false
// (a newer lease holder exists, whose checkpoints must stay). Token 0 is
// not fenced. See driver.Checkpoints.
func (c *Checkpoints) DeleteAllFenced(ctx context.Context, taskID string, token int64) (n int64, ok bool, err error) {
	var aerr error
	if token < 0 {
		aerr = fmt.Errorf("%w: negative fencing token", ErrInvalidArgument)
	}
	err = c.s.check(ctx, "checkpoint.delete-all", taskID, firstErr(ValidateKey(taskID), aerr), func() (err error) {
		n, ok, err = c.d.DeleteAll(ctx, taskID, token)
		return err
	})
	return n, ok, err
}

// Tasks returns the ids of tasks with checkpoints matching the glob.
func (c *Checkpoints) Tasks(ctx context.Context, pattern string) (ids []string, err error) {
	p, perr := ParsePattern(pattern)
	err = c.s.check(ctx, "checkpoint.tasks", "", perr, func() (err error) {
		ids, err = c.d.Tasks(ctx, p)
		return err
	})
	return ids, err
}

// checkpointIDErr checks a checkpoint id. An id made by
// driver.CheckpointID is a task id, a colon and a sequence number, so it may
// be up to 20 bytes longer than a key; anything else must at least be a
// valid key (and is simply not found).
func checkpointIDErr(id string) error {
	if task, _, ok := driver.ParseCheckpointID(id); ok {
		return ValidateKey(task)
	}
	return ValidateKey(id)
}
