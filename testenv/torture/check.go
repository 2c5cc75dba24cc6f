package main

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Run is everything the checker looks at for one store: the workers' logs,
// the faults the orchestrator injected, the fenced resource's record and
// how each worker process ended.
type Run struct {
	Store    string
	Duration time.Duration
	// End is when the orchestrator stopped injecting faults (Unix ns): a
	// process fault too close to it to be followed is not checked.
	End    int64
	Events []Event
	Faults []Fault
	Writes []Write
	Exits  []Exit
	// Margin is how long after a holder's TTL a waiter may take to get the
	// lock once the holder died or stopped (see defaultMargin).
	Margin time.Duration
	// GoroutineSlack and FDSlack are the growth allowed per worker between
	// its warm-up sample and its end sample (see defaultGoroutineSlack).
	GoroutineSlack, FDSlack int
}

// defaultMargin is the stuck-lock margin. After a holder is killed or
// stopped at instant f, its holding lapses in the store at the latest at
// f + TTL (its last acquire or refresh was sent before f). A waiter then
// needs at most: the rest of its back-off sleep (RetryMax, 100 ms, and a
// waiter never sleeps past the holder's known expiry), one acquire round
// trip through its healthy proxy (on the shared 2-core machine, with seven
// stores' workers running, dynalite and FerretDB answer in up to a few
// hundred ms), and being scheduled: 1.5 s covers that with room. On the
// stores that queue waiters for a fair hand-off (MySQL, SQLite, Redis)
// the free key may also be reserved for the first waiter of its
// queue — which may be a worker of the killed or stopped process — until
// that waiter's entry lapses or its turn ends: at most 2 s (MySQL's
// handoffGrace, SQLite's turnGrace and turnTTL; Redis's turn of 1 s plus
// one 500 ms renewal). So 1.5 s + 2 s. A lock that is really stuck (a
// holding that does not lapse, a waiter that is never woken) stays stuck
// for good, and is still caught.
const defaultMargin = 3500 * time.Millisecond

// The leak slack. The end sample and the warm-up sample are both taken
// while the worker runs, so they differ by what is in flight at the
// instant: per Locker an acquire (one goroutine and its timer), a refresh
// worker (the Locker starts them on demand, up to 16), a watcher per key;
// per store the drivers' connection goroutines (pgx, go-sql-driver and the
// MongoDB driver keep one or two per pooled connection, pools grow with
// concurrency and are re-dialed after resets). Each worker has 4 Lockers
// over 3 keys, so up to 4×(1+16)+4×3 goroutines can legitimately come and
// go; 64 bounds that. Open descriptors are the pooled connections (at most
// one per concurrent operation: 4 Lockers × a few) and the fence client's
// keep-alive connections: 16. A leak per acquisition or per fault —
// hundreds or thousands over a run — exceeds either.
const (
	defaultGoroutineSlack = 64
	defaultFDSlack        = 16
)

// Report is what the checker found for one store.
type Report struct {
	Store        string
	Duration     time.Duration
	Acquisitions int
	Faults       map[string]int // by kind
	LeasesLost   int
	// StaleRefused counts the writes the fenced resource refused: each
	// carried a token below one it had already accepted for the key.
	StaleRefused int
	// StaleAccepted counts the accepted writes that should have been
	// refused: a token below one accepted earlier for the key, or equal
	// to it but from another lease (two leases sharing a token).
	StaleAccepted int
	// Overlaps counts pairs of leases on one key, of distinct holders,
	// both live at one instant; OverlapsStop those where one of the two
	// processes was stopped (SIGSTOP) during its lease.
	Overlaps, OverlapsStop int
	// TokensBackwards counts leases whose token is not above the token of
	// every lease of the key that had ended before they began (a token
	// handed out twice counts too).
	TokensBackwards int
	// Stuck counts holders killed or stopped while holding a key with
	// waiters present, after which no other process got the key within
	// the holder's TTL plus Margin. HandOvers counts those followed.
	Stuck, HandOvers int
	MaxHandOver      time.Duration
	// UncleanExits counts worker processes that were not killed and did
	// not exit 0 after logging their exit; Leaks the workers whose
	// goroutines or descriptors grew beyond the slack.
	UncleanExits, Leaks int
	// Problems says what went wrong, one line each (the first few of each
	// kind), for the report under the summary.
	Problems []string
}

// Pass reports whether the run kept every promise checked.
func (r *Report) Pass() bool {
	return r.StaleAccepted == 0 && r.Overlaps == 0 && r.TokensBackwards == 0 &&
		r.Stuck == 0 && r.UncleanExits == 0 && r.Leaks == 0 && len(r.Problems) == 0
}

