//go:build unix

package restart

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
)

// Scenario is one store's restart test.
type Scenario struct {
	// Server is the store's private server, not started yet.
	Server *Server
	// Open opens a driver store on the server (one client, as one more
	// process would). Run wraps it with warden.New and closes it.
	Open func(ctx context.Context) (driver.Store, error)
	// Durable says whether the server keeps its data across a restart.
	// Then a lock record written before the restart is read back after
	// it; otherwise (Redis without persistence, dynalite in memory) it
	// is gone, and what is left to check is that new holdings get tokens
	// above every earlier one — the stores draw a new record's first
	// token from the clock (driver.TokenBase).
	Durable bool
	// Replays says that the store's notifications are read back from the
	// database — MongoDB's capped event collection, from the last event
	// the watcher passed; DynamoDB's events index, EventLookback back —
	// so that a watcher reading again after an outage misses nothing
	// that was written: it reports EventsLost only when a read failed,
	// and need not when its client's retries carried one read across
	// the outage. Then the watcher must deliver the waiter's holding,
	// taken after the restart, unless an EventsLost comes first. Without
	// replay (Redis pub/sub, PostgreSQL LISTEN, the listings of a store
	// without notifications) an EventsLost must follow the kill.
	Replays bool
	// AfterRestart, if set, runs once the restarted server answers,
	// before the waiter is expected to resume: what an operator does
	// after the server lost its data (dynalite loses its tables). st is
	// one of the open stores.
	AfterRestart func(ctx context.Context, st *warden.Store) error
}

// Parameters of the scenario.
const (
	// ttl is the lockers' TTL: the holder's lease ends at most this long
	// after the server is killed. Its refreshes, every ~630 ms, leave
	// room for a loaded machine.
	ttl = 2 * time.Second
	// retryMax keeps the waiter asking often, so that it resumes soon
	// after the restart.
	retryMax = 100 * time.Millisecond
	// poll is the Watch poll interval of stores without notifications.
	poll = 100 * time.Millisecond
	// downBudget is the deadline of the calls made while the server is
	// down: each must return an error by then.
	downBudget = 2 * time.Second
	// within bounds every wait for something to happen (a hang guard,
	// not a timed assertion: on a healthy machine each wait takes a
	// fraction of it).
	within = 60 * time.Second
	// maxLost is how many EventsLost one restart may cost a watcher that
	// keeps up: one when the stream fails, one when it resumes.
	maxLost = 2
	// settle bounds how long goroutines may take to end after Close.
	settle = 10 * time.Second
)

// Keys of the scenario.
const (
	keyHeld  = "restart/held"  // held when the server dies, then waited for
	keyKept  = "restart/kept"  // a holding far from its expiry: durable or not
	keyDown  = "restart/down"  // tried while the server is down
	keyProbe = "restart/probe" // taken and released until the watcher sees it
)

