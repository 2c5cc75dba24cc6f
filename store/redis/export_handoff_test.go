package redis

import "github.com/warden-go/warden"

// QueueKeys returns the Redis keys of key's lock record, its waiter
// queue (by arrival) and owner's wake-up list in st.
func QueueKeys(st *warden.Store, key, owner string) (record, queue, wake string) {
	s := st.Driver().(*store)
	q, _, w, _ := s.queueKeys(key, owner)
	return s.key(kindLock, key), q, w
}

// WaitsOut returns the lock waits st runs now.
func WaitsOut(st *warden.Store) int {
	h := st.Driver().(*store).ho
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out
}

// TurnGrace is how long a released key stays reserved for the waiter its
// release handed the turn to; WaitSlice how often a waiter renews its
// queue entry.
const (
	TurnGrace = turnGrace
	WaitSlice = waitSlice
)