// Line is the one-line summary of the run.
func (r *Report) Line() string {
	result := "PASS"
	if !r.Pass() {
		result = "FAIL"
	}
	kinds := slices.Sorted(maps.Keys(r.Faults))
	var fs []string
	for _, k := range kinds {
		fs = append(fs, fmt.Sprintf("%s:%d", k, r.Faults[k]))
	}
	faults := strings.Join(fs, ",")
	if faults == "" {
		faults = "none"
	}
	return fmt.Sprintf("torture store=%s duration=%s acquisitions=%d faults=%s leases-lost=%d "+
		"stale-refused=%d stale-accepted=%d overlaps=%d sigstop-overlaps=%d tokens-backwards=%d "+
		"stuck=%d/%d max-handover=%s unclean-exits=%d leaks=%d result=%s",
		r.Store, r.Duration.Round(time.Second), r.Acquisitions, faults, r.LeasesLost,
		r.StaleRefused, r.StaleAccepted, r.Overlaps, r.OverlapsStop, r.TokensBackwards,
		r.Stuck, r.HandOvers, r.MaxHandOver.Round(time.Millisecond), r.UncleanExits, r.Leaks, result)
}

// maxProblems bounds the problem lines kept per kind.
const maxProblems = 5

// problem adds a problem line unless maxProblems of its kind are kept.
func (r *Report) problem(kind string, format string, args ...any) {
	n := 0
	for _, p := range r.Problems {
		if strings.HasPrefix(p, kind+": ") {
			n++
		}
	}
	if n < maxProblems {
		r.Problems = append(r.Problems, kind+": "+fmt.Sprintf(format, args...))
	}
}

// lease is one lease as the logs tell it.
type lease struct {
	id         string
	key        string
	token      int64
	pid, slot  int
	ttl        time.Duration
	begin, end int64 // the live interval [begin, end)
	ended      bool  // an end event was logged
}

// empty reports whether the lease was never live as seen (its end came
// before the worker could note its beginning: the process was stopped
// between Acquire returning and the log line).
func (l *lease) empty() bool { return l.end <= l.begin }

// fmtT formats a Unix-ns instant relative to base, for problem lines.
func fmtT(t, base int64) string { return time.Duration(t - base).Round(time.Millisecond).String() }

// Check verifies a run; see Report for what it counts.
func Check(run Run) *Report {
	rep := &Report{Store: run.Store, Duration: run.Duration, Faults: map[string]int{}}
	if run.Margin == 0 {
		run.Margin = defaultMargin
	}
	for _, f := range run.Faults {
		rep.Faults[f.Kind]++
	}
	var base int64 = math.MaxInt64
	for _, e := range run.Events {
		base = min(base, e.T)
	}
	killedAt := map[int]int64{} // pid → when it was killed
	stops := map[int][][2]int64{}
	for _, f := range run.Faults {
		switch f.Kind {
		case faultKill:
			killedAt[f.PID] = f.Start
		case faultStop:
			stops[f.PID] = append(stops[f.PID], [2]int64{f.Start, f.End})
		}
	}
	leases := collectLeases(run, rep, killedAt, base)
	rep.Acquisitions = len(leases)
	byKey := map[string][]*lease{}
	for _, l := range leases {
		byKey[l.key] = append(byKey[l.key], l)
	}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		ls := byKey[key]
		slices.SortFunc(ls, func(a, b *lease) int { return cmp.Or(cmp.Compare(a.begin, b.begin), strings.Compare(a.id, b.id)) })
		checkOverlaps(rep, ls, stops, base)
		checkTokenOrder(rep, ls, base)
	}
	checkWrites(rep, run.Writes, base)
	checkStuck(rep, run, byKey, base)
	checkExits(rep, run)
	checkLeaks(rep, run)
	return rep
}

// collectLeases pairs begin and end events into leases. A lease with no
// end event belongs to a killed worker (it ended when the worker was
// killed: a dead process acts no more) or is a problem.
func collectLeases(run Run, rep *Report, killedAt map[int]int64, base int64) []*lease {
	byID := map[string]*lease{}
	var order []*lease
	// Begins first, then ends: an empty lease's end comes before its begin.
	for _, e := range run.Events {
		if e.Ev != "begin" {
			continue
		}
		if _, dup := byID[e.Lease]; dup {
			rep.problem("log", "lease %s begins twice", e.Lease)
			continue
		}
		l := &lease{id: e.Lease, key: e.Key, token: e.Token, pid: e.PID, slot: e.Slot,
			ttl: time.Duration(e.TTL), begin: e.T, end: math.MaxInt64}
		byID[e.Lease] = l
		order = append(order, l)
	}
	for _, e := range run.Events {
		if e.Ev != "end" {
			continue
		}
		if e.How == "lost" {
			rep.LeasesLost++
		}
		if l := byID[e.Lease]; l != nil {
			l.end, l.ended = e.T, true
		} else {
			rep.problem("log", "lease %s ends without beginning", e.Lease)
		}
	}
	for _, l := range order {
		if l.ended {
			continue
		}
		if k, ok := killedAt[l.pid]; ok {
			l.end = k
			continue
		}
		rep.problem("log", "lease %s (key %s, token %d, pid %d) began at %s and never ended", l.id, l.key, l.token, l.pid, fmtT(l.begin, base))
	}
	return order
}

