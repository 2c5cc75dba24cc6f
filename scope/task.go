package scope

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/valid"
	"github.com/warden-go/warden/lock"
)

// TaskOption configures one task started with Go or Scope.Go. Whatever
// order they are given in, the capabilities compose in one fixed order,
// outermost first: the concurrency slot, Idempotent, Lock, Checkpoint,
// Retry, Breaker, Timeout, then the function (see the package
// documentation for the reasons).
type TaskOption func(*taskConfig)

// taskConfig is what the TaskOptions of one task resolve to.
type taskConfig struct {
	name       string
	lockKey    string
	hasLock    bool
	breaker    string
	hasBreaker bool
	idemKey    string
	hasIdem    bool
	cpTask     string
	cpRun      func(ctx context.Context, s *Scope, t *task, inner func(context.Context) error) error
	resumeOnly bool
	retry      *RetryPolicy
	timeout    time.Duration
	err        error // the first invalid option
}

func (c *taskConfig) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Name names the task in errors ("scope: task NAME: …"), in the hook's
// reports (OpInfo.Key) and in TaskFromContext. Default: the Idempotent
// key, else the Checkpoint task id, else the Lock key, else the Breaker
// name, else "task-N" (N counts the scope's tasks from 1).
func Name(name string) TaskOption {
	return func(c *taskConfig) { c.name = name }
}

// Lock runs the task while holding the lock key, taken with the scope's
// Locker (WithLockOptions): the task waits for the key, its context is the
// lease's (lock.LeaseFromContext gives the lease and its fencing token),
// and the lock is released when the task ends. If the lease is lost — an
// operator force-released the key, or it could not be refreshed in time —
// the task's context is cancelled in that instant, the hook hears
// OpLeaseLost, and the task's error matches warden.ErrLeaseLost (which is
// lock.ErrLeaseLost). Go-go-scope: s.acquireLock around a task.
func Lock(key string) TaskOption {
	return func(c *taskConfig) { c.lockKey, c.hasLock = key, true }
}

// Breaker runs each attempt of the task through the scope's Breaker for
// circuit name (WithBreakerOptions), shared with every process using the
// store: a rejected attempt returns an error matching breaker.ErrOpen
// without running the function, and Retry does not retry it.
// Go-go-scope: the circuitBreaker task and scope option.
func Breaker(name string) TaskOption {
	return func(c *taskConfig) { c.breaker, c.hasBreaker = name, true }
}

// Idempotent runs the task at most once for key across every process
// sharing the store, with idempotency.Do (WithIdempotencyOptions): a
// duplicate — in this scope, another one, or another process — gets the
// stored result without running anything, not even waiting for the task's
// lock. Results are stored with the options' codec (JSON by default), so
// the task's result type must round-trip through it. Go-go-scope: the
// idempotency task option.
func Idempotent(key string) TaskOption {
	return func(c *taskConfig) { c.idemKey, c.hasIdem = key, true }
}

// Checkpoint makes the task resumable as task id taskID, with
// checkpoint.Run and state type S (WithCheckpointOptions): the task runs
// under the lock checkpoint.LockKey(taskID) taken with the scope's Locker
// (so two workers never run it at once, and saves of a worker whose lease
// was lost are refused), starts from the task's last saved state, and its
// checkpoints are deleted when it succeeds. The task reaches its cursor
// with CursorFromContext[S](ctx): State gives the state to resume from,
// Save saves the next one. Retries continue from the last save without
// reloading. Go-go-scope: the checkpoint task option.
func Checkpoint[S any](taskID string) TaskOption {
	return func(c *taskConfig) {
		c.cpTask = taskID
		c.cpRun = func(ctx context.Context, s *Scope, t *task, inner func(context.Context) error) error {
			var o checkpoint.Options
			if s.cfg.cpO != nil {
				o = *s.cfg.cpO
			}
			l, err := s.Locker()
			if err != nil {
				return err
			}
			o.Lock, o.Locker, o.LockOptions = true, l, nil
			return checkpoint.Run(ctx, s.cfg.store, taskID, &o, func(ctx context.Context, cp *checkpoint.Cursor[S]) error {
				if t.cfg.resumeOnly && !cp.Resumed() {
					return fmt.Errorf("scope: task %q: ResumeOnly, and task %q has no checkpoint to resume from: %w",
						t.name, taskID, checkpoint.ErrNotFound)
				}
				defer t.watchLease(ctx, cp.Lease())()
				return inner(context.WithValue(ctx, cursorKey{}, cp))
			})
		}
	}
}

