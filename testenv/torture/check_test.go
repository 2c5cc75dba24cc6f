package main

import (
	"strings"
	"testing"
	"time"
)

// ms is a synthetic instant: n milliseconds after a fixed origin.
func ms(n int64) int64 { return 1_700_000_000_000_000_000 + n*int64(time.Millisecond) }

// leaseEvents returns the wait, begin and end events of one lease.
func leaseEvents(pid int, id, key string, token, wait, begin, end int64, ttl time.Duration) []Event {
	return []Event{
		{Ev: "wait", T: ms(wait), PID: pid, Key: key},
		{Ev: "begin", T: ms(begin), PID: pid, Key: key, Lease: id, Token: token, TTL: int64(ttl)},
		{Ev: "end", T: ms(end), PID: pid, Key: key, Lease: id, Token: token, How: "released"},
	}
}

// cleanRun is a run that keeps every promise: two processes take key k in
// turn, write their tokens (one late write refused), exit cleanly and keep
// their goroutines and descriptors.
func cleanRun() Run {
	var evs []Event
	evs = append(evs, leaseEvents(1, "1-0-1", "k", 10, 0, 0, 300, 300*time.Millisecond)...)
	evs = append(evs, leaseEvents(2, "2-0-1", "k", 11, 100, 400, 700, 300*time.Millisecond)...)
	evs = append(evs,
		Event{Ev: "stats", T: ms(0), PID: 1, Phase: "warm", Goroutines: 40, FDs: 12},
		Event{Ev: "stats", T: ms(900), PID: 1, Phase: "end", Goroutines: 45, FDs: 13},
		Event{Ev: "exit", T: ms(950), PID: 1},
		Event{Ev: "exit", T: ms(950), PID: 2},
	)
	return Run{
		Store: "test", Duration: time.Second, End: ms(1000), Events: evs,
		Writes: []Write{
			{Key: "k", Token: 10, Lease: "1-0-1", T: ms(1), Accepted: true},
			{Key: "k", Token: 10, Lease: "1-0-1", T: ms(200), Accepted: true},
			{Key: "k", Token: 11, Lease: "2-0-1", T: ms(401), Accepted: true},
			{Key: "k", Token: 10, Lease: "1-0-1", T: ms(402), Accepted: false}, // stale, refused
		},
		Exits: []Exit{{Slot: 0, PID: 1, Clean: true}, {Slot: 1, PID: 2, Clean: true}},
	}
}

// mustFail checks that rep fails and that a problem line names kind.
func mustFail(t *testing.T, rep *Report, kind string) {
	t.Helper()
	if rep.Pass() {
		t.Fatalf("the run passed: %s", rep.Line())
	}
	if !strings.Contains(rep.Line(), "result=FAIL") {
		t.Errorf("summary without result=FAIL: %s", rep.Line())
	}
	for _, p := range rep.Problems {
		if strings.HasPrefix(p, kind+": ") {
			return
		}
	}
	t.Errorf("no %q problem among %q", kind, rep.Problems)
}

func TestCheckClean(t *testing.T) {
	rep := Check(cleanRun())
	if !rep.Pass() {
		t.Fatalf("a clean run failed: %s\n%s", rep.Line(), strings.Join(rep.Problems, "\n"))
	}
	if rep.Acquisitions != 2 || rep.StaleRefused != 1 || rep.StaleAccepted != 0 || rep.Overlaps != 0 {
		t.Errorf("summary %s", rep.Line())
	}
	if !strings.Contains(rep.Line(), "result=PASS") || !strings.Contains(rep.Line(), "stale-refused=1") {
		t.Errorf("summary %s", rep.Line())
	}
}

func TestCheckOverlap(t *testing.T) {
	run := cleanRun()
	// The second lease begins while the first is still live.
	run.Events[4].T = ms(250)
	rep := Check(run)
	if rep.Overlaps != 1 || rep.OverlapsStop != 0 {
		t.Errorf("overlaps %d, under SIGSTOP %d; want 1, 0", rep.Overlaps, rep.OverlapsStop)
	}
	mustFail(t, rep, "overlap")
}

func TestCheckOverlapUnderSIGSTOP(t *testing.T) {
	run := cleanRun()
	run.Events[4].T = ms(250)
	run.Faults = []Fault{{Kind: faultStop, PID: 1, Start: ms(100), End: ms(900)}}
	rep := Check(run)
	if rep.Overlaps != 0 || rep.OverlapsStop != 1 {
		t.Errorf("overlaps %d, under SIGSTOP %d; want 0, 1", rep.Overlaps, rep.OverlapsStop)
	}
	if !rep.Pass() {
		t.Errorf("an overlap under SIGSTOP failed the run: %s %q", rep.Line(), rep.Problems)
	}
}

