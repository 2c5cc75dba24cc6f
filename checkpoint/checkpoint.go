// Package checkpoint runs resumable tasks: a task saves its state as it
// goes, and after a crash or a failure the next run of the same task
// continues from the last saved state instead of starting over.
//
//	err := checkpoint.Run(ctx, st, "import-2024", nil, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
//		next, _ := cp.State() // 0 on a fresh start
//		for ; next < len(rows); next++ {
//			if err := importRow(ctx, rows[next]); err != nil {
//				return err // the next Run resumes from the last Save
//			}
//			if err := cp.Save(ctx, next+1, 100*float64(next+1)/float64(len(rows))); err != nil {
//				return err
//			}
//		}
//		return nil // done: the task's checkpoints are deleted
//	})
//
// Checkpoints are kept in the store (driver.Checkpoint records: a sequence
// per task assigned by the store, the time, the progress 0–100, the state
// encoded with the codec, an optional estimated time remaining and the
// saver's fencing token). Run keeps the newest Options.Keep of them and
// deletes all of them when the task succeeds, unless
// Options.KeepOnSuccess.
//
// # Guarding a task with a lock
//
// With Options.Lock, Run holds a lock (package lock) on the lock key
// "checkpoint:" + task id while the task runs (for a task id too long for
// that, "checkpoint#" + the hex SHA-256 of the task id), so two workers
// never run the same task at once, and fences the task's saves: right
// after taking the lock, before reading the task's state, Run raises the
// task's fence in the store to the lease's fencing token
// (warden.Checkpoints.Fence), and every Save carries that token. The store
// refuses a save whose token is below the task's fence, so a worker whose
// lease was lost (a "zombie") gets ErrStale as soon as its successor holds
// the lock — even before the successor's first save — and cannot
// overwrite newer progress. The fence outlives the task's checkpoints: a
// zombie's save that arrives after its successor finished and deleted them
// is refused too, so the next Run does not resume from a stale state. (On
// stores where a save is two writes, a save that passed the fence just
// before the successor's Fence may still write its checkpoint late; once
// a deletion has covered it, the store never returns it.) Deletions are
// fenced as well: the cleanups after each save and the deletion after
// success carry the lease's token, so a zombie's late deletion never
// deletes its successor's checkpoints.
//
// The task's context is derived from the lease's: it is cancelled in the
// same instant as the lease is lost (its Err consults the lease's clock,
// like Lease.Err), and Save refuses to write once this process knows the
// lease is lost. Cursor.Lease gives the lease.
package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/valid"
	"github.com/warden-go/warden/lock"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrNotFound: the task has no checkpoint.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrStale: a save (or Run's fencing of the task) was refused because
	// a newer holder of the task's lock has fenced the task since (or
	// this process knows its lease is lost). The error also matches
	// lock.ErrLeaseLost.
	ErrStale = errors.New("checkpoint: stale save refused")
)

// DefaultKeep is how many checkpoints Run keeps when Options.Keep is zero.
const DefaultKeep = 10

// Options configure Run. The zero value (or nil) keeps the newest 10
// checkpoints, deletes them on success, encodes states as JSON and takes
// no lock.
type Options struct {
	// Keep is how many of the newest checkpoints are kept while the task
	// runs. 0: DefaultKeep (10).
	Keep int
	// CleanupEvery is how many saves pass between two deletions of the
	// checkpoints beyond Keep (each is one more store request). 0: 1,
	// after every save; with n, up to Keep+n-1 checkpoints exist at once.
	CleanupEvery int
	// KeepOnSuccess keeps the task's checkpoints when fn succeeds. false:
	// they are all deleted.
	KeepOnSuccess bool
	// Codec encodes states. Nil: warden.JSONCodec.
	Codec warden.Codec
	// Lock guards the task with a lock so that it never runs twice at
	// once, and fences every save with the lease's token (see the package
	// documentation). Setting Locker or LockOptions also enables it.
	Lock bool
	// Locker takes the lock. Nil: Run makes one on the store with
	// LockOptions and closes it when done.
	Locker *lock.Locker
	// LockOptions configure the Locker Run makes when Locker is nil. Nil:
	// the lock package's defaults.
	LockOptions *lock.Options
	// NoWait makes Run fail with an error matching lock.ErrLocked when the
	// task is locked by another worker. false: Run waits for the lock
	// until ctx ends.
	NoWait bool
	// Observe, if set, is told whether the task resumes and of every
	// save (see Observation), for telemetry: otelwarden.Telemetry.Checkpoint
	// is one. It is called after the fact, on the goroutine of Run or of
	// the Save, with its context. It must be quick and safe for
	// concurrent use, and must not panic. Nil: nothing is observed, at no
	// cost.
	Observe func(ctx context.Context, o Observation)
}