// stoppedDuring reports whether pid was stopped at some instant of
// [from, to].
func stoppedDuring(stops map[int][][2]int64, pid int, from, to int64) bool {
	for _, s := range stops[pid] {
		if s[0] <= to && s[1] >= from {
			return true
		}
	}
	return false
}

// checkOverlaps counts pairs of leases of one key (sorted by begin) that
// are both live at one instant.
func checkOverlaps(rep *Report, ls []*lease, stops map[int][][2]int64, base int64) {
	var live []*lease // leases begun so far that may still be live
	for _, b := range ls {
		if b.empty() {
			continue
		}
		kept := live[:0]
		for _, a := range live {
			if a.end > b.begin {
				kept = append(kept, a)
			}
		}
		live = kept
		for _, a := range live {
			if stoppedDuring(stops, a.pid, a.begin, a.end) || stoppedDuring(stops, b.pid, b.begin, b.end) {
				rep.OverlapsStop++
				continue
			}
			rep.Overlaps++
			rep.problem("overlap", "key %s: lease %s (pid %d, token %d) live %s–%s and lease %s (pid %d, token %d) live %s–%s",
				b.key, a.id, a.pid, a.token, fmtT(a.begin, base), fmtT(a.end, base),
				b.id, b.pid, b.token, fmtT(b.begin, base), fmtT(b.end, base))
		}
		live = append(live, b)
	}
}

// checkTokenOrder verifies that each lease's token is above the token of
// every lease of its key that ended before it began, and that no token is
// handed out twice. ls is sorted by begin.
func checkTokenOrder(rep *Report, ls []*lease, base int64) {
	seen := map[int64]*lease{}
	byEnd := slices.Clone(ls)
	slices.SortFunc(byEnd, func(a, b *lease) int { return cmp.Compare(a.end, b.end) })
	var maxEnded *lease // the lease with the greatest token among those ended so far
	i := 0
	for _, b := range ls {
		if prev := seen[b.token]; prev != nil {
			rep.TokensBackwards++
			rep.problem("token", "key %s: token %d handed out to lease %s and to lease %s", b.key, b.token, prev.id, b.id)
		}
		seen[b.token] = b
		if b.empty() {
			continue
		}
		for ; i < len(byEnd) && byEnd[i].end <= b.begin; i++ {
			if a := byEnd[i]; !a.empty() && (maxEnded == nil || a.token > maxEnded.token) {
				maxEnded = a
			}
		}
		if maxEnded != nil && b.token <= maxEnded.token {
			rep.TokensBackwards++
			rep.problem("token", "key %s: lease %s began at %s with token %d, not above token %d of lease %s that ended at %s",
				b.key, b.id, fmtT(b.begin, base), b.token, maxEnded.token, maxEnded.id, fmtT(maxEnded.end, base))
		}
	}
}

// checkWrites replays the fenced resource's record: an accepted write must
// carry a token above every token accepted before for its key, or the
// token of the lease that wrote last (its own). A refused write must have
// deserved it.
func checkWrites(rep *Report, writes []Write, base int64) {
	type last struct {
		token int64
		lease string
	}
	top := map[string]last{}
	for _, w := range writes {
		t, seen := top[w.Key]
		fresh := !seen || w.Token > t.token || (w.Token == t.token && w.Lease == t.lease)
		switch {
		case w.Accepted && fresh:
			top[w.Key] = last{w.Token, w.Lease}
		case w.Accepted:
			rep.StaleAccepted++
			rep.problem("stale", "key %s: write of lease %s with token %d accepted at %s after token %d of lease %s",
				w.Key, w.Lease, w.Token, fmtT(w.T, base), t.token, t.lease)
		case fresh:
			rep.problem("fence", "key %s: write of lease %s with token %d refused at %s, above token %d",
				w.Key, w.Lease, w.Token, fmtT(w.T, base), t.token)
		default:
			rep.StaleRefused++
		}
	}
}

// waiting reports whether a process other than pid was waiting in Acquire
// for key at instant t: one of its goroutines had called Acquire for key
// and not yet logged the outcome (a goroutine makes one call at a time,
// and logs its outcome after the call). The order of events does not
// matter.
func waiting(run Run, key string, pid int, t int64) bool {
	type call struct{ pid, g int }
	called := map[call]int64{} // the latest call by then
	answered := map[call]int64{}
	for _, e := range run.Events {
		if e.Key != key || e.PID == pid || e.T > t {
			continue
		}
		c := call{e.PID, e.G}
		switch e.Ev {
		case "wait":
			called[c] = max(called[c], e.T)
		case "begin", "acqfail":
			answered[c] = max(answered[c], e.T)
		}
	}
	for c, at := range called {
		if a, ok := answered[c]; (!ok || a < at) && able(run, c.pid, t) {
			return true
		}
	}
	return false
}

