package mysql

import "github.com/warden-go/warden"

// LockName returns the named lock the store st queues the waiters of
// key on.
func LockName(st *warden.Store, key string) string {
	s := st.Driver().(*store)
	return s.ho.lockName(s.lockPfx + key)
}

// HandoffConnsOut returns how many connections st has out of its pool for
// lock hand-off (holdings, turns and waits).
func HandoffConnsOut(st *warden.Store) int {
	h := st.Driver().(*store).ho
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out
}

// HandoffGrace is how long a released lock stays reserved for the waiter
// its release woke.
const HandoffGrace = handoffGrace
