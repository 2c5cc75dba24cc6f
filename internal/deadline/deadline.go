// Package deadline holds the deadline rule that lock leases and
// idempotency claims share (DESIGN.md §4.1, docs/design.md "The deadline
// rule"): a holding is proven until the local time its last successful
// acquire or renewal was sent, plus its TTL, minus a safety margin, and
// the context that tells its holder is done at that instant — by the
// clock, not by whenever a timer gets round to it.
package deadline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// The margin's parts. Every store keeps expiries to the millisecond, and a
// store that truncates its clock can record an expiry up to one
// millisecond before the caller's send time plus TTL; the timer that
// closes a context's Done channel may fire a little late. The margin is
// therefore never below their sum, whatever TTL is chosen.
const (
	// Granularity is the coarsest clock resolution of any store.
	Granularity = time.Millisecond
	// TimerSlack allows for a timer firing late.
	TimerSlack = 4 * time.Millisecond
	// MinMargin is the smallest margin a holding gets.
	MinMargin = Granularity + TimerSlack
	// MinTTL is the shortest TTL that leaves the holding time beyond its
	// margin: the margin is at most half the TTL.
	MinTTL = 2 * MinMargin
	// maxDefaultMargin caps the default margin.
	maxDefaultMargin = time.Second
)

// Margin returns the safety margin for a holding of ttl (≥ MinTTL) given
// the margin asked for (0: the default, ttl/20 capped at one second). The
// result is at least MinMargin and at most ttl/2.
func Margin(ttl, asked time.Duration) time.Duration {
	m := asked
	if m <= 0 {
		m = min(ttl/20, maxDefaultMargin)
	}
	return min(max(m, MinMargin), ttl/2)
}

// epoch anchors Context's deadlines on the monotonic clock.
var epoch = time.Now()

func mono(t time.Time) int64 { return int64(t.Sub(epoch)) }

// Context is a context.Context whose Err consults the clock: once its
// deadline has passed it reports itself done, cancelling itself with the
// cause given to New, even if nothing else has run yet. Its Done channel
// is closed by that cancellation, by Cancel, or by whoever calls Err or
// Expire first. The deadline can be moved later (Extend) while the
// context is live, never earlier, and never after it is done.
//
// Contexts derived from it (context.WithCancel …) are cancelled with it;
// their own Err does not consult the clock.
type Context struct {
	context.Context
	cancel   context.CancelCauseFunc
	cause    atomic.Pointer[error] // the cause given when the deadline passes
	deadline atomic.Int64          // monotonic nanoseconds since epoch
}

// New returns a Context carrying parent's values but not its cancellation,
// done at deadline with cause (or earlier by Cancel).
func New(parent context.Context, deadline time.Time, cause error) *Context {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	c := &Context{Context: ctx, cancel: cancel}
	c.cause.Store(&cause)
	c.deadline.Store(mono(deadline))
	return c
}

// SetCause replaces the cause the context is cancelled with when its
// deadline passes (for example to name the renewal error that kept it
// from being extended). It has no effect once the context is done.
func (c *Context) SetCause(cause error) { c.cause.Store(&cause) }

func (c *Context) deadlineCause() error { return *c.cause.Load() }

// Err returns nil while the context is live and its deadline has not
// passed; otherwise it makes sure the context is cancelled and returns
// context.Canceled (context.Cause gives the reason).
func (c *Context) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if c.Passed(time.Now()) {
		c.cancel(c.deadlineCause())
		return c.Context.Err()
	}
	return nil
}

// Passed reports whether the deadline is at or before now.
func (c *Context) Passed(now time.Time) bool { return mono(now) >= c.deadline.Load() }

// When returns the current deadline. (It is not the context's Deadline
// method: this deadline moves, which context.Context's contract does not
// allow.)
func (c *Context) When() time.Time { return epoch.Add(time.Duration(c.deadline.Load())) }

// Extend moves the deadline to d if d is later and the context is still
// live now. It reports whether the context is live afterwards: false
// means the deadline had already passed (the context is then cancelled)
// or the context was cancelled before.
func (c *Context) Extend(d time.Time) bool {
	nd := mono(d)
	for {
		if c.Err() != nil {
			return false
		}
		cur := c.deadline.Load()
		if nd <= cur || c.deadline.CompareAndSwap(cur, nd) {
			// An Err that saw the old deadline pass may have cancelled
			// the context meanwhile.
			return c.Context.Err() == nil
		}
	}
}

// Expire cancels the context with its deadline cause if the deadline has
// passed at now, and reports whether the context is done.
func (c *Context) Expire(now time.Time) bool {
	if c.Context.Err() == nil && c.Passed(now) {
		c.cancel(c.deadlineCause())
	}
	return c.Context.Err() != nil
}

// CancelAtDeadline starts a timer that cancels c with its deadline cause
// when its deadline passes, following Extend, so that Done closes even if
// nobody calls Err and whatever else the holder's renewal is doing. stop
// releases the timer; call it when the holding ends. (Done closes when the
// runtime runs the timer: on a process starved of CPU that can be later
// than the deadline. Err is exact.)
func (c *Context) CancelAtDeadline() (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
	)
	fire := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped || c.Expire(time.Now()) {
			return
		}
		t.Reset(time.Until(c.When())) // extended meanwhile
	}
	mu.Lock()
	t = time.AfterFunc(time.Until(c.When()), fire)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// Cancel cancels the context with cause (the first cause wins).
func (c *Context) Cancel(cause error) { c.cancel(cause) }

// Child returns a context for work done under the holding: derived from
// c (so it ends the instant c does, with c's cause), also cancelled when
// parent ends (with parent's cause), and whose Err consults c's clock and
// parent. It carries c's values. stop releases it; call it when the work
// ends.
func (c *Context) Child(parent context.Context) (ctx context.Context, stop func()) {
	cctx, cancel := context.WithCancelCause(c)
	unhook := context.AfterFunc(parent, func() { cancel(context.Cause(parent)) })
	return child{cctx, c, parent, cancel}, func() {
		unhook()
		cancel(context.Canceled)
	}
}

// child is a context derived from a Context whose Err consults the clock
// and the parent, so that neither end waits for a goroutine to pass it
// on.
type child struct {
	context.Context
	d      *Context
	parent context.Context
	cancel context.CancelCauseFunc
}

func (c child) Err() error {
	_ = c.d.Err() // cancels c.d, and so this context, once the deadline has passed
	if c.Context.Err() == nil && c.parent.Err() != nil {
		c.cancel(context.Cause(c.parent))
	}
	return c.Context.Err()
}
