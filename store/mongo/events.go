package mongo

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Event kinds, as stored in the event collection.
const (
	evInit           = "init" // the collection's first document (tailable cursors need one)
	evAcquired       = "acquired"
	evReleased       = "released"
	evCircuit        = "circuit"
	evCircuitDeleted = "circuit-deleted"
)

// evDoc is one document of the capped event collection.
type evDoc struct {
	ID    bson.ObjectID `bson:"_id"`
	Kind  string        `bson:"kind"`
	NS    string        `bson:"ns"`
	Key   string        `bson:"key"` // the stored key (prefix + tag + key)
	Owner string        `bson:"owner,omitempty"`
	Token int64         `bson:"token,omitempty"`
	At    time.Time     `bson:"at"`
	C     *circDoc      `bson:"c,omitempty"` // the circuit's new state
}

// evQueue is the capacity of the event writer's queue.
const evQueue = 4096

// evBatch is the most events written by one insertMany.
const evBatch = 256

// evWriter writes the store's events to the capped collection from one
// goroutine, in the order the operations completed, batching what queues
// up while an insert is in flight. The operation that made the change does
// not wait for its event: the lock's own update stays one round trip, and
// the event follows it on the wire a moment later.
type evWriter struct {
	s      *store
	mu     sync.RWMutex
	closed bool
	q      chan evDoc
	done   chan struct{}

	warned  time.Time // last failure logged (writer goroutine only)
	trimmed time.Time // last trim (writer goroutine only)
}

// trim deletes events older than the retention, keeping the newest
// document (tailing resumes from it). MongoDB overwrites a capped
// collection's oldest documents itself; servers that do not (FerretDB
// embedded as a library never trims, and its tailable cursors re-read the
// whole collection on every poll) stay small this way. Failures are
// ignored: the next trim tries again.
func (w *evWriter) trim(ctx context.Context) {
	newest, err := w.s.newestEvent(ctx)
	if err != nil {
		return
	}
	_, _ = w.s.events.DeleteMany(ctx, bson.D{
		{Key: "at", Value: set("$lt", now().Add(-w.s.evRetention))},
		{Key: "_id", Value: set("$ne", newest)},
	})
}

func newEvWriter(s *store) *evWriter {
	w := &evWriter{s: s, q: make(chan evDoc, evQueue), done: make(chan struct{}), trimmed: time.Now()}
	go w.run()
	return w
}

// emit queues an event; when the queue is full it waits for room (or for
// ctx to end, dropping the event).
func (w *evWriter) emit(ctx context.Context, ev evDoc) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return
	}
	select {
	case w.q <- ev:
	default:
		select {
		case w.q <- ev:
		case <-ctx.Done():
		}
	}
}

func (w *evWriter) run() {
	defer close(w.done)
	batch := make([]any, 0, evBatch)
	for ev := range w.q {
		batch = append(batch[:0], ev)
	fill:
		for len(batch) < evBatch {
			select {
			case e, ok := <-w.q:
				if !ok {
					break fill
				}
				batch = append(batch, e)
			default:
				break fill
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		batch = w.s.watchedOnly(ctx, batch)
		if len(batch) == 0 {
			cancel()
			continue
		}
		_, err := w.s.events.InsertMany(ctx, batch)
		if err == nil && time.Since(w.trimmed) > w.s.evRetention/4 {
			w.trimmed = time.Now()
			w.trim(ctx)
		}
		cancel()
		if err != nil && time.Since(w.warned) > time.Minute {
			w.warned = time.Now()
			w.s.log.Warn("warden: writing lock/circuit events failed; watchers in other processes miss them",
				"collection", w.s.names.Events, "events", len(batch), "error", err.Error())
		}
	}
}

// close writes the events still queued and stops the writer.
func (w *evWriter) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.q)
	}
	w.mu.Unlock()
	<-w.done
}

func (s *store) emitLock(ctx context.Context, kind, sk, owner string, token int64, at time.Time) {
	if s.ev != nil {
		s.ev.emit(ctx, evDoc{ID: bson.NewObjectID(), Kind: kind, NS: s.prefix, Key: sk, Owner: owner, Token: token, At: at})
	}
}

// emitCircuit queues a circuit's new state; d == nil: deleted.
func (s *store) emitCircuit(ctx context.Context, sk string, d *circDoc, at time.Time) {
	if s.ev == nil {
		return
	}
	ev := evDoc{ID: bson.NewObjectID(), Kind: evCircuit, NS: s.prefix, Key: sk, At: at}
	if d == nil {
		ev.Kind = evCircuitDeleted
	} else {
		c := *d
		c.Key = ""
		ev.C = &c
	}
	s.ev.emit(ctx, ev)
}

// ---------------------------------------------------------------------------
// watching

var errClosed = errors.New("mongo: store closed")

