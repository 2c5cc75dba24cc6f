// Package handoff holds what the stores that queue lock waiters in the
// lock record itself (DynamoDB's lock item, MongoDB's lock document) share
// of driver.LockWaiter: the queue's order and the choice of the next
// holder, and a store's book of its own owners' places — their arrival
// (kept while they wait again), the holdings handed to them that their
// Acquire has not taken yet, the records that take no queue, and the entry
// writes in flight that Close waits for.
//
// The stores keep the queue and decide the hand-off in their own records
// and requests; this package does no I/O.
package handoff

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

const (
	// TurnTTL is how long a queue entry lives unless renewed.
	TurnTTL = 2 * time.Second
	// TurnRenew is how often a waiting WaitLock renews its entry.
	TurnRenew = TurnTTL / 4
	// Grace is the expiry of a holding handed to a waiter, from the
	// release: the longest a waiter that died or stalled after queuing
	// keeps the others from the key, once.
	Grace = 2 * time.Second
	// LeaveWait bounds the requests of a LeaveLock and of Close's leaving.
	LeaveWait = time.Second
	// MaxHints bounds the records a book remembers as taking no queue.
	MaxHints = 10000
)

// Entry is one waiter's entry in a queue: its owner, when it first queued
// and until when the entry lives (Unix ms, the waiter's clock). Name is
// how the store names the entry in its record, when that is not the owner
// (MongoDB's field names); an entry whose name the store cannot read has
// an empty Owner and counts as lapsed.
type Entry struct {
	Owner   string
	Name    string
	Arrival int64
	Until   int64
}

// Sort orders a queue: earliest arrival first, the owner (then the name)
// breaking ties.
func Sort(q []Entry) {
	slices.SortFunc(q, func(x, y Entry) int {
		if c := cmp.Compare(x.Arrival, y.Arrival); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Owner, y.Owner); c != 0 {
			return c
		}
		return cmp.Compare(x.Name, y.Name)
	})
}

// PickNext chooses, from a sorted queue, the entry a release by owner
// hands the key to (the live entry of another owner with the earliest
// arrival; ok false for none) and the entries the release removes besides
// it: owner's own and lapsed ones (unreadable ones too).
func PickNext(q []Entry, owner string, now int64) (next Entry, ok bool, drop []Entry) {
	for _, e := range q {
		switch {
		case e.Owner == "" || e.Owner == owner || e.Until <= now:
			drop = append(drop, e)
		case !ok:
			next, ok = e, true
		}
	}
	return next, ok, drop
}

// Key names one owner waiting for one lock record (the store's stored key).
type Key struct{ PK, Owner string }

// Handed is a holding handed to a waiter: its token, and whether the
// waiter's entry may still be in the queue (written again by a renewal
// that crossed the hand-off).
type Handed struct {
	Token int64
	Entry bool
}

// Left is a place a store gives up as it closes: the owner's entry, and
// the holding handed to it that no Acquire took (if handed).
type Left struct {
	Key    Key
	Token  int64
	Handed bool
}

// Book is what a store knows of its owners' places in the queues. The
// zero value is ready to use.
type Book struct {
	mu sync.Mutex
	// queued: owners with an entry (or about to write one) in a queue,
	// and their arrival (ms).
	queued map[Key]int64
	// handed: holdings handed to owners that their Acquire has not
	// taken yet.
	handed map[Key]Handed
	// noQueue: records that take no queue (held by a service of the
	// go-go-scope layout) until the holding's expiry (ms).
	noQueue map[string]int64
	// closing is set by Close before it takes its owners out of the
	// queues; writing holds the entry writes in flight (each closes its
	// channel when done), which Close waits for — up to LeaveWait — so
	// that no entry is written after Close removed its owners'.
	closing bool
	writing map[chan struct{}]struct{}
	// closeHook, if set (tests), is called by Close once closing is set.
	closeHook func()
}

// Arrival returns k's arrival, recording now (ms) as its arrival if it has
// none: a waiter keeps its place while it waits again.
func (b *Book) Arrival(k Key, now int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a, ok := b.queued[k]; ok {
		return a
	}
	if b.queued == nil {
		b.queued = map[Key]int64{}
	}
	b.queued[k] = now
	return now
}

// Queued reports whether k has a place (or is about to write one).
func (b *Book) Queued(k Key) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.queued[k]
	return ok
}

// SetHanded records a holding handed to k.
func (b *Book) SetHanded(k Key, h Handed) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handed == nil {
		b.handed = map[Key]Handed{}
	}
	b.handed[k] = h
}

