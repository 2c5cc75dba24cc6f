package drivertest

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

// leakWait bounds how long the goroutines and file descriptors of a
// closed store may take to go away (a connection's reader noticing its
// socket closed, say). It is a bound on waiting, not a timed assertion:
// the check polls and passes as soon as the counts are back. It stays
// below the idle timeout of common servers (Node's HTTP servers, dynalite
// among them, drop keep-alive connections after 5 s), so that a server
// closing the connections a store left open does not hide the leak.
const leakWait = 3 * time.Second

// leaks: a store that is opened, used (one call of every kind, watches
// running) and closed leaves no goroutine and no open file behind: the
// process's goroutine count and open file descriptors return to what they
// were before it opened.
//
// Run runs it first, alone: it is not parallel, so it ends before the
// parallel groups start and no other check's goroutines are counted. A
// first cycle, not measured, lets the process start what it starts once
// (the network poller's descriptors, a harness's shared client, pools of
// the runtime); the second cycle is measured from before Open to after
// its subtest ended, so the harness's own cleanups (a client closed with
// the test) have run too.
func (s *suite) leaks(t *testing.T) {
	if !t.Run("Warm", s.leakCycle) {
		return
	}
	_, stacks0 := goroutines()
	g0 := runtime.NumGoroutine()
	fd0, fds0, fdOK := openFDs()
	if !t.Run("Cycle", s.leakCycle) {
		return
	}
	closed := time.Now()
	deadline := closed.Add(leakWait)
	for {
		g := runtime.NumGoroutine()
		fd, _, _ := openFDs()
		if g <= g0 && (!fdOK || fd <= fd0) {
			t.Logf("back to %d goroutines (before: %d) and %d file descriptors (before: %d) %v after the cycle",
				g, g0, fd, fd0, time.Since(closed).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a synchronisation
	}
	_, stacks := goroutines()
	if g := runtime.NumGoroutine(); g > g0 {
		var extra []string
		for id, st := range stacks {
			if _, ok := stacks0[id]; !ok {
				extra = append(extra, st)
			}
		}
		slices.Sort(extra)
		t.Errorf("%s: %d goroutines before the store opened, still %d %v after it closed; the new ones:\n\n%s",
			s.h.Name, g0, g, leakWait, strings.Join(extra, "\n\n"))
	}
	if fd, fds, _ := openFDs(); fdOK && fd > fd0 {
		var extra []string
		for n, target := range fds {
			if old, ok := fds0[n]; !ok || old != target {
				extra = append(extra, n+" -> "+target)
			}
		}
		slices.Sort(extra)
		t.Errorf("%s: %d open file descriptors before the store opened, still %d %v after it closed; new or reused: %s",
			s.h.Name, fd0, fd, leakWait, strings.Join(extra, ", "))
	}
}

// leakCycle opens a store, starts its watches, makes one call of every
// kind, and closes it.
func (s *suite) leakCycle(t *testing.T) {
	ctx := testCtx(t)
	st, _ := s.open(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lch <-chan driver.LockEvent
	var cch <-chan driver.CircuitRecord
	var err error
	if st.Locks().CanWatch() {
		lch, err = st.Locks().Watch(wctx)
		fatalIf(t, "Locks.Watch", err)
	}
	if st.Circuits().CanWatch() {
		cch, err = st.Circuits().Watch(wctx)
		fatalIf(t, "Circuits.Watch", err)
	}
	for _, c := range everyCall {
		errorIf(t, c.name, c.call(ctx, st))
	}
	// The watches run: wait for the first event of the calls above, so
	// that whatever a store starts to deliver events has started.
	if lch != nil {
		select {
		case <-lch:
		case <-time.After(eventWait):
			t.Logf("no lock event within %v (the Notifications checks judge delivery)", eventWait)
		}
	}
	if cch != nil {
		select {
		case <-cch:
		case <-time.After(eventWait):
			t.Logf("no circuit event within %v (the Notifications checks judge delivery)", eventWait)
		}
	}
	fatalIf(t, "Close", st.Close())
	if lch != nil {
		drainClosed(lch)
	}
	if cch != nil {
		drainClosed(cch)
	}
}

// goroutines returns the number of goroutines and the stack of each, by
// goroutine id.
func goroutines() (int, map[string]string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, st := range bytes.Split(buf, []byte("\n\n")) {
		head, _, _ := bytes.Cut(st, []byte(" ["))
		if id, ok := bytes.CutPrefix(head, []byte("goroutine ")); ok {
			out[string(id)] = string(st)
		}
	}
	return len(out), out
}

// openFDs returns the number of the process's open file descriptors and
// what each refers to; ok is false where /proc/self/fd cannot be read (no
// /proc): the descriptor check is then left out.
func openFDs() (n int, fds map[string]string, ok bool) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, nil, false
	}
	fds = make(map[string]string, len(ents))
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			// The descriptor ReadDir itself used, closed since.
			continue
		}
		fds[e.Name()] = target
	}
	return len(fds), fds, true
}
