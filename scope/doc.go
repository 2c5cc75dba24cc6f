// Package scope is structured concurrency whose tasks run under warden's
// locks, circuit breakers, idempotency keys and checkpoints: go-go-scope's
// scope({persistence}), s.task(fn, {idempotency, checkpoint,
// circuitBreaker, retry, timeout}), s.acquireLock and s.resumeTask, in Go.
//
//	err := scope.Run(ctx, func(s *scope.Scope) error {
//		scope.Go(s, chargeCard, scope.Idempotent("charge:"+orderID), scope.Breaker("payments"),
//			scope.Retry(scope.RetryPolicy{Attempts: 5}), scope.Timeout(2*time.Second))
//		scope.Go(s, rebuildIndex, scope.Lock("index"), scope.Checkpoint[int]("index-rebuild"))
//		return nil
//	}, scope.WithStore(st), scope.WithLimit(8))
//
// # Scopes
//
// Run calls its body with a Scope and returns only after the body and
// every task started in the scope (with Go or Scope.Go, from the body or
// from tasks) have ended: no goroutine of the scope outlives Run. The
// first error, of the body or of a task, cancels the scope's context —
// every task's context derives from it — and is Run's result;
// WithCollectErrors lets every task finish instead and joins all errors.
// A panic in a task or in the body becomes a *PanicError with the stack.
// WithLimit bounds how many tasks run at once. A Run whose context is a
// task's (or a scope's) is nested: it inherits the outer scope's store,
// hook and capability options.
//
// # Tasks and their options
//
// Go starts a task with a typed result and returns a Handle to wait on;
// Scope.Go is the form for tasks without a result. Tasks name only keys;
// the store is the scope's (WithStore), and the capability packages'
// options are the scope's too (WithLockOptions, WithBreakerOptions,
// WithIdempotencyOptions, WithCheckpointOptions). The options are
// warden's portable packages, not new implementations: Lock is lock.Do on
// the scope's Locker, Breaker is breaker.Breaker.Do, Idempotent is
// idempotency.Do, Checkpoint is checkpoint.Run, and they behave as those
// packages document.
//
// # Order of composition
//
// However the options are listed, they wrap the task's function in one
// order, outermost first:
//
//	slot ⊃ Idempotent ⊃ Lock ⊃ Checkpoint ⊃ Retry ⊃ Breaker ⊃ Timeout ⊃ fn
//
// For these reasons:
//
//   - The concurrency slot (WithLimit) is taken first, so a task waiting
//     for one holds nothing in the store: no claim to renew, no lock that
//     keeps other processes waiting.
//   - Idempotent is outside Lock: a duplicate of a finished task gets the
//     stored result at once, without queueing for the lock, and of many
//     concurrent duplicates only the claimant waits for it. The result is
//     stored after everything inside, the lock's release included, is
//     done.
//   - Lock is outside Checkpoint: the task's saved state is read only once
//     the task holds its lock, and every save happens under it.
//     (Checkpoint also takes a lock of its own, checkpoint.LockKey(taskID),
//     which fences the saves with its token.)
//   - Checkpoint is outside Retry: the state is loaded and the task fenced
//     once; an attempt after a failure continues from the last save the
//     cursor holds.
//   - Retry is outside Breaker: every attempt is one call the breaker
//     counts, so failing retries themselves open the circuit, and the
//     attempt after the opening is rejected with breaker.ErrOpen, which is
//     never retried: retries stop when the breaker opens. With the breaker
//     outside, a task's whole retry loop would be one call — the circuit
//     could not open while a task hammers a dead dependency, nor stop it.
//     (This is the order of resilience4j's Retry(CircuitBreaker(…)).)
//   - Breaker is outside Timeout: an attempt that times out is a failure
//     the breaker counts, so a hanging dependency opens the circuit as a
//     failing one does; and each attempt has its own time. To bound a task
//     as a whole, retries included, give Run a context with a deadline.
//
// The function's context is therefore the claim's, the lease's, the
// checkpoint's and the attempt's at once: the loss of the lock (an
// operator force-released it, or it could not be renewed) or of the claim
// cancels it in that instant, and the task's error then matches
// warden.ErrLeaseLost.
//
// # Observability
//
// WithHook reports each task's start (OpTaskStart), end (OpTask, with its
// duration and error), retries (OpRetry, one per failed attempt that is
// retried) and lost holdings (OpLeaseLost) to a warden.Hook — the
// interface that reports store operations (warden.Options.Hook), so one
// hook can see both. TaskFromContext gives the task's name and attempt
// from the context the hook receives.
//
// # Coming from go-go-scope
//
// Each persistence feature of go-go-scope and its spelling here:
//
//	go-go-scope                                      warden scope
//	-----------                                      ------------
//	scope({ persistence: adapter })                  scope.Run(ctx, body, scope.WithStore(st))
//	persistence.lock / .circuitBreaker / .cache /    one *warden.Store (warden.Open(ctx, url)) for every
//	  .idempotency / .checkpoint providers             capability, in its namespace (?prefix=)
//	scope({ parent }), s.createChild()               scope.Run(taskCtx, body): inherits store, hook, options
//	scope({ concurrency: n })                        scope.WithLimit(n)
//	scope({ hooks: { beforeTask, afterTask } })      scope.WithHook(h): OpTaskStart, OpTask (+ OpRetry, OpLeaseLost)
//	const lock = await s.acquireLock(key, ttl)       l, err := s.Locker(); lease, err := l.TryAcquire(ctx, key)
//	  (null when held; lock.release())                 (lock.ErrLocked when held; lease.Release(ctx); TTL:
//	                                                   WithLockOptions; released at the latest when Run returns)
//	s.task(fn, opts) … [err, v] = await task         h := scope.Go(s, fn, opts...); v, err := h.Wait(ctx)
//	{ id: "x" }                                      scope.Name("x")
//	lock held around a task                          scope.Lock(key): the task's ctx is the lease's
//	{ idempotency: { key, ttl } }                    scope.Idempotent(key), Retain: WithIdempotencyOptions
//	scope({ idempotency: { defaultTTL } })           scope.WithIdempotencyOptions(&idempotency.Options{Retain: ttl})
//	{ id, checkpoint: { maxCheckpoints } }           scope.Checkpoint[S](id), Keep: WithCheckpointOptions
//	ctx.checkpoint.data / .save(d)                   cp := scope.CursorFromContext[S](ctx); cp.State(); cp.Save(ctx, d, pct)
//	ctx.progress.update(pct)                         the progress argument of cp.Save
//	checkpoint.onResume                              cp.Resumed()
//	s.resumeTask(id, fn, { requireExisting })        scope.Go(s, fn, scope.Checkpoint[S](id), scope.ResumeOnly())
//	{ circuitBreaker: { failureThreshold,            scope.Breaker(name), WithBreakerOptions(&breaker.Options{
//	    resetTimeout } }                                 Threshold: n, OpenFor: d})
//	{ retry: { max, delay, if } }                    scope.Retry(scope.RetryPolicy{Attempts: max+1, Min, Max, If})
//	  delay: exponentialBackoff({ jitter })            jittered exponential back-off is the only kind
//	{ retry: { onRetry } }                           the hook's OpRetry
//	{ timeout }                                      scope.Timeout(d), per attempt
//
// Where warden differs from go-go-scope on purpose: a lock's
// holder is told when it loses the lock (the task is cancelled) and gets a
// fencing token; an idempotent task's duplicates wait for the running
// one's result instead of all running it; a failure is not stored as a
// success; and a checkpointed task is never run by two workers at once,
// whose saves would interleave. Checkpoint has no interval auto-save:
// a save stores the state given to it, explicitly.
package scope