// Run runs the task taskID: it loads the task's newest checkpoint, calls fn
// with a Cursor that holds its state (State reports false on a fresh
// start), and returns fn's error. While fn runs it saves checkpoints with
// Cursor.Save; the newest Options.Keep are kept. If fn returns nil, the
// task's checkpoints are deleted (unless Options.KeepOnSuccess); if it
// returns an error they stay, so that the next Run of taskID resumes from
// the last save.
//
// With Options.Lock, Run fences the task with the lease's token before it
// loads the newest checkpoint (an error matching ErrStale if a newer token
// has fenced it already), and fn runs under the task's lock with a context
// derived from the lease's: it is cancelled when ctx ends, and in the same
// instant as the lease when the lease is lost (Cursor.Lease gives the
// lease; when Run waited for the lock, lock.LeaseFromContext does too). If
// the lease was lost, the returned error matches lock.ErrLeaseLost and the
// checkpoints are not deleted even if fn returned nil; the deletion is
// also fenced, so it deletes nothing once a newer holder has fenced the
// task (an error matching ErrStale). Panics in fn are not recovered; the
// lock is released on the way out.
func Run[T any](ctx context.Context, st *warden.Store, taskID string, opts *Options, fn func(ctx context.Context, cp *Cursor[T]) error) (err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	switch {
	case st == nil:
		return valid.Nil("checkpoint", "store")
	case fn == nil:
		return valid.Nil("checkpoint", "function")
	case o.Keep < 0 || o.CleanupEvery < 0:
		return fmt.Errorf("%w: checkpoint Keep and CleanupEvery must not be negative", warden.ErrInvalidArgument)
	}
	if err := warden.ValidateKey(taskID); err != nil {
		return fmt.Errorf("checkpoint: task id: %w", err)
	}
	if o.Keep == 0 {
		o.Keep = DefaultKeep
	}
	if o.CleanupEvery == 0 {
		o.CleanupEvery = 1
	}
	if o.Codec == nil {
		o.Codec = warden.JSONCodec{}
	}

	cur := &Cursor[T]{st: st, taskID: taskID, codec: o.Codec, keep: o.Keep, every: o.CleanupEvery, observe: o.Observe}
	if !o.Lock && o.Locker == nil && o.LockOptions == nil {
		return runTask(ctx, ctx, st, cur, fn, o)
	}
	locker := o.Locker
	if locker == nil {
		if locker, err = lock.New(st, o.LockOptions); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		defer locker.Close()
	}
	// Lease.Run (lock.Do's core) gives fn a context derived from the
	// lease's: a loss cancels it in the same instant, and its Err consults
	// the lease's clock.
	var lease *lock.Lease
	if o.NoWait {
		lease, err = locker.TryAcquire(ctx, LockKey(taskID))
	} else {
		lease, err = locker.Acquire(ctx, LockKey(taskID))
	}
	if err != nil {
		return err
	}
	cur.lease, cur.token = lease, lease.Token()
	err = lease.Run(ctx, func(fctx context.Context) error { return runTask(ctx, fctx, st, cur, fn, o) })
	if err == lock.ErrLeaseLost { // the bare sentinel: the task returned nil, but the lease was lost
		err = fmt.Errorf("checkpoint: task %q: %w", taskID, err)
	}
	return err
}

