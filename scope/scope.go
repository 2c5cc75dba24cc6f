package scope

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/valid"
	"github.com/warden-go/warden/lock"
)

// The operations reported to the Hook (warden.OpInfo.Op). Key is the
// task's name, except for OpLeaseLost, whose Key is the key of the
// holding that was lost.
const (
	// OpTaskStart: a task began (it has its concurrency slot). Duration
	// is 0.
	OpTaskStart = "scope.task.start"
	// OpTask: a task ended; Start and Duration cover the whole task, Err
	// is its error (nil on success).
	OpTask = "scope.task"
	// OpRetry: an attempt failed and another follows after a back-off;
	// Start and Duration cover the attempt, Err is its error.
	// TaskFromContext(ctx).Attempt is the attempt that failed.
	OpRetry = "scope.task.retry"
	// OpLeaseLost: a holding of the task — the lease of Lock or of
	// Checkpoint, or the claim of Idempotent — could no longer be proven
	// held; the task's context was cancelled. Err matches
	// warden.ErrLeaseLost.
	OpLeaseLost = "scope.task.lease-lost"
)

// Option configures Run. Options are applied in order; a later one
// overrides an earlier one.
type Option func(*config)

// config is what the Options of one Run resolve to.
type config struct {
	store   *warden.Store
	hook    warden.Hook
	limit   int
	collect bool
	lockO   *lock.Options
	brO     *breaker.Options
	idemO   *idempotency.Options
	cpO     *checkpoint.Options
	err     error // the first invalid option
}

// inherit is the part of a scope's configuration a nested Run starts
// from: the store, the hook and the options of the capabilities, but not
// the limit or the error policy, which belong to each Run.
func (c config) inherit() config {
	return config{store: c.store, hook: c.hook, lockO: c.lockO, brO: c.brO, idemO: c.idemO, cpO: c.cpO}
}

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// WithStore gives the scope's tasks their store: Lock, Breaker,
// Idempotent and Checkpoint name only keys, and their records live in
// st's namespace. A nested Run (one whose ctx is a task's or the scope's
// context) inherits it. A nil st is an error matching
// warden.ErrInvalidArgument.
func WithStore(st *warden.Store) Option {
	return func(c *config) {
		if st == nil {
			c.fail(valid.Nil("scope", "store"))
		}
		c.store = st
	}
}

// WithHook reports every task's start, end, retries and lost leases to
// h, as warden.Hook reports store operations (see the Op constants): one
// call per event, with the task's context (TaskFromContext gives its name
// and attempt), on the task's goroutine — OpLeaseLost on one the task
// waits for before it ends, at the moment of the loss. h must be fast and
// safe for concurrent use. A nested Run inherits it. Nil: no reports.
func WithHook(h warden.Hook) Option {
	return func(c *config) { c.hook = h }
}

// WithLimit lets at most n tasks of the scope run at once; the others
// wait, in their own goroutines, for a slot (Go never blocks). A running
// task keeps its slot while it waits — for a lock, for another task of
// the scope, for the scope's end — so n tasks waiting for something only
// a queued task can bring about wait forever. 0: no limit. A negative n
// is an error matching warden.ErrInvalidArgument. A nested Run has its
// own limit.
func WithLimit(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.fail(fmt.Errorf("scope: %w: limit %d is negative", warden.ErrInvalidArgument, n))
		}
		c.limit = n
	}
}

// WithCollectErrors makes a task's error not cancel its siblings: every
// task runs to its end and Run returns all the errors (the body's and the
// tasks', in the order they ended) joined with errors.Join. Without it
// the first error cancels the scope's context and Run returns that error
// alone.
func WithCollectErrors() Option {
	return func(c *config) { c.collect = true }
}

// WithLockOptions configures the Locker the scope makes on first need
// (for Lock, Checkpoint and Scope.Locker), with lock.New. Nil: lock's
// defaults. A nested Run inherits it.
func WithLockOptions(o *lock.Options) Option {
	return func(c *config) { c.lockO = o }
}

// WithBreakerOptions configures the Breakers the scope makes, one per
// name, on first need (for Breaker and Scope.Breaker), with breaker.New.
// Nil: breaker's defaults. A nested Run inherits it.
func WithBreakerOptions(o *breaker.Options) Option {
	return func(c *config) { c.brO = o }
}