// Run runs the restart scenario:
//
//  1. Three stores are opened on the server (a holder's, a waiter's, a
//     watcher's), each with a Locker (TTL 2 s). The watcher's Locker
//     watches "restart/*"; the holder takes restart/held and, directly
//     through the store, restart/kept for a minute; the waiter's Acquire of restart/held waits (it has asked
//     the store and found the key held). The watcher has seen both
//     holdings begin.
//  2. The server is killed. While it is down, a Ping and a Locks().Get of
//     the holder's store and a TryAcquire of its Locker each return an
//     error by their 2 s deadline (no hang, no panic, not ErrLocked). The
//     holder's lease ends with ErrLeaseLost, and no check begun at or
//     after its Deadline() finds it live.
//  3. The server is started again on the same port and data directory.
//     Without being reopened: the waiter acquires restart/held with a
//     token above the holder's; restart/kept reads back as it was written
//     when the server is Durable, and is gone otherwise; the watcher's
//     stream, still open, delivers an EventsLost after the kill (a stream
//     that Replays: that, or the waiter's holding with no EventsLost
//     before it) and then live events again (the holder's Locker takes
//     restart/probe until the watcher reports one of its holdings —
//     which also shows the holder's store reconnected).
//  4. The waiter releases; every Locker and store closes without error;
//     the watch channel is closed; and every goroutine started since the
//     stores were opened has ended (a bounded poll of the running
//     goroutines, compared by id with those running before).
func Run(t *testing.T, sc Scenario) {
	srv := sc.Server
	srv.Start(t)
	logs := &testkit.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("what the stores and lockers logged:\n%s", logs)
			if srv.log != "" {
				t.Logf("%s", srv.Log())
			}
		}
	})
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*within)
	defer cancel()

	var stores []*warden.Store
	open := func(hook warden.Hook) *warden.Store {
		t.Helper()
		drv, err := sc.Open(ctx)
		if err != nil {
			t.Fatalf("opening a store: %v", err)
		}
		st := warden.New(drv, &warden.Options{Hook: hook, Logger: logger})
		stores = append(stores, st)
		return st
	}
	t.Cleanup(func() { // on failure; after a full run they are closed already
		for _, st := range stores {
			_ = st.Close()
		}
	})

	// A store opened and closed before the baseline starts whatever a
	// client library starts once per process.
	warm := open(nil)
	if err := warm.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if err := warm.Close(); err != nil {
		t.Fatalf("closing the warm-up store: %v", err)
	}
	stores = stores[:0]
	base := goroutines()
	baseN := runtime.NumGoroutine()

	// 1. A holder, a waiter and a watcher.
	var waiterOps attempts
	holderSt, waiterSt, watchSt := open(nil), open(&waiterOps), open(nil)
	newLocker := func(st *warden.Store, owner string) *lock.Locker {
		t.Helper()
		l, err := lock.New(st, &lock.Options{TTL: ttl, Owner: owner, RetryMax: retryMax, PollInterval: poll})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	holder, waiter, watcher := newLocker(holderSt, "holder"), newLocker(waiterSt, "waiter"), newLocker(watchSt, "watcher")

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	ch, err := watcher.Watch(wctx, "restart/*")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	evs := collect(ch)

	held, err := holder.Acquire(ctx, keyHeld)
	if err != nil {
		t.Fatalf("the holder's Acquire: %v", err)
	}
	t0 := held.Token()
	evs.await(t, "the watcher to see the holder acquire "+keyHeld, 0, func(ev lock.Event) bool {
		return ev.Kind == lock.Acquired && ev.Key == keyHeld && ev.Token == t0
	})
	kept, ok, err := holderSt.Locks().Acquire(ctx, keyKept, holder.Owner(), time.Minute)
	if err != nil || !ok {
		t.Fatalf("acquiring %s: acquired %v, %v", keyKept, ok, err)
	}
	evs.await(t, "the watcher to see "+keyKept+" acquired", 0, func(ev lock.Event) bool {
		return ev.Kind == lock.Acquired && ev.Key == keyKept && ev.Token == kept.Token
	})

	type result struct {
		lease *lock.Lease
		err   error
	}
	waited := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, keyHeld)
		waited <- result{l, err}
	}()
	waitFor(t, "the waiter to find "+keyHeld+" held", func() bool { return waiterOps.answered() > 0 })
	if err := held.Err(); err != nil {
		t.Fatalf("the holder's lease ended before the server was killed (%v): the machine is too slow for a %v TTL", err, ttl)
	}

	// 2. The server dies.
	killedAt := evs.len()
	srv.Kill(t)
	killed := time.Now()
	since := func() time.Duration { return time.Since(killed).Round(time.Millisecond) }
	t.Logf("%s killed; the holder's lease (token %d) has %v left", srv.Name, t0, time.Until(held.Deadline()).Round(time.Millisecond))

	downCalls(t, map[string]func(ctx context.Context) error{
		"Ping": func(ctx context.Context) error { return holderSt.Ping(ctx) },
		"Locks().Get": func(ctx context.Context) error {
			_, _, err := holderSt.Locks().Get(ctx, keyHeld)
			return err
		},
		"Locker.TryAcquire": func(ctx context.Context) error {
			l, err := holder.TryAcquire(ctx, keyDown)
			if err == nil {
				_ = l.Release(context.Background())
				return nil
			}
			if errors.Is(err, lock.ErrLocked) {
				return fmt.Errorf("reported the key held by someone (%w) while the server is down", err)
			}
			return err
		},
	})
	awaitLeaseEnd(t, held)
	t.Logf("%v: the holder's lease ended: %v", since(), held.Err())

	// 3. The server comes back.
	srv.Start(t)
	t.Logf("%v: %s started again", since(), srv.Name)
	if sc.AfterRestart != nil {
		if err := sc.AfterRestart(ctx, holderSt); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
	}

	var got result
	select {
	case got = <-waited:
	case <-time.After(within):
		t.Fatalf("the waiter did not acquire %s within %v of the restart", keyHeld, within)
	}
	if got.err != nil {
		t.Fatalf("the waiter's Acquire, waiting across the restart: %v", got.err)
	}
	t1 := got.lease.Token()
	if t1 <= t0 {
		t.Errorf("the waiter's token %d is not above the holder's %d, issued before the restart", t1, t0)
	}
	if err := got.lease.Err(); err != nil {
		t.Errorf("the waiter's lease is not live: %v", err)
	}
	t.Logf("%v: the waiter acquired %s with token %d (the holder's: %d)", since(), keyHeld, t1, t0)

	rec, found, err := holderSt.Locks().Get(ctx, keyKept)
	switch {
	case err != nil:
		t.Errorf("reading %s after the restart: %v", keyKept, err)
	case sc.Durable && (!found || rec.Token != kept.Token || rec.Owner != kept.Owner):
		t.Errorf("%s after the restart: found %v, %+v; want the holding written before it, %+v", keyKept, found, rec, kept)
	case !sc.Durable && found:
		t.Errorf("%s after the restart of a server that keeps no data: found %+v", keyKept, rec)
	}

	// The stream: an EventsLost after the kill (or, for a stream that
	// replays, the waiter's holding with nothing reported lost before
	// it), then live events: the holder's Locker takes the probe key
	// until the watcher reports one of its holdings.
	isLost := func(ev lock.Event) bool { return ev.Kind == lock.EventsLost }
	var resumed int
	if sc.Replays {
		resumed = evs.await(t, "the waiter's holding (or an EventsLost) after the restart", killedAt, func(ev lock.Event) bool {
			return isLost(ev) || ev.Kind == lock.Acquired && ev.Key == keyHeld && ev.Token == t1
		})
	} else {
		resumed = evs.await(t, "an EventsLost after the restart", killedAt, isLost)
	}
	t.Logf("%v: the watcher's stream resumed (%v)", since(), evs.at(resumed).Kind)
	probed := false
	deadline := time.Now().Add(within)
	for round := 1; !probed; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("the watcher reported no holding of %s in %d rounds after the restart (events: %v)", keyProbe, round, evs.all())
		}
		l, err := holder.Acquire(ctx, keyProbe)
		if err != nil {
			t.Fatalf("the holder's Acquire of %s after the restart: %v", keyProbe, err)
		}
		// Held while the watcher may see it: a poller (stores without
		// notifications) misses a holding that ends between two polls.
		tok := l.Token()
		t.Logf("%v: probe round %d acquired token %d", since(), round, tok)
		probed = evs.seen(resumed+1, time.Second, func(ev lock.Event) bool {
			return ev.Kind == lock.Acquired && ev.Key == keyProbe && ev.Token == tok
		})
		if err := l.Release(ctx); err != nil {
			t.Fatalf("releasing %s: %v", keyProbe, err)
		}
	}

	t.Logf("%v: the watcher reported a holding taken after the restart", since())
	// One outage is one gap: a stream reports it when it fails and when
	// it resumes, not once per failed reconnection attempt (each
	// EventsLost wakes every Acquire waiting in the watcher's process and
	// has Watch list the locks again, while the server is down).
	if n := evs.count(killedAt, func(ev lock.Event) bool { return isLost(ev) }); n > maxLost {
		t.Errorf("%d EventsLost for one restart, want at most %d (events: %v)", n, maxLost, evs.all())
	}

	// 4. Everything closes; nothing is left running.
	if err := got.lease.Release(ctx); err != nil {
		t.Errorf("the waiter's Release: %v", err)
	}
	if _, err := holderSt.Locks().ForceRelease(ctx, keyKept); err != nil {
		t.Errorf("ForceRelease %s: %v", keyKept, err)
	}
	for _, l := range []*lock.Locker{holder, waiter, watcher} {
		if err := l.Close(); err != nil {
			t.Errorf("closing the %s's Locker: %v", l.Owner(), err)
		}
	}
	select {
	case <-evs.done:
	case <-time.After(within):
		t.Errorf("the watch channel is still open after its Locker closed")
	}
	for _, st := range stores {
		if err := st.Close(); err != nil {
			t.Errorf("closing a store: %v", err)
		}
	}
	if leaked := leftOver(base, settle); leaked != "" {
		t.Errorf("goroutines still running %v after every store closed (%d running, %d before they opened):\n%s",
			settle, runtime.NumGoroutine(), baseN, leaked)
	}
	t.Logf("events seen by the watcher: %v", evs.all())
}