// runTask runs the task under the lease of cur, if any: fctx is the
// context fn gets (bound to the lease), ctx the caller's.
func runTask[T any](ctx, fctx context.Context, st *warden.Store, cur *Cursor[T], fn func(ctx context.Context, cp *Cursor[T]) error, o Options) error {
	taskID := cur.taskID
	if cur.lease != nil {
		// Fence before reading: from here on, saves and deletions of
		// holders with older tokens are refused, so the state read below
		// is not overwritten by a zombie.
		ok, err := st.Checkpoints().Fence(fctx, taskID, cur.token)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: task %q: fenced with a newer token than %d (%w)", ErrStale, taskID, cur.token, lock.ErrLeaseLost)
		}
	}

	last, found, err := st.Checkpoints().Latest(fctx, taskID)
	if err != nil {
		return err
	}
	if found {
		if err := o.Codec.Unmarshal(last.Data, &cur.state); err != nil {
			return fmt.Errorf("checkpoint: decode %s: %w", last.ID, err)
		}
		cur.resumed, cur.has, cur.last = true, true, last
	}
	if o.Observe != nil {
		o.Observe(fctx, Observation{Kind: ObservedStart, TaskID: taskID, Resumed: found, Progress: last.Progress})
	}

	if err := fn(fctx, cur); err != nil {
		return err
	}
	if o.KeepOnSuccess {
		return nil
	}
	if cur.lease != nil {
		// Prove the lease is still held before deleting: a lost lease means
		// another worker may be running the task and own these checkpoints.
		if err := cur.lease.Refresh(ctx); err != nil {
			return fmt.Errorf("checkpoint: task %q finished, its checkpoints kept: %w", taskID, err)
		}
	}
	// Fenced by the lease's token: if the lease was lost after all and a
	// newer holder has fenced the task, nothing is deleted.
	_, ok, err := st.Checkpoints().DeleteAllFenced(ctx, taskID, cur.token)
	if err != nil {
		return fmt.Errorf("checkpoint: task %q finished, but deleting its checkpoints failed: %w", taskID, err)
	}
	if !ok {
		return fmt.Errorf("%w: task %q finished, but a holder with a newer token than %d has fenced it since; its checkpoints kept (%w)",
			ErrStale, taskID, cur.token, lock.ErrLeaseLost)
	}
	return nil
}

// LockKey returns the lock key that guards taskID with Options.Lock:
// "checkpoint:" + taskID, or "checkpoint#" + the hex SHA-256 of taskID
// when that would be longer than a key may be.
func LockKey(taskID string) string {
	const tag = "checkpoint:"
	if len(tag)+len(taskID) <= driver.MaxKeyBytes {
		return tag + taskID
	}
	sum := sha256.Sum256([]byte(taskID))
	return "checkpoint#" + hex.EncodeToString(sum[:])
}

// Cursor is a running task's view of its checkpoints, given to Run's fn.
// Its methods are safe for concurrent use.
type Cursor[T any] struct {
	st     *warden.Store
	taskID string
	codec  warden.Codec
	keep   int
	every  int
	lease  *lock.Lease // nil without Options.Lock
	token  int64

	observe func(context.Context, Observation) // Options.Observe

	mu      sync.Mutex
	state   T
	has     bool // state holds a loaded or saved state
	resumed bool
	last    driver.Checkpoint
	saves   int
}

// TaskID returns the task's id.
func (c *Cursor[T]) TaskID() string { return c.taskID }

// State returns the state to continue from — the one loaded when Run
// started, or the last one saved since — and whether there is one. On a
// fresh start it returns the zero T and false.
func (c *Cursor[T]) State() (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state, c.has
}

// Resumed reports whether this run started from a saved checkpoint.
func (c *Cursor[T]) Resumed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resumed
}

// Progress returns the progress (0–100) of the newest checkpoint, loaded
// or saved; 0 if none.
func (c *Cursor[T]) Progress() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Progress
}

// Last returns the newest checkpoint record, loaded or saved, without its
// decoded state; false if there is none yet.
func (c *Cursor[T]) Last() (driver.Checkpoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.has
}

// Token returns the fencing token every save carries: the task lease's
// with Options.Lock, else 0 (saves are not fenced).
func (c *Cursor[T]) Token() int64 { return c.token }

// Lease returns the lease on the task's lock with Options.Lock, else nil.
// fn's context ends the instant the lease does.
func (c *Cursor[T]) Lease() *lock.Lease { return c.lease }