// WithIdempotencyOptions configures the idempotency.Do calls of
// Idempotent tasks (their lease, retention, NoWait, CacheErrors,
// fingerprint, codec). Nil: idempotency's defaults. A nested Run inherits
// it.
func WithIdempotencyOptions(o *idempotency.Options) Option {
	return func(c *config) { c.idemO = o }
}

// WithCheckpointOptions configures the checkpoint.Run calls of Checkpoint
// tasks (Keep, CleanupEvery, KeepOnSuccess, Codec, NoWait). Its Lock,
// Locker and LockOptions are ignored: a checkpointed task always runs
// under the task's lock, taken with the scope's Locker (WithLockOptions).
// Nil: checkpoint's defaults. A nested Run inherits it.
func WithCheckpointOptions(o *checkpoint.Options) Option {
	return func(c *config) { c.cpO = o }
}

// Scope is the handle a Run body and its tasks start tasks with. It is
// valid until Run returns; its methods are safe for concurrent use.
type Scope struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	cfg    config
	sem    chan struct{} // nil without a limit

	mu      sync.Mutex
	idle    *sync.Cond // signalled when running drops to 0
	running int        // tasks started and not yet ended
	closed  bool       // Run is returning: no more tasks
	seq     int        // tasks started, for default names
	first   error      // the first error (without WithCollectErrors)
	errs    []error    // every error (WithCollectErrors)

	resMu     sync.Mutex
	resClosed bool
	locker    *lock.Locker
	breakers  map[string]*breaker.Breaker
}

type scopeKey struct{}

// Run runs body with a new Scope and returns only after body and every
// task started in the scope have ended. The scope's context (Scope.Context,
// and the context of each task) is derived from ctx; the first error —
// body's or a task's — cancels it, with that error as its cause, and is
// what Run returns (WithCollectErrors: every error, joined). A task's error
// is returned as "scope: task NAME: " followed by the error, which it
// wraps. A panic in body or in a task is recovered and becomes a
// *PanicError carrying the stack.
//
// When Run returns, no goroutine it or its tasks started is running, and
// the Locker and Breakers the scope made are closed (leases taken with
// Scope.Locker and still held are released).
//
// If ctx is a scope's context or a task's (a nested Run), the new scope
// inherits that scope's store, hook and capability options; the options
// given here override them. Invalid options are returned, matching
// warden.ErrInvalidArgument, before body is called; a nil body is such an
// error too.
func Run(ctx context.Context, body func(s *Scope) error, opts ...Option) (err error) {
	var cfg config
	if parent, ok := ctx.Value(scopeKey{}).(*Scope); ok {
		cfg = parent.cfg.inherit()
	}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.err != nil:
		return cfg.err
	case body == nil:
		return valid.Nil("scope", "body")
	}
	s := &Scope{cfg: cfg}
	s.idle = sync.NewCond(&s.mu)
	if cfg.limit > 0 {
		s.sem = make(chan struct{}, cfg.limit)
	}
	s.ctx, s.cancel = context.WithCancelCause(context.WithValue(ctx, scopeKey{}, s))

	s.record(runBody(s, body))
	s.mu.Lock()
	for s.running > 0 {
		s.idle.Wait()
	}
	s.closed = true
	err = s.result()
	s.mu.Unlock()
	s.cancel(context.Canceled)
	s.closeResources()
	return err
}

// runBody calls body, turning a panic into a *PanicError.
func runBody(s *Scope, body func(*Scope) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return body(s)
}

// record notes a task's or the body's error: the first one cancels the
// scope, unless errors are collected.
func (s *Scope) record(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	first := false
	if s.cfg.collect {
		s.errs = append(s.errs, err)
	} else if s.first == nil {
		s.first, first = err, true
	}
	s.mu.Unlock()
	if first {
		s.cancel(err)
	}
}

// result is Run's error; s.mu is held.
func (s *Scope) result() error {
	if s.cfg.collect {
		return errors.Join(s.errs...)
	}
	return s.first
}

// enter registers a task about to start; false once Run is returning.
func (s *Scope) enter() (seq int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false
	}
	s.running++
	s.seq++
	return s.seq, true
}