// TakeHanded returns the holding handed to k that its Acquire has not
// taken yet, and forgets it.
func (b *Book) TakeHanded(k Key) (Handed, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.handed[k]
	delete(b.handed, k)
	return h, ok
}

// Dequeue forgets k's place and any holding handed to it; it reports
// whether k was queued or handed a holding.
func (b *Book) Dequeue(k Key) (queued bool, handed Handed, wasHanded bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, queued = b.queued[k]
	handed, wasHanded = b.handed[k]
	delete(b.queued, k)
	delete(b.handed, k)
	return queued, handed, wasHanded
}

// HintNoQueue remembers that the record pk takes no queue until exp (ms).
func (b *Book) HintNoQueue(pk string, exp int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.noQueue == nil || len(b.noQueue) >= MaxHints {
		b.noQueue = map[string]int64{}
	}
	b.noQueue[pk] = exp
}

// NoQueueUntil is when the record pk may take a queue again (ms; 0: now).
func (b *Book) NoQueueUntil(pk string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.noQueue[pk]
}

// StartWrite registers an entry write about to be sent; the caller calls
// done once it is answered. ok is false once the store is closing: no
// entry may be written any more.
func (b *Book) StartWrite() (done func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return nil, false
	}
	ch := make(chan struct{})
	if b.writing == nil {
		b.writing = map[chan struct{}]struct{}{}
	}
	b.writing[ch] = struct{}{}
	return func() {
		b.mu.Lock()
		delete(b.writing, ch)
		b.mu.Unlock()
		close(ch)
	}, true
}

// SetCloseHook sets a function Close calls once it refuses new entry
// writes (tests).
func (b *Book) SetCloseHook(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closeHook = f
}

// Close refuses new entry writes, waits up to LeaveWait for those in
// flight, and returns (and forgets) every place and untaken holding of
// the store's owners, for the store to give up.
func (b *Book) Close() []Left {
	b.mu.Lock()
	b.closing = true
	var writing []chan struct{}
	for ch := range b.writing {
		writing = append(writing, ch)
	}
	hook := b.closeHook
	b.mu.Unlock()
	if hook != nil {
		hook()
	}
	if len(writing) > 0 {
		t := time.NewTimer(LeaveWait)
	wait:
		for _, ch := range writing {
			select {
			case <-ch:
			case <-t.C:
				break wait // a server gone: those entries lapse (TurnTTL)
			}
		}
		t.Stop()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var ls []Left
	for k := range b.queued {
		h, ok := b.handed[k]
		ls = append(ls, Left{k, h.Token, ok})
	}
	for k, h := range b.handed {
		if _, ok := b.queued[k]; !ok {
			ls = append(ls, Left{k, h.Token, true})
		}
	}
	clear(b.queued)
	clear(b.handed)
	return ls
}

// MaxPrune bounds the lapsed entries a State keeps for a renewal to
// remove.
const MaxPrune = 8

// State is a lock record's holding as a waiter needs it.
type State struct {
	Known    bool
	Owner    string
	Token    int64
	Released bool
	Exp      int64   // the holding's expiry, Unix ms
	First    string  // the owner of the queue's first live entry, the holder's aside
	Lapsed   []Entry // up to MaxPrune lapsed (or unreadable) entries, for a renewal to remove
}

// Absent is the state of a lock record that does not exist: free.
func Absent() State { return State{Known: true, Released: true} }

// NewState is the state of a holding with the sorted queue q, at now (ms).
func NewState(owner string, token int64, released bool, exp int64, q []Entry, now int64) State {
	st := State{Known: true, Owner: owner, Token: token, Released: released, Exp: exp}
	for _, e := range q {
		switch {
		case e.Owner == "" || e.Until <= now:
			if len(st.Lapsed) < MaxPrune {
				st.Lapsed = append(st.Lapsed, e)
			}
		case st.First == "" && e.Owner != st.Owner:
			st.First = e.Owner
		}
	}
	return st
}

// Newer reports whether a is a later state of the record than b.
func (a State) Newer(b State) bool {
	switch {
	case !a.Known:
		return false
	case !b.Known:
		return true
	case a.Token != b.Token:
		return a.Token > b.Token
	}
	return a.Released && !b.Released
}

// Live reports whether the holding is live at now (ms).
func (a State) Live(now int64) bool { return a.Known && !a.Released && a.Exp > now }
