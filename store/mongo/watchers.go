package mongo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/internal/eventhub"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Lock and circuit events are written only while some process watches the
// namespace: every insert into the capped event collection costs the
// server a write, and most of the time nobody reads them (docs/design.md
// "MongoDB: lock events only while watched").
//
//   - A store that watches registers in the watchers collection (the
//     event collection's name + "_watchers"): one document per store,
//     kind of event ("lock", "circuit") and registration, written before the watch
//     subscribes, renewed every watcherTTL/3, deleted when the last watch
//     of the kind ends or the store closes.
//   - The event writer of every store learns who watches from a read of
//     the namespace's registrations, trusted for watchersFresh (R) and
//     shared by the stores of a process on the same server, database,
//     collection and namespace (so a watch in this process is known to its
//     writers at once). An event whose kind nobody watches is dropped.
//   - A writer may therefore drop events for up to R after a registration
//     committed: its last read may predate it. The watch treats that span
//     as a gap: once R (and a margin) has passed since the registration was
//     acknowledged, its subscribers get an EventsLost marker and read the
//     state again. Any event dropped was decided before that moment (a
//     decision after it rests on a read sent after the registration, which
//     sees it), so the state read after the marker includes its change.
const (
	// watcherTTL is how long a registration lives unless renewed. Writers
	// count a registration as live until watcherTTL after its expiry on
	// their own clock, so clocks may disagree by up to watcherTTL.
	watcherTTL = 30 * time.Second
	// watchersFresh (R) is how long a writer trusts its read of the
	// registrations.
	watchersFresh = time.Second
	// gapMargin is added to R before the marker of a new registration's
	// gap goes out (the monotonic clocks of two processes need not run at
	// exactly one rate).
	gapMargin = watchersFresh / 10
	// keepTick is how often the watcher's keeper checks its registrations
	// (renewals and deletions are due far less often; a gap marker goes out
	// at most keepTick late).
	keepTick = watchersFresh / 8
)

// The kinds of registrations (a regDoc's kind).
const (
	kindLock    = "lock"
	kindCircuit = "circuit"
)

// regDoc is one registration in the watchers collection.
type regDoc struct {
	ID   string    `bson:"_id"` // the watching store's id + "/" + kind
	NS   string    `bson:"ns"`  // the namespace (the store's prefix)
	Kind string    `bson:"kind"`
	Exp  time.Time `bson:"exp"`
}

// eventKind is the registration kind an event needs.
func eventKind(ev evDoc) string {
	if ev.Kind == evCircuit || ev.Kind == evCircuitDeleted {
		return kindCircuit
	}
	return kindLock
}

// watchCache is what the writers of a process know of a namespace's
// watchers on one server (as far as the store can tell: the connection
// string, or the client handed to New), database and collection.
type watchCache struct {
	local      *localWatch // shared by every server with these names
	key, names string      // its keys in watchCaches and localWatches ("": a store's own)
	users      int         // open stores using it (guarded by watchMu)

	refresh sync.Mutex // one read of the registrations at a time

	mu     sync.Mutex
	read   time.Time       // when the last read was sent (zero: none yet)
	remote map[string]bool // kinds that had a live registration at that read
}

// localWatch counts the watches of this process on a database, collection
// and namespace name, whatever the server: a store of this process that
// watches makes the writers of every store with these names write at once
// (on another server with the same names only costing events nobody
// reads), so in one process no event is ever dropped for want of a read.
type localWatch struct {
	mu    sync.Mutex
	count map[string]int // kind → stores of this process registered as watchers
	users int            // watchCaches using it (guarded by watchMu)
}

// watchCaches and localWatches hold the process's watchCaches and
// localWatches by key, with the number of open stores using each.
var (
	watchMu      sync.Mutex
	watchCaches  = map[string]*watchCache{}
	localWatches = map[string]*localWatch{}
)

