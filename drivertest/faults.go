package drivertest

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/faultproxy"
	"github.com/warden-go/warden/lock"
)

// This file holds the Faults group: lock holders in several OS processes,
// each reaching the server through a fault-injecting proxy of its own
// (package internal/faultproxy) that the parent drives — network delay of
// hundreds of milliseconds, blackhole, connection resets mid-reply, cuts,
// replies held back after the request was applied — while a checker
// compares what every process observed.
//
// What a worker process records, per lease, on the machine's one wall
// clock (time.Now().UnixNano(), comparable across processes):
//
//   - called: just before Acquire was called; returned: just after it
//     returned; the lease's Deadline() read right after; answered: when
//     the store answered the granting lock.acquire (the hook below), after
//     which Acquire decides whether the grant came too late.
//   - beyond: the first time a Deadline() read exceeded the latest send
//     time it could rest on plus TTL − ClockSkew. The worker's store has a
//     warden.Hook that notes the start of every lock.acquire and
//     lock.refresh call; lock notes a request's send time just before it
//     calls the store, so a lease's deadline (a send time + TTL −
//     ClockSkew) is never later than the latest such start + TTL −
//     ClockSkew, the start read after the deadline.
//   - lastLive: the instant just before the last call of lease.Err() that
//     returned nil. Err() == nil at a call begun at lastLive proves the
//     lease was live at some instant at or after lastLive — and, a lease
//     never reviving, at every instant from returned to lastLive. The
//     interval [returned, lastLive] is thus when the lease was provably
//     live: two such intervals of different workers that intersect prove
//     two live leases of one key at one instant, whatever the scheduling
//     (no timing slack in the check).
//   - observed: just after the first Err() that was not nil (or the
//     release began).
//   - late: the first check that began at or after the lease's Deadline()
//     and still found Err() == nil (a context live past its deadline).
//
// Between checks a worker writes to a fenced resource kept by the parent
// (it keeps the greatest token written and refuses smaller ones), as a
// service would, and only after a check found its lease live. A worker
// releases its lease after a while (so that the key changes hands), but
// not while the parent has a fault on its proxy: then it works on until
// the lease ends by itself.

// Roles and files of the Faults group.
const (
	faultWorkerRole = "faults-lock-worker"
	faultServerFile = "faults-resource" // the parent's resource address
	faultStopFile   = "faults-stop"     // the workers finish their lease and exit
	faultOwnerFile  = "faults-owner-%d" // a worker's Locker's Owner()
	faultYieldFile  = "faults-yield-%d" // the worker does not compete while it exists
	faultKey        = "faulty-lock"
)

func init() { portableRoles[faultWorkerRole] = childFaultWorker }

// Parameters of the fault checks.
const (
	faultTTL = 500 * time.Millisecond
	// faultSkew is the workers' ClockSkew (their TTL/20): a lease's
	// Deadline() is at most a send time plus faultTTL minus faultSkew.
	faultSkew = faultTTL / 20
	// faultHold is the least time a worker keeps a lease before releasing
	// it (it adds up to as much again at random): several refreshes.
	faultHold = 300 * time.Millisecond
	// faultAcquireTimeout bounds one Acquire call of a worker, so that a
	// worker whose connections a fault swallowed tries again. It leaves
	// room for a client to connect through a proxy that holds every reply
	// back for most of a second (a MySQL handshake takes several round
	// trips before the first query).
	faultAcquireTimeout = 10 * time.Second
	// faultRetryMax is the workers' RetryMax; after releasing, a worker
	// waits twice as long before competing again, so that the others,
	// polling, get their turn.
	faultRetryMax = 50 * time.Millisecond
)

func (s *suite) faults(t *testing.T) {
	if s.h.Upstream == nil || s.h.ProxiedURL == nil {
		t.Skipf("Harness.Upstream or Harness.ProxiedURL is nil: the fault checks need to put a proxy between %s and its server", s.h.Name)
	}
	group(t, []check{
		{"LockExclusion", s.faultLockExclusion},
		{"LockUnanswered", s.faultUnanswered},
	})
}