// downCalls runs the ops at once, each with a downBudget deadline, while
// the server is down: each must return an error, by its deadline (within
// a hang guard).
func downCalls(t *testing.T, ops map[string]func(ctx context.Context) error) {
	t.Helper()
	type outcome struct {
		what string
		err  error
	}
	done := make(chan outcome, len(ops))
	for what, op := range ops {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), downBudget)
			defer cancel()
			done <- outcome{what, op(ctx)}
		}()
	}
	guard := time.After(downBudget + within)
	for range ops {
		select {
		case o := <-done:
			if o.err == nil {
				t.Errorf("%s succeeded while the server was down", o.what)
			} else {
				t.Logf("while the server is down, %s: %v", o.what, o.err)
			}
		case <-guard:
			t.Fatalf("a call hung past its %v deadline while the server was down", downBudget)
		}
	}
}

// awaitLeaseEnd waits for the holder's lease to end while it cannot be
// refreshed, checking that it ends with ErrLeaseLost and that no check of
// Err begun at or after Deadline() finds it live (Err consults the clock:
// the check is exact, whatever the timers).
func awaitLeaseEnd(t *testing.T, l *lock.Lease) {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	guard := time.After(within)
	for {
		dl := l.Deadline()
		now := time.Now()
		if err := l.Err(); err != nil {
			if !errors.Is(err, lock.ErrLeaseLost) {
				t.Errorf("the holder's lease ended with %v, want ErrLeaseLost", err)
			}
			select {
			case <-l.Done():
			case <-guard:
				t.Fatal("the holder's lease reports an error but its Done channel stays open")
			}
			return
		}
		if !now.Before(dl) {
			t.Fatalf("the holder's lease is live at %v, at or past its deadline %v, with the server down", now, dl)
		}
		select {
		case <-l.Done():
		case <-tick.C:
		case <-guard:
			t.Fatalf("the holder's lease is still live %v after the server was killed", within)
		}
	}
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %v", what, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// attempts is a warden.Hook counting the answered lock.acquire calls.
type attempts struct {
	mu sync.Mutex
	n  int
}

func (a *attempts) AfterOp(_ context.Context, op warden.OpInfo) {
	if op.Op == "lock.acquire" && op.Err == nil {
		a.mu.Lock()
		a.n++
		a.mu.Unlock()
	}
}

func (a *attempts) answered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// events collects what a Watch channel delivers.
type events struct {
	mu     sync.Mutex
	evs    []lock.Event
	notify chan struct{} // closed and replaced on every event
	done   chan struct{} // closed when the channel is
}

func collect(ch <-chan lock.Event) *events {
	e := &events{notify: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		for ev := range ch {
			e.mu.Lock()
			e.evs = append(e.evs, ev)
			close(e.notify)
			e.notify = make(chan struct{})
			e.mu.Unlock()
		}
	}()
	return e
}

func (e *events) at(i int) lock.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.evs[i]
}