// newWatchCache returns the store's watchCache, shared with the stores of
// the process on the same server, database, collections and namespace;
// own: one of its own (tests: a store as if alone in its process).
// releaseWatchCache gives it back when the store closes.
func (s *store) newWatchCache(own bool) *watchCache {
	if own {
		return &watchCache{local: &localWatch{count: map[string]int{}}, remote: map[string]bool{}}
	}
	names := fmt.Sprintf("%s\x00%s\x00%s", s.db.Name(), s.names.Events, s.prefix)
	key := s.serverKey() + "\x00" + names
	watchMu.Lock()
	defer watchMu.Unlock()
	l := localWatches[names]
	if l == nil {
		l = &localWatch{count: map[string]int{}}
		localWatches[names] = l
	}
	l.users++
	c := watchCaches[key]
	if c == nil {
		c = &watchCache{local: l, remote: map[string]bool{}, key: key, names: names}
		watchCaches[key] = c
	}
	c.users++
	return c
}

// releaseWatchCache forgets c once no open store uses it.
func releaseWatchCache(c *watchCache) {
	if c.key == "" {
		return // a store's own
	}
	watchMu.Lock()
	defer watchMu.Unlock()
	if c.users--; c.users == 0 {
		delete(watchCaches, c.key)
	}
	if c.local.users--; c.local.users == 0 {
		delete(localWatches, c.names)
	}
}

// addLocal counts a registration of kind by a store of this process
// (n = 1) or its end (n = -1).
func (c *watchCache) addLocal(kind string, n int) {
	c.local.mu.Lock()
	c.local.count[kind] += n
	c.local.mu.Unlock()
}

// localWatched reports whether a store of this process watches kind.
func (c *watchCache) localWatched(kind string) bool {
	c.local.mu.Lock()
	defer c.local.mu.Unlock()
	return c.local.count[kind] > 0
}

