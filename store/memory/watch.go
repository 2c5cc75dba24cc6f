package memory

import (
	"context"
	"sync"

	"github.com/warden-go/warden/driver"
)

// A watcher queues events for one receiver. Writers push under db.mu and
// never block: when the queue is full the event is dropped and the watcher
// owes its receiver a "lost" marker, queued as soon as there is room (or
// delivered as soon as the queue drains). The watcher's goroutine moves
// events from the queue to the receiver's channel; it is owned by the
// store that created it and ends when the watch's context ends or the
// store closes, closing the channel.
type watcher[T any] struct {
	lost   func() T      // makes the "events lost" marker
	signal chan struct{} // capacity 1: the queue has something

	// mu guards the queue; writers take it under db.mu, the goroutine
	// alone.
	mu    sync.Mutex
	queue []T
	owed  bool // events were dropped and no marker is queued yet
}

func newWatcher[T any](lost func() T) *watcher[T] {
	return &watcher[T]{lost: lost, signal: make(chan struct{}, 1)}
}

// push queues ev without blocking.
func (w *watcher[T]) push(ev T) {
	w.mu.Lock()
	switch {
	case w.owed && len(w.queue)+2 <= watchBuffer:
		w.queue = append(w.queue, w.lost(), ev)
		w.owed = false
	case !w.owed && len(w.queue) < watchBuffer:
		w.queue = append(w.queue, ev)
	default:
		w.owed = true
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// next takes the next event to deliver: the queue's head, or the owed
// marker once the queue is empty.
func (w *watcher[T]) next() (ev T, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case len(w.queue) > 0:
		ev = w.queue[0]
		var zero T
		w.queue[0] = zero
		w.queue = w.queue[1:]
		if len(w.queue) == 0 {
			w.queue = nil
		}
		return ev, true
	case w.owed:
		w.owed = false
		return w.lost(), true
	}
	return ev, false
}

// run delivers w's events to out until ctx ends or the store closes, then
// unregisters w and closes out.
func (w *watcher[T]) run(ctx context.Context, s *store, out chan<- T, unregister func()) {
	defer s.wg.Done()
	defer close(out)
	defer unregister()
	for {
		ev, ok := w.next()
		if !ok {
			select {
			case <-w.signal:
				continue
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			}
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		}
	}
}

// startWatch registers a watcher through reg (under db.mu) and starts its
// goroutine, owned by s.
func startWatch[T any](ctx context.Context, s *store, lost func() T, reg func(w *watcher[T]) (unregister func())) (<-chan T, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil, errClosed
	}
	w := newWatcher(lost)
	s.db.mu.Lock()
	unregister := reg(w)
	s.db.mu.Unlock()
	out := make(chan T)
	s.wg.Add(1)
	go w.run(ctx, s, out, func() {
		s.db.mu.Lock()
		unregister()
		s.db.mu.Unlock()
	})
	return out, nil
}

// WatchLocks delivers the lock events of the store's namespace, from every
// store on the same database, until ctx ends or the store closes. A
// receiver that falls more than a few hundred events behind gets an
// EventsLost event in place of the events it missed.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	lost := func() driver.LockEvent {
		return driver.LockEvent{Kind: driver.EventsLost, At: now()}
	}
	return startWatch(ctx, s, lost, func(w *watcher[driver.LockEvent]) func() {
		set := s.db.lockW[s.prefix]
		if set == nil {
			set = map[*watcher[driver.LockEvent]]struct{}{}
			s.db.lockW[s.prefix] = set
		}
		set[w] = struct{}{}
		return func() {
			delete(set, w)
			if len(set) == 0 {
				delete(s.db.lockW, s.prefix)
			}
		}
	})
}

// WatchCircuits delivers the new record after every circuit change in the
// store's namespace, from every store on the same database, until ctx ends
// or the store closes. A record with an empty Name stands for changes the
// receiver missed by falling behind.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	lost := func() driver.CircuitRecord { return driver.CircuitRecord{} }
	return startWatch(ctx, s, lost, func(w *watcher[driver.CircuitRecord]) func() {
		set := s.db.circuitW[s.prefix]
		if set == nil {
			set = map[*watcher[driver.CircuitRecord]]struct{}{}
			s.db.circuitW[s.prefix] = set
		}
		set[w] = struct{}{}
		return func() {
			delete(set, w)
			if len(set) == 0 {
				delete(s.db.circuitW, s.prefix)
			}
		}
	})
}

// notifyLock tells the namespace's lock watchers; db.mu is held.
func (s *store) notifyLock(ev driver.LockEvent) {
	for w := range s.db.lockW[s.prefix] {
		w.push(ev)
	}
}

// notifyCircuit tells the namespace's circuit watchers; db.mu is held.
func (s *store) notifyCircuit(r driver.CircuitRecord) {
	for w := range s.db.circuitW[s.prefix] {
		w.push(r)
	}
}