func TestCheckStaleWriteAccepted(t *testing.T) {
	run := cleanRun()
	run.Writes[3].Accepted = true
	rep := Check(run)
	if rep.StaleAccepted != 1 {
		t.Errorf("stale writes accepted %d, want 1", rep.StaleAccepted)
	}
	mustFail(t, rep, "stale")
}

func TestCheckSharedTokenAccepted(t *testing.T) {
	run := cleanRun()
	run.Writes = append(run.Writes, Write{Key: "k", Token: 11, Lease: "3-0-1", T: ms(500), Accepted: true})
	rep := Check(run)
	if rep.StaleAccepted != 1 {
		t.Errorf("stale writes accepted %d, want 1 (a token shared by two leases)", rep.StaleAccepted)
	}
	mustFail(t, rep, "stale")
}

func TestCheckRefusedFreshWrite(t *testing.T) {
	run := cleanRun()
	run.Writes[2].Accepted = false
	mustFail(t, Check(run), "fence")
}

func TestCheckTokenBackwards(t *testing.T) {
	run := cleanRun()
	// The later lease got a smaller token than the one that ended before.
	for i := range run.Events {
		if run.Events[i].Lease == "2-0-1" {
			run.Events[i].Token = 9
		}
	}
	for i := range run.Writes {
		if run.Writes[i].Lease == "2-0-1" {
			run.Writes[i].Token = 9
		}
	}
	rep := Check(run)
	if rep.TokensBackwards != 1 {
		t.Errorf("tokens backwards %d, want 1", rep.TokensBackwards)
	}
	mustFail(t, rep, "token")
}

func TestCheckStuckLock(t *testing.T) {
	run := cleanRun()
	// Process 1 holds k2 when it is killed at 1 s; process 2 waits for k2
	// from 1.1 s on but gets it only at 5 s: TTL 300 ms + margin 3.5 s
	// would have been 4.8 s.
	run.Events = append(run.Events,
		Event{Ev: "wait", T: ms(800), PID: 1, Key: "k2"},
		Event{Ev: "begin", T: ms(800), PID: 1, Key: "k2", Lease: "1-1-1", Token: 20, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "wait", T: ms(1100), PID: 2, Key: "k2"},
		Event{Ev: "begin", T: ms(5000), PID: 2, Key: "k2", Lease: "2-0-2", Token: 21, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "end", T: ms(5100), PID: 2, Key: "k2", Lease: "2-0-2", Token: 21, How: "released"},
	)
	run.Faults = []Fault{{Kind: faultKill, PID: 1, Start: ms(1000), End: ms(1000)}}
	run.Exits[0].Killed = true
	run.End = ms(10000)
	rep := Check(run)
	if rep.Stuck != 1 || rep.HandOvers != 1 || rep.MaxHandOver != 4*time.Second {
		t.Errorf("stuck %d of %d hand-overs, max %s; want 1 of 1, 4s", rep.Stuck, rep.HandOvers, rep.MaxHandOver)
	}
	mustFail(t, rep, "stuck")

	// Taken over in time, the same run passes.
	for i := range run.Events {
		if run.Events[i].Lease == "2-0-2" && run.Events[i].Ev == "begin" {
			run.Events[i].T = ms(1400)
		}
	}
	if rep := Check(run); !rep.Pass() || rep.HandOvers != 1 || rep.MaxHandOver != 400*time.Millisecond {
		t.Errorf("a timely hand-over: %s %q", rep.Line(), rep.Problems)
	}
}