// count returns how many events from index from on match.
func (e *events) count(from int, match func(lock.Event) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.evs[from:] {
		if match(ev) {
			n++
		}
	}
	return n
}

func (e *events) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.evs)
}

// find returns the index of the first event from index from on that
// matches, or -1, and a channel closed on the next event.
func (e *events) find(from int, match func(lock.Event) bool) (int, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := from; i < len(e.evs); i++ {
		if match(e.evs[i]) {
			return i, nil
		}
	}
	return -1, e.notify
}

// seen waits up to d for an event from index from on that matches.
func (e *events) seen(from int, d time.Duration, match func(lock.Event) bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		i, next := e.find(from, match)
		if i >= 0 {
			return true
		}
		select {
		case <-next:
		case <-e.done:
			i, _ := e.find(from, match)
			return i >= 0
		case <-timer.C:
			return false
		}
	}
}

// await returns the index of the first event from index from on that
// matches, failing the test if none comes (within a hang guard).
func (e *events) await(t *testing.T, what string, from int, match func(lock.Event) bool) int {
	t.Helper()
	guard := time.After(within)
	for {
		i, next := e.find(from, match)
		if i >= 0 {
			return i
		}
		select {
		case <-next:
		case <-e.done:
			if i, _ := e.find(from, match); i >= 0 {
				return i
			}
			t.Fatalf("the watch channel closed before %s (events: %v)", what, e.all())
		case <-guard:
			t.Fatalf("still waiting for %s after %v (events: %v)", what, within, e.all())
		}
	}
}

// all renders the events seen so far, for messages.
func (e *events) all() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for i, ev := range e.evs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ev.Kind.String())
		if ev.Key != "" {
			b.WriteString(" " + ev.Key + "#" + strconv.FormatInt(ev.Token, 10))
		}
		if ev.Err != nil {
			b.WriteString(" (" + ev.Err.Error() + ")")
		}
	}
	return "[" + b.String() + "]"
}

// goroutines returns the ids of the running goroutines.
func goroutines() map[string]bool {
	ids := map[string]bool{}
	for _, g := range stacks() {
		ids[goroutineID(g)] = true
	}
	return ids
}

func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goroutineID returns the id of a goroutine from its trace ("goroutine 12
// [running]:").
func goroutineID(stack string) string {
	f := strings.Fields(stack)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// leftOver polls until every goroutine not in base has ended (the servers'
// process waiters aside), up to d; it returns the stacks of those still
// running then, or "".
func leftOver(base map[string]bool, d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		var bad []string
		for _, g := range stacks() {
			if !base[goroutineID(g)] && !strings.Contains(g, "testkit/restart.(*Server).Start") {
				bad = append(bad, g)
			}
		}
		if len(bad) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			slices.Sort(bad)
			return strings.Join(bad, "\n\n")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