// ResumeOnly makes a Checkpoint task fail, without running its function,
// when its task id has no saved checkpoint: the error matches
// checkpoint.ErrNotFound. Without Checkpoint it is an error matching
// warden.ErrInvalidArgument. Go-go-scope: s.resumeTask with
// requireExisting.
func ResumeOnly() TaskOption {
	return func(c *taskConfig) { c.resumeOnly = true }
}

// Timeout bounds each attempt of the task: the attempt's context ends
// after d, and an attempt that returns context.DeadlineExceeded then
// fails with an error saying so (still matching
// context.DeadlineExceeded) that the Breaker counts as a failure and Retry
// retries. The function must watch its context: an attempt is never
// abandoned while it runs. To bound the whole task, retries included, give
// Run a context with a deadline. 0: no timeout; otherwise at least one
// millisecond. Go-go-scope: the timeout task option.
func Timeout(d time.Duration) TaskOption {
	return func(c *taskConfig) {
		if err := valid.Durations("scope", valid.D{Name: "Timeout", V: d}); err != nil {
			c.fail(err)
		}
		c.timeout = d
	}
}

// Defaults of RetryPolicy's zero values.
const (
	DefaultAttempts = 3
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 10 * time.Second
)

// RetryPolicy says how a task is retried. The zero value gives the
// defaults.
type RetryPolicy struct {
	// Attempts is how many times the function may run, the first
	// included. 0: DefaultAttempts (3). (Go-go-scope's max counts the
	// retries only: max n is Attempts n+1.)
	Attempts int
	// Min and Max bound the jittered exponential back-off between two
	// attempts: before attempt n+1 the task waits a random duration in
	// [d/2, d], d = Min·2ⁿ⁻¹ capped at Max — the back-off of warden's
	// lock waiters. 0: DefaultRetryMin (100 ms) and DefaultRetryMax
	// (10 s). A Max below Min is raised to Min.
	Min, Max time.Duration
	// If reports whether an error is worth another attempt. Nil: every
	// error is. Either way some errors are never retried: an open circuit
	// (breaker.ErrOpen — retries stop when the breaker opens), a lost
	// lease or claim (warden.ErrLeaseLost), invalid arguments and keys,
	// a closed store, a panic (*PanicError), and any error once the
	// task's context has ended.
	If func(err error) bool
}

// Retry retries the task's function after errors, with policy p (see
// RetryPolicy). Each attempt is one call through the Breaker and has its
// own Timeout; the attempts run under the task's lock, claim and
// checkpoint, which they do not take again. The hook hears OpRetry for
// every failed attempt that is followed by another. Go-go-scope: the
// retry task option with exponentialBackoff and jitter.
func Retry(p RetryPolicy) TaskOption {
	return func(c *taskConfig) {
		if p.Attempts < 0 {
			c.fail(fmt.Errorf("scope: %w: Retry Attempts %d is negative", warden.ErrInvalidArgument, p.Attempts))
		}
		if err := valid.Durations("scope", valid.D{Name: "Retry Min", V: p.Min}, valid.D{Name: "Retry Max", V: p.Max}); err != nil {
			c.fail(err)
		}
		c.retry = &p
	}
}

// TaskInfo describes a running task, as TaskFromContext gives it.
type TaskInfo struct {
	// Name is the task's name (see Name).
	Name string
	// Attempt is the attempt running, from 1 (always 1 without Retry);
	// outside an attempt — in the hook's OpTask report, say — the last
	// one that ran.
	Attempt int
}