// TestCheckStuckIgnoresDeadWaiters: a process killed while it waited for
// a key leaves a "wait" without an answer in its log; it does not make a
// later holder's death a stuck lock when nobody alive waits for the key.
func TestCheckStuckIgnoresDeadWaiters(t *testing.T) {
	run := cleanRun()
	run.Events = append(run.Events,
		Event{Ev: "wait", T: ms(500), PID: 3, Key: "k2"}, // killed at 600 ms, never answered
		Event{Ev: "wait", T: ms(800), PID: 1, Key: "k2"},
		Event{Ev: "begin", T: ms(800), PID: 1, Key: "k2", Lease: "1-1-1", Token: 20, TTL: int64(300 * time.Millisecond)},
		// Process 2 asks for k2 only at 4.9 s, and gets it at once.
		Event{Ev: "wait", T: ms(4900), PID: 2, Key: "k2"},
		Event{Ev: "begin", T: ms(5000), PID: 2, Key: "k2", Lease: "2-0-2", Token: 21, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "end", T: ms(5100), PID: 2, Key: "k2", Lease: "2-0-2", Token: 21, How: "released"},
	)
	run.Faults = []Fault{
		{Kind: faultKill, PID: 3, Start: ms(600), End: ms(600)},
		{Kind: faultKill, PID: 1, Start: ms(1000), End: ms(1000)},
	}
	run.Exits[0].Killed = true
	run.Exits = append(run.Exits, Exit{Slot: 2, PID: 3, Killed: true})
	run.End = ms(10000)
	if rep := Check(run); rep.Stuck != 0 {
		t.Errorf("a dead waiter made a stuck lock: %s %q", rep.Line(), rep.Problems)
	}
	// A live waiter with the same history is still caught.
	run.Faults = run.Faults[1:]
	if rep := Check(run); rep.Stuck != 1 {
		t.Errorf("a live waiter left waiting: stuck %d, want 1: %s", rep.Stuck, rep.Line())
	}
}

// TestCheckStuckAfterSIGSTOPResumed: a holder stopped with SIGSTOP that
// runs again and takes the key with a new lease shows the key was not
// stuck, even though no other process took it; past the limit, or with
// only the old lease, it is still stuck.
func TestCheckStuckAfterSIGSTOPResumed(t *testing.T) {
	run := cleanRun()
	run.Events = append(run.Events,
		Event{Ev: "wait", T: ms(800), PID: 1, Key: "k2"},
		Event{Ev: "begin", T: ms(800), PID: 1, Key: "k2", Lease: "1-0-2", Token: 20, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "end", T: ms(1300), PID: 1, Key: "k2", Lease: "1-0-2", Token: 20, How: "lost"},
		Event{Ev: "wait", T: ms(900), PID: 2, Key: "k2"}, // waits throughout
		// Process 1 runs again at 2 s and a goroutine of its own takes k2.
		Event{Ev: "wait", T: ms(2000), PID: 1, Key: "k2", G: 1},
		Event{Ev: "begin", T: ms(2010), PID: 1, Key: "k2", G: 1, Lease: "1-1-1", Token: 21, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "end", T: ms(2100), PID: 1, Key: "k2", G: 1, Lease: "1-1-1", Token: 21, How: "released"},
		Event{Ev: "begin", T: ms(6000), PID: 2, Key: "k2", Lease: "2-0-2", Token: 22, TTL: int64(300 * time.Millisecond)},
		Event{Ev: "end", T: ms(6100), PID: 2, Key: "k2", Lease: "2-0-2", Token: 22, How: "released"},
	)
	run.Faults = []Fault{{Kind: faultStop, PID: 1, Start: ms(1000), End: ms(2000)}}
	run.End = ms(10000)
	if rep := Check(run); rep.Stuck != 0 || rep.HandOvers != 1 {
		t.Errorf("the resumed holder's new lease at 2.01 s (limit 2.8 s): %s %q", rep.Line(), rep.Problems)
	}
	// Resumed too late for the limit: stuck.
	run.Faults[0].End = ms(3500)
	for i := range run.Events {
		if run.Events[i].Lease == "1-1-1" {
			run.Events[i].T += 1500
		}
	}
	if rep := Check(run); rep.Stuck != 1 {
		t.Errorf("a new lease only at 3.51 s: stuck %d, want 1: %s", rep.Stuck, rep.Line())
	}
}

func TestCheckUncleanExit(t *testing.T) {
	run := cleanRun()
	run.Exits[1] = Exit{Slot: 1, PID: 2, Code: 1, Stderr: "boom"}
	mustFail(t, Check(run), "exit")
}

func TestCheckLeak(t *testing.T) {
	run := cleanRun()
	run.Events = append(run.Events,
		Event{Ev: "stats", T: ms(0), PID: 2, Phase: "warm", Goroutines: 40, FDs: 12},
		Event{Ev: "stats", T: ms(900), PID: 2, Phase: "end", Goroutines: 40 + defaultGoroutineSlack + 1, FDs: 12},
	)
	mustFail(t, Check(run), "leak")
}

func TestCheckLeaseNeverEnded(t *testing.T) {
	run := cleanRun()
	run.Events = append(run.Events, Event{Ev: "begin", T: ms(800), PID: 2, Key: "k3", Lease: "2-0-9", Token: 1})
	mustFail(t, Check(run), "log")
}