// faultLockExclusion: three worker processes compete for one key with a
// 500 ms TTL. The parent finds the current holder and, on its proxy only,
// delays every chunk by 200 ms then by 350 ms each way (a round trip of
// 400 ms fits in the TTL, one of 700 ms does not), blackholes it and then
// resets its connections, resets its connections in the middle of every
// reply (the server applied the request; the client cannot know), and
// cuts it off; once it delays every worker's traffic by 250 ms each way,
// so that acquires complete only after half a TTL. Between faults it lets
// a new holder take over. Then it heals everything and every worker must
// acquire again.
//
// The checker asserts: no lease is handed out at or past its own
// Deadline(); no Deadline() is later than the latest send it can rest on
// (the start of a lock.acquire or lock.refresh call) + TTL − ClockSkew;
// no lease is seen live (Err() == nil) by a check begun at or after its
// Deadline(); no two workers' leases are provably live at one instant;
// fencing tokens strictly increase in the order the leases were handed
// out; the fenced resource accepted no write with a token below one
// already written (it refuses such writes; the log counts them).
func (s *suite) faultLockExclusion(t *testing.T) {
	r := s.newFaultRig(t, 3)
	r.awaitLeases(t, "the warm-up", 2)
	r.onHolder(t, "delay 200ms each way on the holder", 2*time.Second, func(p *faultproxy.Proxy) { p.Delay(200*time.Millisecond, 200*time.Millisecond) }, nil)
	r.onHolder(t, "delay 350ms each way on the holder", 2*time.Second, func(p *faultproxy.Proxy) { p.Delay(350*time.Millisecond, 350*time.Millisecond) }, nil)
	r.onAll(t, "delay 250ms each way on every worker", 2*time.Second, func(p *faultproxy.Proxy) { p.Delay(250*time.Millisecond, 250*time.Millisecond) })
	r.onHolder(t, "blackhole the holder, then reset its connections", 2*time.Second, (*faultproxy.Proxy).Blackhole, func(p *faultproxy.Proxy) { p.Reset() })
	r.onHolder(t, "reset the holder's connections mid-reply", 1500*time.Millisecond, (*faultproxy.Proxy).ResetReplies, nil)
	r.onHolder(t, "cut the holder off", 1500*time.Millisecond, (*faultproxy.Proxy).Cut, nil)
	r.finish(t)
}

// faultUnanswered: two worker processes. Three times, the holder's proxy
// holds back every reply for 2 s — longer than the TTL — while forwarding
// requests at once: its refreshes are sent and applied, but unanswered,
// and so are its read-backs. The lease must end before it can no longer
// be proven (by the phase's start + TTL at the latest), and the other
// worker may take over only after that. Then, twice, a winning acquire
// is answered late: the other worker steps aside, one worker's replies
// are held back (400 ms, then 800 ms), and once the store shows that its
// acquire applied, the other competes again — and gets the key when that
// holding expires in the store, before the late answer arrives. Acquire
// must not hand the late lease out live. Everything the LockExclusion checker
// asserts holds throughout.
func (s *suite) faultUnanswered(t *testing.T) {
	r := s.newFaultRig(t, 2)
	r.awaitLeases(t, "the warm-up", 2)
	for i := range 3 {
		name := fmt.Sprintf("hold replies to the holder 2s (round %d)", i+1)
		r.onHolder(t, name, 1500*time.Millisecond, func(p *faultproxy.Proxy) { p.Delay(0, 2*time.Second) }, nil)
	}
	refreshPhases := slices.Clone(r.phases)
	// 400 ms: a store that acquires in two round trips (write, then read
	// back: MySQL) reads its own holding back before it expires, and
	// answers 800 ms after the send, past the deadline. 800 ms: a store
	// that acquires in one round trip (MongoDB, DynamoDB) answers after
	// the holding expired in the store.
	for w, late := range []time.Duration{400 * time.Millisecond, 800 * time.Millisecond} {
		r.onWinner(t, fmt.Sprintf("answer worker %d's winning acquire %v late", w, late), w, late)
	}
	r.finish(t)
	// The holder of each refresh round cannot have proven its lease past
	// the phase's start plus TTL: every reply it read after the start
	// came 2 s late, after the phase ended.
	var fails faultFailures
	defer fails.report(t)
	for _, ph := range refreshPhases {
		for _, l := range r.log.leases {
			if l.worker != ph.target || l.lastLive == 0 || l.returned >= ph.start {
				continue
			}
			if bound := ph.start + int64(faultTTL); l.lastLive >= bound {
				fails.add("a lease outlived every proof it could have had",
					"%s: worker %d's lease (token %d) was still live at %s, %v after its replies were held back at %s",
					ph.name, l.worker, l.token, r.at(l.lastLive), time.Duration(l.lastLive-ph.start), r.at(ph.start))
			}
		}
	}
}