type taskKey struct{}

type attemptKey struct{}

type cursorKey struct{}

// TaskFromContext returns the task whose context (or one derived from it)
// ctx is, and the attempt that runs; false outside a task. Hooks get the
// task's context, so they can tell which attempt an OpRetry report is
// about.
func TaskFromContext(ctx context.Context) (TaskInfo, bool) {
	t, ok := ctx.Value(taskKey{}).(*task)
	if !ok {
		return TaskInfo{}, false
	}
	n, ok := ctx.Value(attemptKey{}).(int)
	if !ok {
		n = int(t.attempt.Load())
	}
	return TaskInfo{Name: t.name, Attempt: max(n, 1)}, true
}

// CursorFromContext returns the checkpoint cursor of a task started with
// Checkpoint[S], from its context (or one derived from it); nil outside
// such a task, or if S is not the state type given to Checkpoint.
func CursorFromContext[S any](ctx context.Context) *checkpoint.Cursor[S] {
	cp, _ := ctx.Value(cursorKey{}).(*checkpoint.Cursor[S])
	return cp
}

// Handle is a task started with Go: wait for it with Wait, or select on
// Done. Its methods are safe for concurrent use.
type Handle[T any] struct {
	done chan struct{}
	v    T
	err  error
}

// Done returns a channel closed when the task has ended.
func (h *Handle[T]) Done() <-chan struct{} { return h.done }

// Wait waits for the task to end and returns its result and error (the
// task's own error, not wrapped with its name as Run returns it), or
// ctx's error if ctx ends first. After Run has returned, every handle of
// the scope has ended.
func (h *Handle[T]) Wait(ctx context.Context) (T, error) {
	select {
	case <-h.done:
		return h.v, h.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func ended[T any](err error) *Handle[T] {
	h := &Handle[T]{done: make(chan struct{}), err: err}
	close(h.done)
	return h
}

// Go starts fn as a task of s, in a goroutine of its own, and returns its
// handle at once (with WithLimit the task waits for a slot in that
// goroutine). fn's context derives from the scope's, and from whatever the
// options hold (the lease, the claim, the attempt's timeout). Its error
// counts for Run like any task's: without WithCollectErrors the first
// error cancels the scope. A panic in fn becomes a *PanicError.
//
// A task started while the scope is live runs fn, even if the scope is
// cancelled before its goroutine gets going (fn then sees its context
// done). A task started on a cancelled scope, and one still waiting for
// a concurrency slot when the scope is cancelled, end with the context's
// error without running fn. Go after Run has returned starts nothing: the
// handle's error matches warden.ErrClosed. A nil s or fn, or invalid options, give a task that
// fails at once with an error matching warden.ErrInvalidArgument.
// Go-go-scope: s.task(fn, options), awaited as the handle's Wait.
func Go[T any](s *Scope, fn func(ctx context.Context) (T, error), opts ...TaskOption) *Handle[T] {
	if s == nil {
		return ended[T](valid.Nil("scope", "Scope"))
	}
	var cfg taskConfig
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	seq, ok := s.enter()
	if !ok {
		return ended[T](fmt.Errorf("scope: Go after Run returned: %w", warden.ErrClosed))
	}
	t := &task{s: s, cfg: cfg, name: cfg.defaultName(seq), cancelled: s.ctx.Err()}
	h := &Handle[T]{done: make(chan struct{})}
	go runTask(t, h, fn)
	return h
}

// Go starts fn as a task of s, like the function Go, for a task without a
// result.
func (s *Scope) Go(fn func(ctx context.Context) error, opts ...TaskOption) *Handle[struct{}] {
	var f func(context.Context) (struct{}, error)
	if fn != nil {
		f = func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) }
	}
	return Go(s, f, opts...)
}

func (c *taskConfig) defaultName(seq int) string {
	switch {
	case c.name != "":
		return c.name
	case c.hasIdem:
		return c.idemKey
	case c.cpRun != nil:
		return c.cpTask
	case c.hasLock:
		return c.lockKey
	case c.hasBreaker:
		return c.breaker
	}
	return fmt.Sprintf("task-%d", seq)
}