// Save stores state as the task's newest checkpoint with progress (0–100).
// With Options.Lock it returns an error matching ErrStale (and
// lock.ErrLeaseLost) if the store refused the save because a newer lease
// holder has fenced the task, or if the lease is known to be lost; fn
// should then stop. A failure to delete old checkpoints afterwards is logged, not
// returned.
func (c *Cursor[T]) Save(ctx context.Context, state T, progress float64) error {
	return c.SaveETA(ctx, state, progress, 0)
}

// SaveETA is Save with an estimate of the time remaining (0: unknown).
func (c *Cursor[T]) SaveETA(ctx context.Context, state T, progress float64, eta time.Duration) error {
	if c.observe == nil {
		return c.save(ctx, state, progress, eta)
	}
	start := time.Now()
	err := c.save(ctx, state, progress, eta)
	c.observeSave(ctx, start, progress, err)
	return err
}

// save is SaveETA.
func (c *Cursor[T]) save(ctx context.Context, state T, progress float64, eta time.Duration) error {
	if c.lease != nil {
		if lerr := c.lease.Err(); lerr != nil {
			return fmt.Errorf("%w: task %q: the lease with token %d ended (%w)", ErrStale, c.taskID, c.token, lock.ErrLeaseLost)
		}
	}
	data, err := c.codec.Marshal(state)
	if err != nil {
		return fmt.Errorf("checkpoint: encode the state of %q: %w", c.taskID, err)
	}
	cp, ok, err := c.st.Checkpoints().Save(ctx, driver.CheckpointInput{
		TaskID: c.taskID, Progress: progress, Data: data, ETA: eta, Token: c.token,
	})
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: task %q: fenced with a newer token than %d (%w)", ErrStale, c.taskID, c.token, lock.ErrLeaseLost)
	}
	c.mu.Lock()
	c.state, c.has, c.last = state, true, cp
	c.saves++
	cleanup := c.saves%c.every == 0
	c.mu.Unlock()
	if cleanup {
		_, ok, err := c.st.Checkpoints().CleanupFenced(ctx, c.taskID, c.keep, c.token)
		switch {
		case err != nil:
			c.st.Logger().Warn("warden checkpoint: deleting old checkpoints failed", "task", c.taskID, "err", err)
		case !ok:
			c.st.Logger().Warn("warden checkpoint: deleting old checkpoints refused: a holder with a newer token has fenced the task",
				"task", c.taskID, "token", c.token)
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// operator helpers

// Latest returns taskID's newest checkpoint and its state decoded with
// opts.Codec (nil opts or Codec: warden.JSONCodec), or ErrNotFound. The
// other options do not apply.
func Latest[T any](ctx context.Context, st *warden.Store, taskID string, opts *Options) (T, driver.Checkpoint, error) {
	var state T
	if st == nil {
		return state, driver.Checkpoint{}, valid.Nil("checkpoint", "store")
	}
	var codec warden.Codec = warden.JSONCodec{}
	if opts != nil && opts.Codec != nil {
		codec = opts.Codec
	}
	cp, found, err := st.Checkpoints().Latest(ctx, taskID)
	if err != nil {
		return state, cp, err
	}
	if !found {
		return state, cp, ErrNotFound
	}
	if err := codec.Unmarshal(cp.Data, &state); err != nil {
		return state, cp, fmt.Errorf("checkpoint: decode %s: %w", cp.ID, err)
	}
	return state, cp, nil
}

// List returns taskID's checkpoints in increasing sequence (empty if none).
func List(ctx context.Context, st *warden.Store, taskID string) ([]driver.Checkpoint, error) {
	if st == nil {
		return nil, valid.Nil("checkpoint", "store")
	}
	return st.Checkpoints().List(ctx, taskID)
}

// Tasks returns the ids of the tasks that have checkpoints and match the
// glob pattern ('*' any run, '?' one character, '\' escapes; "" matches
// all), sorted.
func Tasks(ctx context.Context, st *warden.Store, pattern string) ([]string, error) {
	if st == nil {
		return nil, valid.Nil("checkpoint", "store")
	}
	return st.Checkpoints().Tasks(ctx, pattern)
}

// Delete deletes every checkpoint of taskID, so that its next Run starts
// afresh, and returns how many it deleted.
func Delete(ctx context.Context, st *warden.Store, taskID string) (int64, error) {
	if st == nil {
		return 0, valid.Nil("checkpoint", "store")
	}
	return st.Checkpoints().DeleteAll(ctx, taskID)
}