// exit ends a task registered by enter.
func (s *Scope) exit() {
	s.mu.Lock()
	s.running--
	if s.running == 0 {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

// Context returns the scope's context: derived from Run's ctx, cancelled
// by the first error (unless WithCollectErrors) with that error as its
// cause, and when Run returns. Tasks' contexts derive from it.
func (s *Scope) Context() context.Context { return s.ctx }

// Store returns the scope's store (WithStore, or inherited); nil if none.
func (s *Scope) Store() *warden.Store { return s.cfg.store }

// Locker returns the scope's Locker — the one Lock and Checkpoint use —
// made on first call on the scope's store with WithLockOptions. It is
// closed when Run returns, which releases every lease taken with it that
// is still held. It is go-go-scope's s.acquireLock: take leases with its
// Acquire (waits) or TryAcquire (fails at once with lock.ErrLocked). The
// error matches warden.ErrInvalidArgument without a store, and
// warden.ErrClosed once Run has returned.
func (s *Scope) Locker() (*lock.Locker, error) {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	switch {
	case s.resClosed:
		return nil, fmt.Errorf("scope: Locker after Run returned: %w", warden.ErrClosed)
	case s.locker != nil:
		return s.locker, nil
	case s.cfg.store == nil:
		return nil, errNoStore("a Locker")
	}
	l, err := lock.New(s.cfg.store, s.cfg.lockO)
	if err != nil {
		return nil, fmt.Errorf("scope: %w", err)
	}
	s.locker = l
	return l, nil
}

// Breaker returns the scope's Breaker for circuit name — the one the
// Breaker task option uses — made on first call for that name on the
// scope's store with WithBreakerOptions, and closed when Run returns. The
// error matches warden.ErrInvalidArgument without a store (or for bad
// breaker options), warden.ErrInvalidKey for a bad name, and
// warden.ErrClosed once Run has returned.
func (s *Scope) Breaker(name string) (*breaker.Breaker, error) {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	switch {
	case s.resClosed:
		return nil, fmt.Errorf("scope: Breaker after Run returned: %w", warden.ErrClosed)
	case s.breakers[name] != nil:
		return s.breakers[name], nil
	case s.cfg.store == nil:
		return nil, errNoStore("a Breaker")
	}
	b, err := breaker.New(s.cfg.store, name, s.cfg.brO)
	if err != nil {
		return nil, fmt.Errorf("scope: %w", err)
	}
	if s.breakers == nil {
		s.breakers = map[string]*breaker.Breaker{}
	}
	s.breakers[name] = b
	return b, nil
}

// closeResources closes the Locker and the Breakers once every task has
// ended.
func (s *Scope) closeResources() {
	s.resMu.Lock()
	s.resClosed = true
	l, bs := s.locker, s.breakers
	s.resMu.Unlock()
	for _, b := range bs {
		_ = b.Close() // waits for its outcome writes; always nil
	}
	if l != nil {
		if err := l.Close(); err != nil && s.cfg.store != nil {
			s.cfg.store.Logger().Warn("warden scope: releasing the scope's leases failed", "error", err)
		}
	}
}

func errNoStore(what string) error {
	return fmt.Errorf("scope: %w: %s needs a store (scope.WithStore)", warden.ErrInvalidArgument, what)
}

// emit reports one event to the hook.
func (s *Scope) emit(ctx context.Context, op, key string, start time.Time, d time.Duration, err error) {
	if s.cfg.hook == nil {
		return
	}
	name := ""
	if s.cfg.store != nil {
		name = s.cfg.store.Name()
	}
	s.cfg.hook.AfterOp(ctx, warden.OpInfo{Store: name, Op: op, Key: key, Start: start, Duration: d, Err: err})
}

// PanicError is the error of a task (or Run body) that panicked: the
// value it panicked with and the stack of its goroutine at the panic.
// A task that called runtime.Goexit gets one too, with a nil Value.
type PanicError struct {
	Value any
	Stack []byte
}

// Error gives the panic value and the stack.
func (e *PanicError) Error() string {
	if e.Value == nil {
		return fmt.Sprintf("scope: runtime.Goexit called\n\n%s", e.Stack)
	}
	return fmt.Sprintf("scope: panic: %v\n\n%s", e.Value, e.Stack)
}

// Unwrap returns the panic value if it is an error, so that errors.Is
// and errors.As see through a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
