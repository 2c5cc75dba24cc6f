package lock

import (
	"container/heap"
	"time"
)

// The schedule: every held lease's next wake-up (a refresh due or its
// deadline) in a min-heap, with one timer for the earliest. A Locker with
// ten thousand leases has one timer and no goroutine for them; when the
// timer fires, its callback hands the leases due to wakeUp, which queues
// refreshes for the workers or ends leases at their deadline.

// schedule is a min-heap of leases by wake-up time; guarded by
// Locker.schedMu.
type schedule []*Lease

func (h schedule) Len() int           { return len(h) }
func (h schedule) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h schedule) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}

func (h *schedule) Push(x any) {
	s := x.(*Lease)
	s.idx = len(*h)
	*h = append(*h, s)
}

func (h *schedule) Pop() any {
	old := *h
	n := len(old)
	s := old[n-1]
	old[n-1] = nil
	s.idx = -1
	*h = old[:n-1]
	return s
}

// setWake schedules s to wake up at at. schedMu is a leaf lock: it is
// taken under l.mu or s.mu, never the other way round.
func (l *Locker) setWake(s *Lease, at time.Time) {
	l.schedMu.Lock()
	defer l.schedMu.Unlock()
	s.at = at
	if s.idx >= 0 {
		heap.Fix(&l.sched, s.idx)
	} else {
		heap.Push(&l.sched, s)
	}
	if l.sched[0] == s {
		l.resetTimer()
	}
	// If s was first and moved later, the timer fires early, finds nothing
	// due and is set again: harmless.
}

// unschedule removes s from the schedule.
func (l *Locker) unschedule(s *Lease) {
	l.schedMu.Lock()
	defer l.schedMu.Unlock()
	if s.idx >= 0 {
		heap.Remove(&l.sched, s.idx)
	}
}

// resetTimer sets the timer for the earliest wake-up; schedMu must be held.
func (l *Locker) resetTimer() {
	if len(l.sched) == 0 {
		if l.schedTimer != nil {
			l.schedTimer.Stop()
		}
		return
	}
	d := max(time.Until(l.sched[0].at), 0)
	if l.schedTimer == nil {
		l.schedTimer = time.AfterFunc(d, l.fire)
	} else {
		l.schedTimer.Reset(d)
	}
}

// fire wakes the leases that are due.
func (l *Locker) fire() {
	l.schedMu.Lock()
	now := time.Now()
	var due []*Lease
	for len(l.sched) > 0 && !l.sched[0].at.After(now) {
		due = append(due, heap.Pop(&l.sched).(*Lease))
	}
	l.resetTimer()
	l.schedMu.Unlock()
	// Tell every holder whose deadline has come before anything else:
	// waking waiters and logging the losses (wakeUp) can take a while
	// when many leases end together.
	for _, s := range due {
		s.ctx.Expire(now)
	}
	for _, s := range due {
		s.wakeUp()
	}
}

// stopSchedule stops the timer (Close).
func (l *Locker) stopSchedule() {
	l.schedMu.Lock()
	defer l.schedMu.Unlock()
	if l.schedTimer != nil {
		l.schedTimer.Stop()
	}
}