// able reports whether process pid could take a lock at t: it had not
// been killed by then, and was not stopped at that instant. A
// killed waiter's last "wait" has no answer in its log, but it waits for
// nothing.
func able(run Run, pid int, t int64) bool {
	for _, f := range run.Faults {
		if f.PID != pid {
			continue
		}
		if f.Kind == faultKill && f.Start <= t || f.Kind == faultStop && f.Start <= t && t <= f.End {
			return false
		}
	}
	return true
}

// checkStuck follows every holder killed or stopped while holding a key:
// with another process waiting for the key, another process must get it
// within the holder's TTL plus Margin of the fault.
func checkStuck(rep *Report, run Run, byKey map[string][]*lease, base int64) {
	for _, f := range run.Faults {
		if f.Kind != faultKill && f.Kind != faultStop {
			continue
		}
		for _, key := range slices.Sorted(maps.Keys(byKey)) {
			ls := byKey[key]
			var held *lease
			for _, l := range ls {
				if l.pid == f.PID && l.begin <= f.Start && l.end >= f.Start && !l.empty() {
					held = l
				}
			}
			if held == nil {
				continue
			}
			limit := f.Start + int64(held.ttl+run.Margin)
			if limit > run.End {
				continue // the run stopped before the hand-over was due
			}
			var next int64 = math.MaxInt64
			for _, l := range ls {
				// A new holding by another process; or, after SIGSTOP, by
				// the stopped process once it runs again (a new lease, not
				// the one it held): either shows the key was not stuck.
				other := l.pid != f.PID || f.Kind == faultStop && l.begin > f.End && l != held
				if other && l.begin > f.Start && !l.empty() {
					next = min(next, l.begin)
				}
			}
			if next <= limit {
				rep.HandOvers++
				rep.MaxHandOver = max(rep.MaxHandOver, time.Duration(next-f.Start))
				continue
			}
			// Only a process waiting for the key when the holding lapsed
			// could have taken it.
			if !waiting(run, key, f.PID, f.Start+int64(held.ttl)) {
				continue
			}
			rep.HandOvers++
			rep.Stuck++
			gap := "never"
			if next != math.MaxInt64 {
				gap = time.Duration(next - f.Start).Round(time.Millisecond).String()
				rep.MaxHandOver = max(rep.MaxHandOver, time.Duration(next-f.Start))
			}
			rep.problem("stuck", "key %s: %s of pid %d at %s holding lease %s (TTL %s); waiters present; next lease after %s (limit TTL + %s)",
				key, f.Kind, f.PID, fmtT(f.Start, base), held.id, held.ttl, gap, run.Margin)
		}
	}
}

// checkExits counts worker processes that did not end cleanly.
func checkExits(rep *Report, run Run) {
	for _, x := range run.Exits {
		if x.Killed {
			continue
		}
		if x.Crashed || x.Code != 0 || !x.Clean {
			rep.UncleanExits++
			rep.problem("exit", "worker %d (pid %d) ended with status %d, exit logged %v, before the end %v: %s",
				x.Slot, x.PID, x.Code, x.Clean, x.Crashed, x.Stderr)
		}
	}
}

// checkLeaks compares each worker's end sample with its warm-up sample.
func checkLeaks(rep *Report, run Run) {
	gs, fs := run.GoroutineSlack, run.FDSlack
	if gs == 0 {
		gs = defaultGoroutineSlack
	}
	if fs == 0 {
		fs = defaultFDSlack
	}
	type sample struct{ warm, end *Event }
	by := map[int]*sample{}
	for i := range run.Events {
		e := &run.Events[i]
		if e.Ev != "stats" {
			continue
		}
		s := by[e.PID]
		if s == nil {
			s = &sample{}
			by[e.PID] = s
		}
		if e.Phase == "warm" {
			s.warm = e
		} else {
			s.end = e
		}
	}
	for _, pid := range slices.Sorted(maps.Keys(by)) {
		s := by[pid]
		if s.warm == nil || s.end == nil {
			continue // killed, or ended before its warm-up
		}
		if dg, df := s.end.Goroutines-s.warm.Goroutines, s.end.FDs-s.warm.FDs; dg > gs || df > fs {
			rep.Leaks++
			rep.problem("leak", "pid %d: goroutines %d → %d, open fds %d → %d (slack %d, %d)",
				pid, s.warm.Goroutines, s.end.Goroutines, s.warm.FDs, s.end.FDs, gs, fs)
		}
	}
}