// ---------------------------------------------------------------------------
// the parent side

// faultRig is one fault check's fleet: workers, their proxies, the
// resource and event log, and the phases of faults.
type faultRig struct {
	s       *suite
	st      *warden.Store // the namespace's store, reaching the server directly
	f       *fleet
	proxies []*faultproxy.Proxy
	log     *faultLog
	origin  int64 // UnixNano at the start, for messages
	phases  []faultPhase
	since   int64 // the next fault waits for a lease handed out after it
}

// faultPhase is one fault, applied to target (-1: every worker).
type faultPhase struct {
	name       string
	target     int
	start, end int64
}

// newFaultRig starts the resource, one proxy per worker and the workers,
// and lets them go.
func (s *suite) newFaultRig(t *testing.T, workers int) *faultRig {
	t.Helper()
	prefix := namespace(t)
	st := s.openPrefix(t, prefix) // also creates what the store needs (tables)
	upstream := s.h.Upstream(t)
	dir := t.TempDir()
	r := &faultRig{s: s, st: st, origin: time.Now().UnixNano()}
	r.log = startFaultLog(t)
	fatalIf(t, "resource address", writeAtomic(filepath.Join(dir, faultServerFile), []byte(r.log.addr())))
	cfgs := make([]childConfig, workers)
	for i := range cfgs {
		p, err := faultproxy.New(upstream)
		fatalIf(t, "faultproxy.New", err)
		t.Cleanup(func() { p.Close() })
		r.proxies = append(r.proxies, p)
		cfgs[i] = childConfig{
			Role: faultWorkerRole, URL: s.h.ProxiedURL(t, prefix, p.Addr()), Dir: dir, ID: i,
			Key: faultKey, TTL: faultTTL, Pause: faultHold,
		}
	}
	r.f = startFleet(t, cfgs)
	r.f.release(t)
	r.since = time.Now().UnixNano()
	return r
}

// at formats a UnixNano time relative to the start of the check.
func (r *faultRig) at(ns int64) string {
	return fmt.Sprintf("+%.3fs", float64(ns-r.origin)/1e9)
}

// awaitLeases waits until n leases were handed out after r.since.
func (r *faultRig) awaitLeases(t *testing.T, what string, n int) {
	t.Helper()
	since := r.since
	r.f.await(t, fmt.Sprintf("%d leases in %s", n, what), func() bool {
		return r.log.count(func(l *faultLease) bool { return l.returned > since }) >= n
	})
	r.since = time.Now().UnixNano()
}

// holder waits for a worker holding a lease handed out after r.since,
// and returns it.
func (r *faultRig) holder(t *testing.T, what string) int {
	t.Helper()
	since, w := r.since, -1
	r.f.await(t, "a holder for "+what, func() bool {
		w = r.log.holder(since)
		return w >= 0
	})
	return w
}

// onHolder applies fault to the current holder's proxy for d, then after
// (if any), then lets its traffic pass again.
func (r *faultRig) onHolder(t *testing.T, name string, d time.Duration, fault, after func(*faultproxy.Proxy)) {
	t.Helper()
	w := r.holder(t, name)
	r.run(t, name, w, d, func(p *faultproxy.Proxy) bool { return p == r.proxies[w] }, fault, after)
}

// onAll applies fault to every worker's proxy for d.
func (r *faultRig) onAll(t *testing.T, name string, d time.Duration, fault func(*faultproxy.Proxy)) {
	t.Helper()
	r.holder(t, name)
	r.run(t, name, -1, d, func(*faultproxy.Proxy) bool { return true }, fault, nil)
}

