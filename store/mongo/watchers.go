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
//     event collection's name + "_watchers"): one document per store and
//     kind of event ("lock", "circuit"), written before the watch
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
	local *localWatch // shared by every server with these names

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
}

// watchCaches and localWatches hold the process's watchCaches and
// localWatches by key.
var watchCaches, localWatches sync.Map

// newWatchCache returns the store's watchCache, shared with the stores of
// the process on the same server, database, collections and namespace;
// own: one of its own (tests: a store as if alone in its process).
func (s *store) newWatchCache(own bool) *watchCache {
	names := fmt.Sprintf("%s\x00%s\x00%s", s.db.Name(), s.names.Events, s.prefix)
	c := &watchCache{local: &localWatch{count: map[string]int{}}, remote: map[string]bool{}}
	if own {
		return c
	}
	l, _ := localWatches.LoadOrStore(names, c.local)
	c.local = l.(*localWatch)
	v, _ := watchCaches.LoadOrStore(s.serverKey()+"\x00"+names, c)
	return v.(*watchCache)
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

// regState is one of a hub's registrations.
type regState struct {
	sent time.Time // when its last successful write was sent
}

// watchReg is the registration part of a hub.
type watchReg struct {
	id     string
	closed atomic.Bool // the store is closing: no new registrations

	regMu sync.Mutex           // serialises registrations, subscriptions of new watches and sync
	reg   map[string]*regState // this store's live registrations by kind
	drop  map[string]bool      // registrations whose deletion failed (tried again by sync and Close)
	gapAt time.Time            // when a gap marker is due (zero: none)

	// afterRegister, if set (tests), runs after a registration was
	// acknowledged and before the watch subscribes.
	afterRegister func()
}

func newWatchReg() watchReg {
	return watchReg{id: fmt.Sprintf("%d-%016x", os.Getpid(), rand.Uint64()), reg: map[string]*regState{}, drop: map[string]bool{}}
}

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
	if err := ctx.Err(); err != nil {
		return none, err
	}
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if _, ok := h.reg[kind]; !ok {
		sent := time.Now()
		if _, err := h.register(ctx, kind, true); err != nil {
			return none, ctxErr(ctx, fmt.Errorf("mongo: registering as a watcher in %s: %w", h.s.names.Events+"_watchers", err))
		}
		h.reg[kind] = &regState{sent: sent}
		delete(h.drop, kind)
		h.s.wc.addLocal(kind, 1)
		h.gapDue()
		if h.afterRegister != nil {
			h.afterRegister()
		}
	}
	ch, err := subscribe(ctx)
	if err != nil && !h.Running() {
		// No keeper will delete the registration.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		h.syncLocked(dctx, nil)
		cancel()
	}
	return ch, err
}

// gapDue schedules a gap marker R (and the margin) from now: the events a
// writer dropped because its read of the registrations predates the one
// just acknowledged are covered by it. regMu must be held.
func (h *hub) gapDue() {
	at := time.Now().Add(watchersFresh + gapMargin)
	if at.After(h.gapAt) {
		h.gapAt = at
	}
}

// register writes the store's registration of kind; it reports whether
// the document had to be created (a renewal that creates it found it
// gone: deleted as lapsed by another process). prune also deletes lapsed
// registrations of any store (processes that died).
func (h *hub) register(ctx context.Context, kind string, prune bool) (created bool, err error) {
	t := now()
	if prune {
		if _, err := h.s.watchers.DeleteMany(ctx, bson.D{{Key: "exp", Value: set("$lt", t.Add(-watcherTTL))}}); err != nil {
			return false, err
		}
	}
	res, err := h.s.watchers.UpdateOne(ctx, bson.D{{Key: "_id", Value: h.id + "/" + kind}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "ns", Value: h.s.prefix}, {Key: "kind", Value: kind}, {Key: "exp", Value: t.Add(watcherTTL)}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return false, err
	}
	return res.UpsertedCount > 0, nil
}

// unregister deletes the store's registration of kind.
func (h *hub) unregister(ctx context.Context, kind string) error {
	_, err := h.s.watchers.DeleteOne(ctx, bson.D{{Key: "_id", Value: h.id + "/" + kind}})
	return err
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
// a gap marker to run's subscribers once one is due. It reports false if
// run is no longer the current watcher.
func (h *hub) sync(ctx context.Context, run *eventhub.Run) bool {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	return h.syncLocked(ctx, run)
}

func (h *hub) syncLocked(ctx context.Context, run *eventhub.Run) bool {
	wantLocks, wantCircs := h.Wants()
	for kind, r := range h.reg {
		if kind == kindLock && !wantLocks || kind == kindCircuit && !wantCircs {
			delete(h.reg, kind)
			h.s.wc.addLocal(kind, -1)
			h.drop[kind] = true
			continue
		}
		if time.Since(r.sent) < watcherTTL/3 {
			continue
		}
		sent := time.Now()
		created, err := h.register(ctx, kind, false)
		if err != nil {
			h.s.log.Debug("warden: renewing a watcher registration failed; trying again", "kind", kind, "error", err.Error())
			continue
		}
		if created || sent.Sub(r.sent) > watcherTTL {
			// The registration was gone, or its renewals failed long
			// enough that writers may have counted it lapsed: events may
			// have been dropped until R after now.
			h.gapDue()
		}
		r.sent = sent
	}
	for kind := range h.drop {
		// Not under ctx's cancellation: the last watch ending is what
		// cancels the keeper's ctx, often while it is here.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		if err := h.unregister(dctx, kind); err == nil {
			delete(h.drop, kind)
		} // else again at the next sync, or by Close; it lapses anyway
		cancel()
	}
	if run != nil && !h.gapAt.IsZero() && !time.Now().Before(h.gapAt) {
		h.gapAt = time.Time{}
		if !h.deliver(run, nil, true) {
			return false
		}
	}
	return true
}

// closeRegs deletes what the store's registrations left (after the event
// watcher ended: the store is closing).
func (h *hub) closeRegs() {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	for kind := range h.reg {
		delete(h.reg, kind)
		h.s.wc.addLocal(kind, -1)
		h.drop[kind] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for kind := range h.drop {
		_ = h.unregister(ctx, kind) // a registration left behind lapses
		delete(h.drop, kind)
	}
}