// known answers from what c knows: ok is false when kind is not watched
// in this process and the read of the registrations is stale.
func (c *watchCache) known(kind string) (watched, ok bool) {
	if c.localWatched(kind) {
		return true, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read.IsZero() && time.Since(c.read) < watchersFresh {
		return c.remote[kind], true
	}
	return false, false
}

// watched reports whether events of kind in s's namespace have a watcher,
// reading the registrations again if the last read is older than
// watchersFresh. If they cannot be read the answer is yes: an event too
// many costs a write, an event too few a waiter's wake-up.
func (c *watchCache) watched(ctx context.Context, s *store, kind string) bool {
	if w, ok := c.known(kind); ok {
		return w
	}
	c.refresh.Lock()
	defer c.refresh.Unlock()
	if w, ok := c.known(kind); ok {
		return w // another writer read them meanwhile
	}
	sent := time.Now()
	cur, err := s.watchers.Find(ctx, bson.D{{Key: "ns", Value: s.prefix}},
		options.Find().SetProjection(bson.D{{Key: "kind", Value: 1}, {Key: "exp", Value: 1}}))
	if err != nil {
		return true
	}
	var regs []regDoc
	if err := cur.All(ctx, &regs); err != nil {
		return true
	}
	live := map[string]bool{}
	since := now().Add(-watcherTTL)
	for _, r := range regs {
		if r.Exp.After(since) {
			live[r.Kind] = true
		}
	}
	c.mu.Lock()
	if sent.After(c.read) {
		c.read, c.remote = sent, live
	}
	c.mu.Unlock()
	return live[kind] || c.localWatched(kind)
}

// watchedOnly returns the events of batch that some process watches (in
// place), calling the test hook for each one dropped.
func (s *store) watchedOnly(ctx context.Context, batch []any) []any {
	var known [2]int8        // lock, circuit: 0 unknown, 1 watched, -1 not
	var decided [2]time.Time // when each was decided (before the decision)
	out := batch[:0]
	for _, e := range batch {
		ev := e.(evDoc)
		kind := eventKind(ev)
		i := 0
		if kind == kindCircuit {
			i = 1
		}
		if known[i] == 0 {
			decided[i] = time.Now()
			known[i] = -1
			if s.wc.watched(ctx, s, kind) {
				known[i] = 1
			}
		}
		if known[i] > 0 {
			out = append(out, e)
		} else if s.dropped != nil {
			s.dropped(ev, decided[i])
		}
	}
	clear(batch[len(out):])
	return out
}

// ---------------------------------------------------------------------------
// the watching store's side

// regIOWait bounds each registration write or delete of the keeper, and
// closeWait all the deletions of a store that closes (a registration not
// deleted lapses by itself): a server gone slows neither down for long.
const (
	regIOWait = 5 * time.Second
	closeWait = time.Second
)

// regState is one of a hub's registrations.
type regState struct {
	doc  string    // its _id: the store's id / kind / the registration's number
	sent time.Time // when its last successful write was sent
}

// watchReg is the registration part of a hub.
type watchReg struct {
	id     string
	closed atomic.Bool // the store is closing: no new registrations

	// regSem (a semaphore of one, so that a Watch waiting for it can give
	// up with its ctx) guards reg, drop, gapAt and seq. Network I/O under
	// it: only the registration a Watch writes before subscribing.
	regSem chan struct{}
	reg    map[string]*regState // this store's live registrations by kind
	drop   map[string]bool      // _ids of registrations to delete (tried again by the keeper and Close)
	gapAt  time.Time            // when a gap marker is due (zero: none)
	seq    int                  // registrations written so far

	// afterRegister, if set (tests), runs after a registration was
	// acknowledged and before the watch subscribes.
	afterRegister func()
}

func newWatchReg() watchReg {
	return watchReg{id: fmt.Sprintf("%d-%016x", os.Getpid(), rand.Uint64()), regSem: make(chan struct{}, 1),
		reg: map[string]*regState{}, drop: map[string]bool{}}
}

// lockReg takes regSem, unless ctx ends first.
func (h *hub) lockReg(ctx context.Context) error {
	select {
	case h.regSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hub) unlockReg() { <-h.regSem }

// watch registers the store as a watcher of kind, if it is not, and then
// subscribes. The registration is acknowledged before the watch returns,
// so before the caller reads any state: a writer that reads the
// registrations after that sees it; a writer whose last read was earlier
// may drop events until R later, and the marker due then (gapDue) covers
// them.
func watch[C any](h *hub, ctx context.Context, kind string, subscribe func(context.Context) (C, error)) (C, error) {
	var none C
	if h.closed.Load() {
		return none, errClosed
	}
	if err := h.lockReg(ctx); err != nil {
		return none, err
	}
	defer h.unlockReg()
	if _, ok := h.reg[kind]; !ok {
		h.seq++
		r := &regState{doc: fmt.Sprintf("%s/%s/%d", h.id, kind, h.seq), sent: time.Now()}
		if _, err := h.register(ctx, r.doc, kind, true); err != nil {
			// The write may have reached the server: delete it later.
			h.drop[r.doc] = true
			return none, ctxErr(ctx, fmt.Errorf("mongo: registering as a watcher in %s: %w", h.s.names.Events+"_watchers", err))
		}
		h.reg[kind] = r
		h.s.wc.addLocal(kind, 1)
		h.gapDue()
		if h.afterRegister != nil {
			h.afterRegister()
		}
	}
	ch, err := subscribe(ctx)
	if err != nil && !h.Running() {
		// No keeper will delete the registration.
		h.endUnwatched()
		h.unregisterDropped(context.WithoutCancel(ctx), closeWait)
	}
	return ch, err
}

// gapDue schedules a gap marker R (and the margin) from now: the events a
// writer dropped because its read of the registrations predates the one
// just acknowledged are covered by it. regSem must be held.
func (h *hub) gapDue() {
	at := time.Now().Add(watchersFresh + gapMargin)
	if at.After(h.gapAt) {
		h.gapAt = at
	}
}

// register writes registration doc of kind; it reports whether the
// document had to be created (a renewal that creates it found it gone:
// deleted as lapsed by another process). prune also deletes lapsed
// registrations of any store (processes that died).
func (h *hub) register(ctx context.Context, doc, kind string, prune bool) (created bool, err error) {
	t := now()
	if prune {
		if _, err := h.s.watchers.DeleteMany(ctx, bson.D{{Key: "exp", Value: set("$lt", t.Add(-watcherTTL))}}); err != nil {
			return false, err
		}
	}
	res, err := h.s.watchers.UpdateOne(ctx, bson.D{{Key: "_id", Value: doc}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "ns", Value: h.s.prefix}, {Key: "kind", Value: kind}, {Key: "exp", Value: t.Add(watcherTTL)}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return false, err
	}
	return res.UpsertedCount > 0, nil
}

// endUnwatched ends the registrations of the kinds nobody watches any
// more: writers of this process stop counting them, and their documents
// are to be deleted. regSem must be held.
func (h *hub) endUnwatched() {
	wantLocks, wantCircs := h.Wants()
	for kind, r := range h.reg {
		if kind == kindLock && !wantLocks || kind == kindCircuit && !wantCircs {
			delete(h.reg, kind)
			h.s.wc.addLocal(kind, -1)
			h.drop[r.doc] = true
		}
	}
}

// unregisterDropped deletes the registrations to be deleted, all within
// wait (a deletion that fails is tried again later; a registration never
// deleted lapses). regSem must be held.
func (h *hub) unregisterDropped(ctx context.Context, wait time.Duration) {
	if len(h.drop) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for doc := range h.drop {
		if _, err := h.s.watchers.DeleteOne(ctx, bson.D{{Key: "_id", Value: doc}}); err == nil {
			delete(h.drop, doc)
		}
	}
}

// keep runs beside the event watcher's loop: it renews the registrations,
// deletes those nobody watches any more and sends the gap markers due.
func (h *hub) keep(ctx context.Context, run *eventhub.Run) {
	t := time.NewTicker(keepTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !h.sync(ctx, run) {
			return
		}
	}
}

// sync brings the registrations in line with the subscriptions and sends
// a gap marker to run's subscribers once one is due; it reports false if
// run is no longer the current watcher. Its network I/O runs without
// regSem, each request bounded by regIOWait, so a server gone keeps no
// Watch waiting (it only delays the renewals and deletions).
func (h *hub) sync(ctx context.Context, run *eventhub.Run) bool {
	if h.lockReg(ctx) != nil {
		return true // ctx ended: the keeper returns
	}
	h.endUnwatched()
	drop := make([]string, 0, len(h.drop))
	for doc := range h.drop {
		drop = append(drop, doc)
	}
	type renewal struct {
		kind string
		r    *regState
	}
	var renew []renewal
	for kind, r := range h.reg {
		if time.Since(r.sent) >= watcherTTL/3 {
			renew = append(renew, renewal{kind, r})
		}
	}
	if run != nil && !h.gapAt.IsZero() && !time.Now().Before(h.gapAt) {
		if !h.deliver(run, nil, true) {
			h.unlockReg()
			return false // the marker stays due for the current watcher
		}
		h.gapAt = time.Time{}
	}
	h.unlockReg()

	for _, doc := range drop {
		// Not under ctx's cancellation: the last watch ending is what
		// cancels the keeper's ctx, often while it is here.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), regIOWait)
		_, err := h.s.watchers.DeleteOne(dctx, bson.D{{Key: "_id", Value: doc}})
		cancel()
		if err == nil {
			h.regSem <- struct{}{}
			delete(h.drop, doc)
			h.unlockReg()
		}
	}
	for _, rn := range renew {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, regIOWait)
		created, err := h.register(rctx, rn.r.doc, rn.kind, false)
		cancel()
		if err != nil {
			h.s.log.Debug("warden: renewing a watcher registration failed; trying again", "kind", rn.kind, "error", err.Error())
			continue
		}
		h.regSem <- struct{}{}
		if h.reg[rn.kind] != rn.r {
			// Ended meanwhile: the renewal may have written the document
			// again after its deletion.
			h.drop[rn.r.doc] = true
		} else {
			if created || sent.Sub(rn.r.sent) > watcherTTL {
				// The registration was gone, or its renewals failed long
				// enough that writers may have counted it lapsed: events
				// may have been dropped until R after now.
				h.gapDue()
			}
			rn.r.sent = sent
		}
		h.unlockReg()
	}
	return true
}

// endRun runs when the event watcher's loop ended: it ends the
// registrations nobody watches any more (all of them unless a new watch
// has started meanwhile), deleting them within closeWait.
func (h *hub) endRun() {
	h.regSem <- struct{}{}
	defer h.unlockReg()
	h.endUnwatched()
	h.unregisterDropped(context.Background(), closeWait)
}

// closeRegs ends what the store's registrations left (after the event
// watcher ended: the store is closing), deleting them within closeWait.
func (h *hub) closeRegs() {
	h.regSem <- struct{}{}
	defer h.unlockReg()
	for kind, r := range h.reg {
		delete(h.reg, kind)
		h.s.wc.addLocal(kind, -1)
		h.drop[r.doc] = true
	}
	h.unregisterDropped(context.Background(), closeWait)
	clear(h.drop) // a registration left behind lapses
}