func (r *faultRig) run(t *testing.T, name string, target int, d time.Duration, which func(*faultproxy.Proxy) bool, fault, after func(*faultproxy.Proxy)) {
	t.Helper()
	ph := faultPhase{name: name, target: target, start: time.Now().UnixNano()}
	r.log.setKeep(target, true) // the holder works on until its lease ends
	for _, p := range r.proxies {
		if which(p) {
			fault(p)
		}
	}
	sleepCtx(r.f.ctx, d) // the fault lasts
	for _, p := range r.proxies {
		if which(p) {
			if after != nil {
				after(p)
			}
			p.Pass()
		}
	}
	r.log.setKeep(target, false)
	ph.end = time.Now().UnixNano()
	r.phases = append(r.phases, ph)
	r.since = ph.end
}

// onWinner holds back worker w's replies for hold while the other
// workers step aside, waits until the store shows a new holding of w's
// (with a token no lease was handed out with yet), lets the others
// compete again, and lets the fault last until the late reply has come.
func (r *faultRig) onWinner(t *testing.T, name string, w int, hold time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	ownerFile := fmt.Sprintf(faultOwnerFile, w)
	r.f.await(t, fmt.Sprintf("worker %d's owner", w), func() bool { return r.f.exists(ownerFile) })
	owner, err := os.ReadFile(r.f.path(ownerFile))
	fatalIf(t, "owner", err)
	ph := faultPhase{name: name, target: w, start: time.Now().UnixNano()}
	r.proxies[w].Delay(0, hold)
	for i := range r.proxies {
		if i != w {
			fatalIf(t, "yield", writeAtomic(r.f.path(fmt.Sprintf(faultYieldFile, i)), nil))
		}
	}
	for {
		rec, found, err := r.st.Locks().Get(ctx, faultKey)
		if err == nil && found && rec.Owner == string(owner) && rec.Token > r.log.maxToken() {
			break // a new holding, not yet answered
		}
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatalf("%s: the check ended before the store showed worker %d (%q) holding the key; last: %+v found=%v err=%v", name, w, owner, rec, found, err)
		}
	}
	for i := range r.proxies {
		if i != w {
			fatalIf(t, "yield", os.Remove(r.f.path(fmt.Sprintf(faultYieldFile, i))))
		}
	}
	sleepCtx(ctx, hold+faultTTL) // the holding expires, the late reply comes
	r.proxies[w].Pass()
	ph.end = time.Now().UnixNano()
	r.phases = append(r.phases, ph)
	r.since = ph.end
}

// finish heals every proxy, waits until every worker has acquired the key
// again, stops the workers and checks the record.
func (r *faultRig) finish(t *testing.T) {
	t.Helper()
	for _, p := range r.proxies {
		p.Pass()
	}
	healed := time.Now().UnixNano()
	for w := range r.proxies {
		r.f.await(t, fmt.Sprintf("worker %d to acquire the key once the faults are gone", w), func() bool {
			return r.log.count(func(l *faultLease) bool { return l.worker == w && l.returned > healed }) > 0
		})
	}
	fatalIf(t, "stop", writeAtomic(r.f.path(faultStopFile), nil))
	results := r.f.wait(t)
	r.log.close()
	r.check(t)
	var b strings.Builder
	fmt.Fprintf(&b, "%s, TTL %v:", r.s.h.Name, faultTTL)
	for _, ph := range r.phases {
		fmt.Fprintf(&b, "\n  %s–%s %s: leases live: %s", r.at(ph.start), r.at(ph.end), ph.name, r.live(ph.start, ph.end))
	}
	fmt.Fprintf(&b, "\n  whole run: %s; writes accepted %d, refused by fencing %d", r.log.summary(), r.log.accepted, r.log.refused)
	for i, p := range r.proxies {
		st := p.Stats()
		fmt.Fprintf(&b, "\n  worker %d: %s; proxy: %d connections, %d cut, %d refused, %d blackholed, %d reset, %d bytes dropped",
			i, strings.Join(results[i].Values, ", "), st.Accepted, st.Cuts, st.Refused, st.Blackholed, st.Resets, st.Dropped)
	}
	t.Log(b.String())
}

// phaseAt names the faults in force at some time between from and to.
func (r *faultRig) phaseAt(from, to int64) string {
	var names []string
	for _, ph := range r.phases {
		if from <= ph.end && to >= ph.start {
			names = append(names, "“"+ph.name+"”")
		}
	}
	if len(names) == 0 {
		return "no fault"
	}
	return "under " + strings.Join(names, ", ")
}

