package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/lock"
)

// Exit codes of `lock run` when its command cannot be run, as in shells.
const (
	exitCannotExec = 126 // the command was found but could not be started
	exitNoCommand  = 127 // the command was not found
)

// runOptions are the flags of `lock run`.
type runOptions struct {
	ttl    time.Duration // --ttl
	wait   time.Duration // --wait; 0: until interrupted
	noWait bool          // --no-wait
	grace  time.Duration // --grace
}

// errWaitOver is the cause of the end of a --wait.
var errWaitOver = errors.New("wait over")

// lockRun runs `lock run KEY -- CMD ARGS…`: it takes the lock, runs the
// command with the lease's key and fencing token in its environment,
// stops it if the lease is lost, and releases the lock when it exits.
func lockRun(ctx context.Context, c *cli, key string, argv []string, o runOptions) error {
	cmd := findCommand("lock run")
	switch {
	case o.ttl < lock.MinTTL:
		return usagef(cmd, "--ttl %v: want at least %v (a shorter lease is lost to ordinary scheduling and store delays)", o.ttl, lock.MinTTL)
	case o.wait < 0:
		return usagef(cmd, "--wait %v: want a positive duration (or 0: until interrupted)", o.wait)
	case o.noWait && o.wait > 0:
		return usagef(cmd, "--wait and --no-wait exclude each other")
	case o.grace < 0:
		return usagef(cmd, "--grace %v: want 0 or more", o.grace)
	case len(argv) == 0 || argv[0] == "":
		return usagef(cmd, "missing CMD")
	}

	octx, ocancel := c.storeContext(ctx)
	st, err := c.openStore(octx)
	if err != nil {
		ocancel()
		return err
	}
	defer st.Close()
	locker, err := lock.New(st, &lock.Options{TTL: o.ttl, Observe: c.tel.lockObserver()})
	if err != nil {
		ocancel()
		return err
	}
	defer locker.Close()

	lease, err := locker.TryAcquire(octx, key)
	err = c.ctxError(octx, err)
	ocancel()
	if err != nil {
		var held *lock.HeldError
		if !errors.As(err, &held) {
			return err
		}
		if o.noWait {
			return exitf(exitHeld, "lock %q is held by %s until %s (fencing token %d)", key, cell(held.Owner), tableTime(held.ExpiresAt), held.Token)
		}
		fmt.Fprintf(c.stderr, "warden: waiting for lock %s, held by %s until %s\n", quoteShort(key), cell(held.Owner), tableTime(held.ExpiresAt))
		if lease, err = c.waitLock(ctx, st, locker, key, o.wait); err != nil {
			return err
		}
	}
	return c.runHolding(ctx, lease, argv, o.grace)
}

// waitLock waits for the lock, at most wait (0: until interrupted).
func (c *cli) waitLock(ctx context.Context, st *warden.Store, locker *lock.Locker, key string, wait time.Duration) (*lock.Lease, error) {
	wctx, stop := c.interruptible(ctx)
	defer stop()
	if wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeoutCause(wctx, wait, errWaitOver)
		defer cancel()
	}
	lease, err := locker.Acquire(wctx, key)
	if err == nil {
		return lease, nil
	}
	if wctx.Err() == nil || !errors.Is(context.Cause(wctx), errWaitOver) {
		return nil, c.ctxError(wctx, err)
	}
	// The wait is over. If the store was failing, say so; otherwise the
	// lock is still held: say by whom.
	var we *warden.Error
	if errors.As(err, &we) {
		return nil, fmt.Errorf("waiting for lock %q: %w", key, err)
	}
	msg := fmt.Sprintf("lock %q not acquired within %v", key, wait)
	gctx, cancel := c.storeContext(ctx)
	defer cancel()
	if rec, found, gerr := st.Locks().Get(gctx, key); gerr == nil && found {
		msg += fmt.Sprintf(": held by %s until %s (fencing token %d)", cell(rec.Owner), tableTime(rec.ExpiresAt), rec.Token)
	}
	return nil, exitf(exitHeld, "%s", msg)
}

// runHolding runs the command under lease and returns how warden exits.
func (c *cli) runHolding(ctx context.Context, lease *lock.Lease, argv []string, grace time.Duration) error {
	key := lease.Key()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.stdout, c.stderr
	cmd.Env = childEnv(c.env, key, lease.Token())
	cmd.WaitDelay = time.Second // if streams are pipes a grandchild holds open
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		c.release(ctx, lease)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitf(exitNoCommand, "lock run: %v", err)
		}
		return exitf(exitCannotExec, "lock run: %v", err)
	}

	// The goroutine ends when the command does; the loop below always
	// waits for it.
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	leaseDone := lease.Done()
	ctxDone := ctx.Done()
	var kill <-chan time.Time
	var killTimer *time.Timer
	lost := false
	for {
		select {
		case werr := <-waited:
			if killTimer != nil {
				killTimer.Stop()
			}
			return c.afterCommand(ctx, lease, cmd, werr, lost)
		case sig := <-c.sigs:
			signalGroup(cmd.Process, sig)
		case <-ctxDone:
			ctxDone = nil
			signalGroup(cmd.Process, termSignal)
		case <-leaseDone:
			leaseDone = nil
			if !errors.Is(lease.Err(), lock.ErrLeaseLost) {
				continue
			}
			lost = true
			fmt.Fprintf(c.stderr, "warden: lock %s lost: it could no longer be proven held (force-released, taken over after expiring, or the store unreachable); stopping the command: SIGTERM now, SIGKILL after %v\n", quoteShort(key), grace)
			signalGroup(cmd.Process, termSignal)
			killTimer = time.NewTimer(grace)
			kill = killTimer.C
		case <-kill:
			kill = nil
			killGroup(cmd.Process)
		}
	}
}

// afterCommand releases the lock after the command exited and returns how
// warden exits: 6 if the lock was lost, the command's code otherwise.
func (c *cli) afterCommand(ctx context.Context, lease *lock.Lease, cmd *exec.Cmd, werr error, lost bool) error {
	if lost {
		return &exitError{code: exitLeaseLost}
	}
	rerr := c.release(ctx, lease)
	if errors.Is(rerr, lock.ErrNotHeld) {
		return exitf(exitLeaseLost, "lock %q was lost before the command finished: it may have run partly without the lock", lease.Key())
	}
	if rerr != nil {
		fmt.Fprintf(c.stderr, "warden: releasing lock %s: %s (it lapses at its expiry)\n", quoteShort(lease.Key()), strings.TrimPrefix(rerr.Error(), "warden: "))
	}
	if cmd.ProcessState == nil {
		return fmt.Errorf("lock run: %w", werr)
	}
	if code := exitStatus(cmd.ProcessState); code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// release releases the lease within --timeout.
func (c *cli) release(ctx context.Context, lease *lock.Lease) error {
	// Not interruptible: a signal now is meant for the command, and the
	// release is bounded by --timeout anyway.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.g.timeout)
	defer cancel()
	return lease.Release(rctx)
}

// childEnv is env with WARDEN_LOCK_KEY and WARDEN_FENCING_TOKEN set.
func childEnv(env []string, key string, token int64) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if strings.HasPrefix(kv, "WARDEN_LOCK_KEY=") || strings.HasPrefix(kv, "WARDEN_FENCING_TOKEN=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "WARDEN_LOCK_KEY="+key, "WARDEN_FENCING_TOKEN="+strconv.FormatInt(token, 10))
}