// task is one running task.
type task struct {
	s         *Scope
	cfg       taskConfig
	name      string
	start     time.Time
	cancelled error        // the scope's ctx.Err() when Go was called
	attempt   atomic.Int64 // the attempt running or last run, with Retry

	lostOnce sync.Once
}

// runTask runs t in its own goroutine and ends it: the handle is done
// before the scope counts the task as ended, so that every handle has
// ended when Run returns.
func runTask[T any](t *task, h *Handle[T], fn func(context.Context) (T, error)) {
	s := t.s
	ctx := context.WithValue(s.ctx, taskKey{}, t)
	normal := false
	defer func() {
		if !normal { // runtime.Goexit in a layer: the goroutine ends anyway
			h.err = &PanicError{Stack: debug.Stack()}
			close(h.done)
			s.record(fmt.Errorf("scope: task %q: %w", t.name, h.err))
		}
		s.exit()
	}()
	h.v, h.err = run(ctx, t, fn)
	normal = true
	close(h.done)
	if h.err != nil {
		s.record(fmt.Errorf("scope: task %q: %w", t.name, h.err))
	}
}

// run checks t's options, waits for a concurrency slot, reports the
// task's start and end to the hook and runs its layers.
func run[T any](ctx context.Context, t *task, fn func(context.Context) (T, error)) (v T, err error) {
	s, c := t.s, &t.cfg
	switch {
	case c.err != nil:
		return v, c.err
	case t.cancelled != nil:
		return v, t.cancelled
	case fn == nil:
		return v, valid.Nil("scope", "function")
	case c.resumeOnly && c.cpRun == nil:
		return v, fmt.Errorf("scope: %w: ResumeOnly without Checkpoint", warden.ErrInvalidArgument)
	case s.cfg.store == nil && (c.hasIdem || c.hasLock || c.cpRun != nil || c.hasBreaker):
		return v, errNoStore(c.needsStore())
	}
	if s.sem != nil {
		select {
		case s.sem <- struct{}{}:
			defer func() { <-s.sem }()
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
	t.start = time.Now()
	s.emit(ctx, OpTaskStart, t.name, t.start, 0, nil)
	v, err = layers(ctx, t, fn)
	if errors.Is(err, warden.ErrLeaseLost) {
		t.reportLost(ctx, c.lostKey(), err) // a claim, or a loss not reported yet
	}
	s.emit(ctx, OpTask, t.name, t.start, time.Since(t.start), err)
	return v, err
}

// layers runs fn inside the task's options, in their one order, outermost
// first: Idempotent, Lock, Checkpoint, Retry, Breaker, Timeout. A panic,
// in fn or in a layer, becomes a *PanicError.
func layers[T any](ctx context.Context, t *task, fn func(context.Context) (T, error)) (v T, err error) {
	s, c := t.s, &t.cfg
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	call := func(ctx context.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &PanicError{Value: r, Stack: debug.Stack()}
			}
		}()
		v, err = fn(ctx)
		return err
	}
	if c.timeout > 0 {
		call = timeoutLayer(c.timeout, call)
	}
	if c.hasBreaker {
		inner := call
		call = func(ctx context.Context) error {
			b, err := s.Breaker(c.breaker)
			if err != nil {
				return err
			}
			return b.Do(ctx, inner)
		}
	}
	if c.retry != nil {
		call = retryLayer(t, *c.retry, call)
	}
	if c.cpRun != nil {
		inner := call
		call = func(ctx context.Context) error { return c.cpRun(ctx, s, t, inner) }
	}
	if c.hasLock {
		inner := call
		call = func(ctx context.Context) error {
			l, err := s.Locker()
			if err != nil {
				return err
			}
			return lock.Do(ctx, l, c.lockKey, func(ctx context.Context) error {
				defer t.watchLease(ctx, lock.LeaseFromContext(ctx))()
				return inner(ctx)
			})
		}
	}
	if c.hasIdem {
		return idempotency.Do(ctx, s.cfg.store, c.idemKey, s.cfg.idemO, func(ctx context.Context) (T, error) {
			err := call(ctx)
			return v, err
		})
	}
	err = call(ctx)
	return v, err
}