// check runs the checker over the record.
func (r *faultRig) check(t *testing.T) {
	t.Helper()
	leases := slices.Clone(r.log.leases)
	slices.SortFunc(leases, func(a, b *faultLease) int { return cmp.Compare(a.returned, b.returned) })
	var fails faultFailures
	defer fails.report(t)
	for _, l := range leases {
		who := fmt.Sprintf("worker %d's lease (token %d, Acquire called %s, returned %s, %s)", l.worker, l.token, r.at(l.called), r.at(l.returned), r.phaseAt(l.called, l.returned))
		if !l.ended {
			fails.add("a worker never reported a lease's end", "%s", who)
		}
		// Acquire decides after the store's answer whether the grant came
		// too late; the worker notes its return only later, by as long as
		// a loaded machine keeps it from running.
		if l.deadline <= l.answered {
			fails.add("a lease was handed out already past its deadline", "%s: Deadline() = %s, %v before the store's answer to its acquire",
				who, r.at(l.deadline), time.Duration(l.answered-l.deadline))
		}
		if l.beyond != 0 {
			fails.add("a lease's deadline was later than its last send time + TTL − ClockSkew allows",
				"%s: at %s Deadline() = %s, %v after the latest lock.acquire/lock.refresh start %s + TTL − ClockSkew",
				who, r.at(l.beyond), r.at(l.beyondDeadline), time.Duration(l.beyondDeadline-l.beyondSend-int64(faultTTL-faultSkew)), r.at(l.beyondSend))
		}
		if l.late != 0 {
			fails.add("a lease's context was live past its deadline", "%s was still live (Err() == nil) at a check begun %s, %v after its Deadline() %s",
				who, r.at(l.late), time.Duration(l.late-l.lateDeadline), r.at(l.lateDeadline))
		}
	}
	// Provably live intervals of different workers never intersect.
	for i, a := range leases {
		if a.lastLive == 0 {
			continue
		}
		for _, b := range leases[i+1:] {
			if b.returned > a.lastLive {
				break
			}
			if b.worker == a.worker || b.lastLive == 0 {
				continue
			}
			fails.add("two workers held live leases at the same instant",
				"worker %d's (token %d) was live from %s to at least %s, worker %d's (token %d) from %s to at least %s: both live for %v, %s",
				a.worker, a.token, r.at(a.returned), r.at(a.lastLive), b.worker, b.token, r.at(b.returned), r.at(b.lastLive),
				time.Duration(min(a.lastLive, b.lastLive)-b.returned), r.phaseAt(b.returned, min(a.lastLive, b.lastLive)))
		}
	}
	// Fencing tokens increase in the order leases were handed out.
	for i := 1; i < len(leases); i++ {
		a, b := leases[i-1], leases[i]
		if b.token <= a.token {
			fails.add("fencing tokens did not increase in the order leases were handed out",
				"worker %d's lease handed out at %s has token %d, not above the token %d of worker %d's handed out before it at %s (%s)",
				b.worker, r.at(b.returned), b.token, a.token, a.worker, r.at(a.returned), r.phaseAt(b.called, b.returned))
		}
	}
	// The fenced resource never accepted a write with a token below one
	// written before it (a stale holder's late write).
	for i := 1; i < len(r.log.written); i++ {
		if a, b := r.log.written[i-1], r.log.written[i]; b.token < a.token {
			fails.add("the fenced resource accepted a stale write", "worker %d's write with token %d after worker %d's with token %d",
				b.worker, b.token, a.worker, a.token)
		}
	}
	if len(leases) == 0 {
		fails.add("no lease was handed out", "")
	}
}

// faultFailures collects the checker's failures by kind, to report each
// kind once with its count and first examples.
type faultFailures struct {
	kinds []string
	n     map[string]int
	first map[string][]string
}

func (f *faultFailures) add(kind, format string, args ...any) {
	if f.n == nil {
		f.n, f.first = map[string]int{}, map[string][]string{}
	}
	if f.n[kind] == 0 {
		f.kinds = append(f.kinds, kind)
	}
	f.n[kind]++
	if len(f.first[kind]) < 3 {
		f.first[kind] = append(f.first[kind], fmt.Sprintf(format, args...))
	}
}