// hub is the store's event watcher: one goroutine (run by the eventhub,
// started by the first WatchLocks or WatchCircuits call and stopped when
// the last watch ends or the store closes) reads the capped event
// collection with a tailable cursor and fans the namespace's events out
// to the subscribers.
type hub struct {
	*eventhub.Hub
	watchReg
	s *store
}

func newHub(s *store) *hub {
	h := &hub{s: s, watchReg: newWatchReg()}
	h.Hub = eventhub.New(h.start, errClosed)
	return h
}

// WatchLocks implements driver.LockNotifier.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return watch(s.hub, ctx, kindLock, s.hub.Hub.WatchLocks)
}

// WatchCircuits implements driver.CircuitNotifier.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return watch(s.hub, ctx, kindCircuit, s.hub.Hub.WatchCircuits)
}

// newestEvent returns the _id of the event collection's last document
// (mongo.ErrNoDocuments if it is empty).
func (s *store) newestEvent(ctx context.Context) (bson.ObjectID, error) {
	var d struct {
		ID bson.ObjectID `bson:"_id"`
	}
	err := s.events.FindOne(ctx, bson.D{}, options.FindOne().SetSort(set("$natural", -1)).SetProjection(set("_id", 1))).Decode(&d)
	return d.ID, err
}

// newest returns the _id of the event collection's last document,
// creating the collection (with its first document) if it is missing.
func (h *hub) newest(ctx context.Context) (bson.ObjectID, error) {
	id, err := h.s.newestEvent(ctx)
	if errors.Is(err, mongo.ErrNoDocuments) {
		if err := h.s.migrateEvents(ctx); err != nil {
			return bson.ObjectID{}, err
		}
		id, err = h.s.newestEvent(ctx)
	}
	return id, err
}

// start finds where the event stream stands, so that every event written
// after the first Watch call returns is delivered.
func (h *hub) start(ctx context.Context) (func(context.Context, *eventhub.Run), error) {
	last, err := h.newest(ctx)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	return func(ctx context.Context, run *eventhub.Run) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.keep(ctx, run)
		}()
		h.loop(ctx, run, last)
		wg.Wait()
		h.endRun()
	}, nil
}

