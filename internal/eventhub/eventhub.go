// Package eventhub fans a store's lock events and circuit records out to
// its WatchLocks and WatchCircuits channels. The stores with notifications
// (SQLite, MongoDB, DynamoDB) differ only in how their one watcher
// goroutine reads the database; the subscriptions, the never-blocking
// delivery with EventsLost markers, and starting the watcher with the
// first subscriber and stopping it with the last are this package's.
package eventhub

import (
	"context"
	"sync"

	"github.com/warden-go/warden/driver"
)

// Buffer is the capacity of each watch channel. A watcher that lets it
// fill up loses events and gets an EventsLost marker once there is room.
const Buffer = 256

// Run identifies one watcher goroutine: Deliver refuses a run that is no
// longer the hub's current one, so a watcher stopped while it was reading
// never delivers stale events to later subscribers.
type Run struct{ cancel context.CancelFunc }

// StartFunc prepares a watcher for the first subscriber (called with the
// hub's lock held and the subscriber's ctx) and returns the loop the
// watcher goroutine runs. The loop must return once its ctx ends; it
// passes its Run to Deliver.
type StartFunc func(ctx context.Context) (loop func(ctx context.Context, run *Run), err error)

// Hub owns a store's subscriptions and its watcher goroutine. The zero
// value is not usable; call New.
type Hub struct {
	start     StartFunc
	errClosed error

	mu     sync.Mutex
	subs   map[*sub]struct{}
	run    *Run // the running watcher; nil when stopped
	closed bool
	wg     sync.WaitGroup // running watcher goroutines
}

// sub is one WatchLocks or WatchCircuits channel.
type sub struct {
	locks   chan driver.LockEvent     // set for lock watchers
	circs   chan driver.CircuitRecord // set for circuit watchers
	lost    bool                      // events were dropped; a marker is owed
	stopCtx func() bool               // unregisters the context.AfterFunc
}

// New returns a hub whose watcher start prepares; Watch calls after Close
// return errClosed.
func New(start StartFunc, errClosed error) *Hub {
	return &Hub{start: start, errClosed: errClosed, subs: map[*sub]struct{}{}}
}

// WatchLocks implements driver.LockNotifier.WatchLocks.
func (h *Hub) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	s := &sub{locks: make(chan driver.LockEvent, Buffer)}
	if err := h.subscribe(ctx, s); err != nil {
		return nil, err
	}
	return s.locks, nil
}

// WatchCircuits implements driver.CircuitNotifier.WatchCircuits.
func (h *Hub) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	s := &sub{circs: make(chan driver.CircuitRecord, Buffer)}
	if err := h.subscribe(ctx, s); err != nil {
		return nil, err
	}
	return s.circs, nil
}

// subscribe registers s until ctx ends, starting the watcher if needed.
// Every event the watcher reads after subscribe returns is delivered to s.
func (h *Hub) subscribe(ctx context.Context, s *sub) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return h.errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if h.run == nil {
		loop, err := h.start(ctx)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithCancel(context.Background())
		run := &Run{cancel: cancel}
		h.run = run
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer cancel()
			loop(rctx, run)
		}()
	}
	h.subs[s] = struct{}{}
	s.stopCtx = context.AfterFunc(ctx, func() { h.unsubscribe(s) })
	return nil
}

// unsubscribe removes s and closes its channel; the watcher stops with
// the last subscriber.
func (h *Hub) unsubscribe(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	s.close()
	if len(h.subs) == 0 && h.run != nil {
		h.run.cancel()
		h.run = nil
	}
}

func (s *sub) close() {
	if s.locks != nil {
		close(s.locks)
	} else {
		close(s.circs)
	}
}

// Close stops the watcher, closes every channel and waits for the watcher
// goroutine to end. Later Watch calls fail.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	for s := range h.subs {
		s.stopCtx()
		s.close()
	}
	clear(h.subs)
	if h.run != nil {
		h.run.cancel()
		h.run = nil
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// Wants reports which kinds of events have subscribers.
func (h *Hub) Wants() (locks, circs bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		locks = locks || s.locks != nil
		circs = circs || s.circs != nil
	}
	return locks, circs
}

// Deliver fans events out to the subscribers without ever blocking: a
// full channel is owed an EventsLost marker (an empty-named record for
// circuit watchers), sent before anything else once there is room. gap:
// events were lost before the watcher read them, so every subscriber is
// owed a marker. Calling Deliver with no events sends owed markers. It
// reports false if run is no longer the current watcher, which must then
// return.
func (h *Hub) Deliver(run *Run, locks []driver.LockEvent, circs []driver.CircuitRecord, gap bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.run != run {
		return false
	}
	for s := range h.subs {
		if gap {
			s.lost = true
		}
		s.flushLost()
	}
	for _, e := range locks {
		for s := range h.subs {
			if s.locks != nil && s.flushLost() {
				select {
				case s.locks <- e:
				default:
					s.lost = true
				}
			}
		}
	}
	for _, r := range circs {
		for s := range h.subs {
			if s.circs != nil && s.flushLost() {
				select {
				case s.circs <- r:
				default:
					s.lost = true
				}
			}
		}
	}
	return true
}

// flushLost sends an owed EventsLost marker if there is room; it reports
// whether nothing is owed any more.
func (s *sub) flushLost() bool {
	if !s.lost {
		return true
	}
	if s.locks != nil {
		select {
		case s.locks <- driver.LockEvent{Kind: driver.EventsLost}:
			s.lost = false
		default:
		}
	} else {
		select {
		case s.circs <- driver.CircuitRecord{}:
			s.lost = false
		default:
		}
	}
	return !s.lost
}

// Running reports whether a watcher goroutine is serving subscribers.
func (h *Hub) Running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.run != nil
}

// Wait waits until every watcher goroutine the hub started has ended.
func (h *Hub) Wait() { h.wg.Wait() }