func (f *faultFailures) report(t *testing.T) {
	t.Helper()
	for _, k := range f.kinds {
		t.Errorf("%s (%d times); first:\n\t%s", k, f.n[k], strings.Join(f.first[k], "\n\t"))
	}
}

// faultLease is what the parent learnt of one lease.
type faultLease struct {
	worker, seq        int
	token              int64
	called, returned   int64
	deadline           int64 // Deadline() right after Acquire returned
	answered           int64 // when the store answered the granting lock.acquire (sendClock)
	lastLive, observed int64
	how                string // lost, released, stopped
	late, lateDeadline int64
	// beyond: the first Deadline() read beyond its send bound, and the
	// latest send start read after it.
	beyond, beyondDeadline, beyondSend int64
	ended                              bool
	writes, refused                    int
}

// faultLog is the parent's fenced resource and the record of the leases,
// served on a loopback TCP port to the workers. Protocol, one line per
// request, one line per answer:
//
//	A worker seq token called returned deadline → OK
//	W worker seq token → OK | KEEP (a fault is on: do not release) | NO greatest
//	E worker seq lastLive observed how late lateDeadline beyond beyondDeadline beyondSend → OK
//
// Times are UnixNano, 0 for none.
type faultLog struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	// guarded by mu
	leases   []*faultLease
	byID     map[[2]int]*faultLease
	greatest int64
	accepted int
	refused  int
	written  []faultWrite // the accepted writes, in order
	bad      []string
	// keep, keepAll: the workers under a fault, told to keep their lease
	// (not release it) for as long as it lasts
	keep    map[int]bool
	keepAll bool
}

// faultWrite is a write the fenced resource accepted.
type faultWrite struct {
	token  int64
	worker int
}

func startFaultLog(t *testing.T) *faultLog {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	fatalIf(t, "resource listener", err)
	g := &faultLog{ln: ln, byID: map[[2]int]*faultLease{}, keep: map[int]bool{}}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			g.conns = append(g.conns, c)
			g.mu.Unlock()
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				g.serve(c)
			}()
		}
	}()
	t.Cleanup(g.close)
	t.Cleanup(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, b := range g.bad {
			t.Errorf("the fault log got a malformed request: %s", b)
		}
	})
	return g
}

func (g *faultLog) addr() string { return g.ln.Addr().String() }

// setKeep tells worker w (-1: every worker) whether to keep its lease.
func (g *faultLog) setKeep(w int, keep bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w < 0 {
		g.keepAll = keep
	} else {
		g.keep[w] = keep
	}
}

// close stops serving; it returns when every connection's goroutine ended.
func (g *faultLog) close() {
	g.ln.Close()
	g.mu.Lock()
	for _, c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *faultLog) serve(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	w := bufio.NewWriter(c)
	for sc.Scan() {
		reply := g.handle(sc.Text())
		w.WriteString(reply + "\n")
		if w.Flush() != nil {
			return
		}
	}
}

func (g *faultLog) handle(line string) string {
	f := strings.Fields(line)
	n := make([]int64, len(f))
	for i := 1; i < len(f); i++ {
		n[i], _ = strconv.ParseInt(f[i], 10, 64)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case len(f) == 8 && f[0] == "A":
		l := &faultLease{worker: int(n[1]), seq: int(n[2]), token: n[3], called: n[4], returned: n[5], deadline: n[6], answered: n[7]}
		g.leases = append(g.leases, l)
		g.byID[[2]int{l.worker, l.seq}] = l
		return "OK"
	case len(f) == 4 && f[0] == "W":
		l := g.byID[[2]int{int(n[1]), int(n[2])}]
		token := n[3]
		if token < g.greatest {
			g.refused++
			if l != nil {
				l.refused++
			}
			return "NO " + strconv.FormatInt(g.greatest, 10)
		}
		g.greatest = token
		g.accepted++
		g.written = append(g.written, faultWrite{token: token, worker: int(n[1])})
		if l != nil {
			l.writes++
		}
		if g.keepAll || g.keep[int(n[1])] {
			return "KEEP"
		}
		return "OK"
	case len(f) == 11 && f[0] == "E":
		l := g.byID[[2]int{int(n[1]), int(n[2])}]
		if l == nil {
			break
		}
		l.lastLive, l.observed, l.how, l.late, l.lateDeadline, l.ended = n[3], n[4], f[5], n[6], n[7], true
		l.beyond, l.beyondDeadline, l.beyondSend = n[8], n[9], n[10]
		return "OK"
	}
	if len(g.bad) < 5 {
		g.bad = append(g.bad, strconv.Quote(line))
	}
	return "ERR"
}