// needsStore names the first option that needs a store.
func (c *taskConfig) needsStore() string {
	switch {
	case c.hasIdem:
		return "Idempotent"
	case c.hasLock:
		return "Lock"
	case c.cpRun != nil:
		return "Checkpoint"
	}
	return "Breaker"
}

// lostKey is the key a loss found only in the task's error is reported
// under: the claim's if the task has one, else the lock's.
func (c *taskConfig) lostKey() string {
	switch {
	case c.hasIdem:
		return c.idemKey
	case c.hasLock:
		return c.lockKey
	}
	return c.cpTask
}

// reportLost tells the hook, once per task, that a holding was lost.
func (t *task) reportLost(ctx context.Context, key string, err error) {
	t.lostOnce.Do(func() { t.s.emit(ctx, OpLeaseLost, key, t.start, time.Since(t.start), err) })
}

// watchLease reports the loss of lease to the hook the moment its context
// is cancelled for it, not when the task returns; the returned stop ends
// the watch and waits for a report under way, so that no goroutine
// outlives the task.
func (t *task) watchLease(ctx context.Context, lease *lock.Lease) (stop func()) {
	if lease == nil || t.s.cfg.hook == nil {
		return func() {}
	}
	reported := make(chan struct{})
	stopWatch := context.AfterFunc(lease.Context(), func() {
		defer close(reported)
		if err := lease.Err(); errors.Is(err, lock.ErrLeaseLost) {
			t.reportLost(ctx, lease.Key(), fmt.Errorf("scope: task %q: lock %q: %w", t.name, lease.Key(), err))
		}
	})
	return func() {
		if !stopWatch() {
			<-reported
		}
	}
}

// timeoutLayer bounds each call of inner by d.
func timeoutLayer(d time.Duration, inner func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		err := inner(actx)
		if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && actx.Err() != nil {
			err = fmt.Errorf("scope: attempt timed out after %v: %w", d, err)
		}
		return err
	}
}

// retryLayer calls inner until it succeeds, the policy gives up or the
// error is not to be retried.
func retryLayer(t *task, p RetryPolicy, inner func(context.Context) error) func(context.Context) error {
	attempts := p.Attempts
	if attempts == 0 {
		attempts = DefaultAttempts
	}
	lo, hi := p.Min, p.Max
	if lo == 0 {
		lo = DefaultRetryMin
	}
	if hi == 0 {
		hi = DefaultRetryMax
	}
	hi = max(hi, lo)
	return func(ctx context.Context) error {
		for n := 1; ; n++ {
			actx := context.WithValue(ctx, attemptKey{}, n)
			t.attempt.Store(int64(n))
			start := time.Now()
			err := inner(actx)
			if err == nil || n >= attempts || !retryable(ctx, err, p.If) {
				return err
			}
			t.s.emit(actx, OpRetry, t.name, start, time.Since(start), err)
			timer := time.NewTimer(backoff(lo, hi, n-1))
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return err
			}
		}
	}
}

// backoff is the n-th (from 0) jittered exponential delay: a random
// duration in [d/2, d], d = lo·2ⁿ capped at hi.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	half := d / 2
	return half + rand.N(d-half+1)
}

// retryable reports whether err may be retried.
func retryable(ctx context.Context, err error, ok func(error) bool) bool {
	var pe *PanicError
	switch {
	case ctx.Err() != nil,
		errors.Is(err, breaker.ErrOpen),
		errors.Is(err, warden.ErrLeaseLost),
		errors.Is(err, warden.ErrInvalidArgument),
		errors.Is(err, warden.ErrInvalidKey),
		errors.Is(err, warden.ErrClosed),
		errors.As(err, &pe):
		return false
	}
	return ok == nil || ok(err)
}