// loop tails the event collection. A tailable cursor starts at the
// collection's beginning, so each (re)opened cursor skips to the last
// event delivered, by its _id; if that event has been overwritten (the
// capped collection wrapped while the cursor was down), the subscribers
// are told events were lost and the stream continues from its end.
func (h *hub) loop(ctx context.Context, run *eventhub.Run, last bson.ObjectID) {
	backoff := minBackoff
	failed := false // the last cursor ended in an error
	for ctx.Err() == nil {
		passed, got, err := h.tail(ctx, run, &last, &failed)
		if err != nil {
			failed = true
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil && !passed {
			// The last event seen is gone: events may have been missed.
			if !h.deliver(run, nil, true) {
				return
			}
			if id, err := h.newest(ctx); err == nil {
				last = id
			}
		}
		if got || err == nil && passed {
			// Delivered something, or the cursor ended cleanly (closed by
			// the server, or reopened as idle): reopen at once.
			backoff = minBackoff
		} else if backoff < maxBackoff {
			backoff = min(2*backoff, maxBackoff)
		}
		if err != nil {
			h.s.log.Debug("warden: the event cursor ended; reopening", "error", err.Error())
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// tail reads one tailable cursor until it dies, or until it has returned
// nothing for the timing's reopenIdle (the reopened cursor skips to last,
// so nothing is delivered twice or missed). passed reports whether it
// reached the last event seen before; got whether it delivered anything.
// How the cursor waits for new events is the store's tailTiming, the only
// part that depends on the server.
//
// *failed says the previous cursor ended in an error (a server gone, a
// connection cut): events written meanwhile may have been lost — a
// writer that could not insert its event drops it, and a server that
// restarted may not have kept it — so once a cursor is open again the
// subscribers are told (EventsLost), and *failed is cleared.
func (h *hub) tail(ctx context.Context, run *eventhub.Run, last *bson.ObjectID, failed *bool) (passed, got bool, err error) {
	tm := h.s.tailing
	o := options.Find().SetBatchSize(1)
	if tm.await > 0 {
		o.SetCursorType(options.TailableAwait).SetMaxAwaitTime(tm.await)
	} else {
		o.SetCursorType(options.Tailable) // the server answers an empty getMore at once
	}
	// The last event seen must still be there when a reopened cursor skips
	// to it: the event writer trims events older than the retention.
	idle := min(tm.reopenIdle, h.s.evRetention/2)
	cur, err := h.s.events.Find(ctx, bson.D{}, o)
	if err != nil {
		return true, false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = cur.Close(cctx)
	}()
	if *failed {
		if !h.deliver(run, nil, true) {
			return true, false, nil
		}
		*failed = false
	}
	cur.SetBatchSize(evBatch)
	passed = last.IsZero()
	lastDoc := time.Now()
	var batch []evDoc
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		got = true
		ok := h.deliver(run, batch, false)
		batch = batch[:0]
		return ok
	}
	for {
		if !cur.TryNext(ctx) {
			if !flush() {
				return true, got, nil
			}
			if cur.Err() != nil || cur.ID() == 0 || ctx.Err() != nil {
				break
			}
			if time.Since(lastDoc) > idle {
				break
			}
			if tm.pause > 0 {
				t := time.NewTimer(tm.pause)
				select {
				case <-ctx.Done():
					t.Stop()
					return passed, got, ctx.Err()
				case <-t.C:
				}
			}
			continue
		}
		lastDoc = time.Now()
		var e evDoc
		if err := cur.Decode(&e); err != nil {
			continue
		}
		if !passed {
			passed = e.ID == *last
			continue
		}
		*last = e.ID
		if e.Kind == evInit || e.NS != h.s.prefix {
			continue
		}
		batch = append(batch, e)
		if cur.RemainingBatchLength() == 0 || len(batch) >= evBatch {
			if !flush() {
				return true, got, nil
			}
		}
	}
	flush()
	return passed, got, cur.Err()
}

// deliver fans the namespace's events among evs out to the subscribers
// (eventhub.Hub.Deliver). gap: events were lost. It reports false if run
// is no longer the current watcher.
func (h *hub) deliver(run *eventhub.Run, evs []evDoc, gap bool) bool {
	var locks []driver.LockEvent
	var circs []driver.CircuitRecord
	for _, e := range evs {
		if le, ok := h.lockEvent(e); ok {
			locks = append(locks, le)
		} else if cr, ok := h.circuitEvent(e); ok {
			circs = append(circs, cr)
		}
	}
	return h.Deliver(run, locks, circs, gap)
}

func (h *hub) lockEvent(e evDoc) (driver.LockEvent, bool) {
	var kind driver.LockEventKind
	switch e.Kind {
	case evAcquired:
		kind = driver.LockAcquired
	case evReleased:
		kind = driver.LockReleased
	default:
		return driver.LockEvent{}, false
	}
	key, ok := strings.CutPrefix(e.Key, h.s.lockPfx)
	if !ok {
		return driver.LockEvent{}, false
	}
	return driver.LockEvent{Kind: kind, Key: key, Owner: e.Owner, Token: e.Token, At: e.At.UTC().Truncate(time.Millisecond)}, true
}

func (h *hub) circuitEvent(e evDoc) (driver.CircuitRecord, bool) {
	name, ok := strings.CutPrefix(e.Key, h.s.circPfx)
	if !ok || name == "" {
		return driver.CircuitRecord{}, false
	}
	switch {
	case e.Kind == evCircuitDeleted:
		return driver.CircuitRecord{Name: name, State: driver.Closed, UpdatedAt: e.At.UTC().Truncate(time.Millisecond)}, true
	case e.Kind == evCircuit && e.C != nil:
		return e.C.record(name), true
	}
	return driver.CircuitRecord{}, false
}

// The pause before reopening a dead event cursor: short, since a cursor
// that died on an idle collection (servers close a tailable cursor whose
// first batch was the whole collection) misses what comes meanwhile only
// by that much; growing while reopening finds nothing new.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = 250 * time.Millisecond
)

// tailTiming is how the event watcher waits for new events on a server.
// Every server runs the same algorithm (one tailable cursor, skipping to
// the last event seen after each reopening; a cursor that dies or idles is
// reopened); the capability probe in New chooses only these durations,
// which change how soon an event arrives and what waiting costs, never
// which events are delivered.
type tailTiming struct {
	// await is how long the server holds a getMore that finds no new
	// event: an awaitData cursor, which the server answers as soon as an
	// event is inserted. 0: the server answers an empty getMore at once
	// (a plainly tailable cursor).
	await time.Duration
	// pause is the watcher's own wait after an empty getMore.
	pause time.Duration
	// reopenIdle is how long a cursor may return nothing before the
	// watcher reopens it (at most half the events' retention).
	reopenIdle time.Duration
}

var (
	// awaitTiming is the watcher's timing on MongoDB: the server holds an
	// empty getMore up to 100 ms and answers as soon as an event is
	// inserted; an idle cursor is renewed once a minute.
	awaitTiming = tailTiming{await: 100 * time.Millisecond, reopenIdle: time.Minute}
	// pollTiming is the watcher's timing on FerretDB, which implements
	// awaitData by re-running the query under a timeout whose expiry can
	// interrupt other statements on its SQLite connections: the server
	// answers at once and the watcher waits 15 ms between empty getMores.
	// A FerretDB tailable cursor has also been seen to stop returning new
	// events while staying open, so an idle one is reopened after a
	// second.
	pollTiming = tailTiming{pause: 15 * time.Millisecond, reopenIdle: time.Second}
)