// maxToken returns the greatest token of a lease handed out so far.
func (g *faultLog) maxToken() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var m int64
	for _, l := range g.leases {
		m = max(m, l.token)
	}
	return m
}

// count counts the leases that match.
func (g *faultLog) count(match func(*faultLease) bool) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, l := range g.leases {
		if match(l) {
			n++
		}
	}
	return n
}

// holder returns the worker of a lease handed out after since that has
// not ended and was seen live (it wrote), or -1.
func (g *faultLog) holder(since int64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := len(g.leases) - 1; i >= 0; i-- {
		if l := g.leases[i]; l.returned > since && !l.ended && l.writes > 0 {
			return l.worker
		}
	}
	return -1
}

// summary counts the leases and how they ended.
func (g *faultLog) summary() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	lost, released := 0, 0
	for _, l := range g.leases {
		switch l.how {
		case "lost":
			lost++
		case "released", "stopped":
			released++
		}
	}
	return fmt.Sprintf("%d leases handed out (%d lost, %d released)", len(g.leases), lost, released)
}

// live lists the leases live at some time between from and to, and how
// each ended.
func (r *faultRig) live(from, to int64) string {
	var out []string
	for _, l := range r.log.leases {
		end := max(l.lastLive, l.returned)
		if l.returned > to || end < from {
			continue
		}
		out = append(out, fmt.Sprintf("worker %d token …%d %s→%s %s", l.worker, l.token%10000, r.at(l.returned), r.at(l.observed), l.how))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// ---------------------------------------------------------------------------
// the child side

// childFaultWorker acquires the key, works under the lease — checking
// lease.Err() and writing to the parent's fenced resource about every
// millisecond — for faultHold to twice that, releases it, and starts
// again, until the parent says stop. It reports every lease to the
// parent's log.
func childFaultWorker(ctx context.Context, st *warden.Store, cfg childConfig, res *childResult, mu *sync.Mutex, fail func(string, ...any)) {
	addr, err := os.ReadFile(filepath.Join(cfg.Dir, faultServerFile))
	if err != nil {
		fail("resource address: %v", err)
		return
	}
	conn, err := net.Dial("tcp", string(addr))
	if err != nil {
		fail("resource: %v", err)
		return
	}
	defer conn.Close()
	in := bufio.NewReader(conn)
	call := func(format string, args ...any) string {
		if _, err := fmt.Fprintf(conn, format+"\n", args...); err != nil {
			fail("resource: %v", err)
			return ""
		}
		reply, err := in.ReadString('\n')
		if err != nil {
			fail("resource: %v", err)
		}
		return strings.TrimSpace(reply)
	}

	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if childAwait(runCtx, filepath.Join(cfg.Dir, faultStopFile)) == nil {
			stop()
		}
	}()
	defer func() { stop(); <-stopped }()

	// The lock package's store notes when each acquire and refresh began.
	sends := &sendClock{}
	wst := warden.New(unclosed(st.Driver()), &warden.Options{Hook: sends, Logger: st.Logger()})
	defer wst.Close()
	skew := cfg.TTL / 20
	l, err := lock.New(wst, &lock.Options{TTL: cfg.TTL, ClockSkew: skew, RetryMax: faultRetryMax})
	if err != nil {
		fail("lock.New: %v", err)
		return
	}
	defer l.Close() // under faults a release may fail: the holding lapses
	if err := writeAtomic(filepath.Join(cfg.Dir, fmt.Sprintf(faultOwnerFile, cfg.ID)), []byte(l.Owner())); err != nil {
		fail("owner: %v", err)
		return
	}
	yield := filepath.Join(cfg.Dir, fmt.Sprintf(faultYieldFile, cfg.ID))
	var timeouts, releaseErrs, leases, lost int
	defer func() {
		mu.Lock()
		res.Values = append(res.Values, fmt.Sprintf("%d leases (%d lost), %d Acquire calls timed out, %d releases failed", leases, lost, timeouts, releaseErrs))
		mu.Unlock()
	}()
	tick := time.NewTimer(0)
	defer tick.Stop()
	for seq := 0; runCtx.Err() == nil; seq++ {
		for fileExists(yield) { // the parent lets another worker win
			if !sleepCtx(runCtx, 2*time.Millisecond) {
				break
			}
		}
		actx, cancel := context.WithTimeout(runCtx, faultAcquireTimeout)
		called := time.Now()
		lease, err := l.Acquire(actx, cfg.Key)
		returned := time.Now()
		cancel()
		if err != nil {
			switch {
			case runCtx.Err() != nil:
			case errors.Is(err, context.DeadlineExceeded):
				timeouts++
			default:
				fail("Acquire: %v", err)
				return
			}
			continue
		}
		leases++
		var beyond, beyondDeadline, beyondSend time.Time
		// checkSend checks a deadline just read against the latest send.
		checkSend := func(at, d time.Time) {
			if sent := sends.latest(); d.After(sent.Add(cfg.TTL-skew)) && beyond.IsZero() {
				beyond, beyondDeadline, beyondSend = at, d, sent
			}
		}
		deadline := lease.Deadline()
		checkSend(returned, deadline)
		var lastLive, late, lateDeadline time.Time
		// check checks the lease at once: live, and before its deadline?
		check := func() bool {
			at := time.Now()
			if lease.Err() != nil {
				return false
			}
			lastLive = at
			d := lease.Deadline()
			if !at.Before(d) && late.IsZero() {
				late, lateDeadline = at, d
			}
			checkSend(at, d)
			return true
		}
		live := check() // first, before telling anyone
		call("A %d %d %d %d %d %d %d", cfg.ID, seq, lease.Token(), called.UnixNano(), returned.UnixNano(), deadline.UnixNano(), sends.lastAnswer().UnixNano())
		hold := cfg.Pause + rand.N(cfg.Pause+1)
		kept := returned
		how := "lost"
		for ; live; live = check() {
			if call("W %d %d %d", cfg.ID, seq, lease.Token()) == "KEEP" {
				kept = time.Now() // under a fault: work on while the lease lasts
			}
			if runCtx.Err() != nil {
				how = "stopped"
				break
			}
			if time.Since(kept) >= hold {
				how = "released"
				break
			}
			tick.Reset(time.Millisecond)
			select {
			case <-tick.C:
			case <-lease.Done():
			case <-runCtx.Done():
			}
		}
		observed := time.Now()
		rctx, cancel := context.WithTimeout(context.Background(), faultAcquireTimeout)
		if how != "lost" {
			// Release cancels the lease's context first: it ends here.
			if err := lease.Release(rctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
				releaseErrs++
			}
		} else {
			lost++
			_ = lease.Release(rctx) // ends a holding the store may still have
		}
		cancel()
		call("E %d %d %d %d %s %d %d %d %d %d", cfg.ID, seq, nanos(lastLive), observed.UnixNano(), how,
			nanos(late), nanos(lateDeadline), nanos(beyond), nanos(beyondDeadline), nanos(beyondSend))
		if how == "released" {
			// Let the other workers, polling, take their turn.
			sleepCtx(runCtx, 2*faultRetryMax)
		}
	}
}

// sendClock is a warden.Hook that keeps the latest start of a lock.acquire
// or lock.refresh call: lock reads its send time just before calling the
// store, so every send time lock knows of is at most the latest start.
//
// It also keeps when the last lock.acquire call was answered (AfterOp
// runs after the store answered and before lock sees the answer): lock
// decides whether a grant came too late after that instant, so a lease
// whose deadline is already behind it was handed out past its deadline,
// however long the worker then took to note that Acquire returned.
type sendClock struct {
	mu       sync.Mutex
	last     time.Time
	answered time.Time // the last lock.acquire's answer
}

func (c *sendClock) AfterOp(_ context.Context, op warden.OpInfo) {
	if op.Op != "lock.acquire" && op.Op != "lock.refresh" {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if op.Start.After(c.last) {
		c.last = op.Start
	}
	if op.Op == "lock.acquire" {
		c.answered = now
	}
}

func (c *sendClock) lastAnswer() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answered
}

func (c *sendClock) latest() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// fileExists reports whether path exists.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// nanos is t.UnixNano(), 0 for the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
