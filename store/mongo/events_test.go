package mongo_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// cursorLog records a client's commands on the event collection: its finds
// (the watcher's tailable cursors among them) and getMores, with their
// replies.
type cursorLog struct {
	mu       sync.Mutex
	finds    []bson.Raw
	getMores []*getMore
	byID     map[int64]*getMore
	started  chan struct{} // a getMore started
}

type getMore struct {
	cmd   bson.Raw
	reply bson.Raw // nil until it is answered
	done  chan struct{}
}

func newCursorLog() *cursorLog {
	return &cursorLog{byID: map[int64]*getMore{}, started: make(chan struct{}, 1)}
}

func (l *cursorLog) monitor() *event.CommandMonitor {
	events := func(cmd bson.Raw, name string) bool {
		if name == "getMore" {
			c, _ := cmd.Lookup("collection").StringValueOK()
			return c == mongo.DefaultEventsCollection
		}
		c, _ := cmd.Lookup(name).StringValueOK()
		return c == mongo.DefaultEventsCollection
	}
	finish := func(id int64, reply bson.Raw) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if g := l.byID[id]; g != nil {
			g.reply = append(bson.Raw{}, reply...)
			close(g.done)
			delete(l.byID, id)
		}
	}
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			if !events(e.Command, e.CommandName) {
				return
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			switch e.CommandName {
			case "find":
				l.finds = append(l.finds, append(bson.Raw{}, e.Command...))
			case "getMore":
				g := &getMore{cmd: append(bson.Raw{}, e.Command...), done: make(chan struct{})}
				l.getMores = append(l.getMores, g)
				l.byID[e.RequestID] = g
				select {
				case l.started <- struct{}{}:
				default:
				}
			}
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) { finish(e.RequestID, e.Reply) },
		Failed:    func(_ context.Context, e *event.CommandFailedEvent) { finish(e.RequestID, bson.Raw{}) },
	}
}

// waiting returns a getMore the server has not answered, waiting for one
// to start if there is none.
func (l *cursorLog) waiting(t *testing.T) *getMore {
	t.Helper()
	for {
		l.mu.Lock()
		for _, g := range l.byID {
			l.mu.Unlock()
			return g
		}
		l.mu.Unlock()
		select {
		case <-l.started:
		case <-t.Context().Done():
			t.Fatal("no getMore")
		}
	}
}

// TestEventTimings: the event watcher reads the capped collection the same
// way on every server; the capability probe picks only its timing — an
// awaitData cursor whose getMore the server holds until an event is
// inserted (MongoDB), or a plainly tailable cursor the watcher polls
// (FerretDB). Both timings run here on the test server, whatever it is:
// every lock change arrives once and in order, and each timing's cursor is
// what it says. With awaitData, each change is made while a getMore waits
// on the server, and that getMore's reply carries the change's event (on
// FerretDB too, with an await long enough that its timeout, which can
// interrupt other statements there, never expires during the test).
func TestEventTimings(t *testing.T) {
	for _, tc := range []struct {
		name  string
		await bool
		set   func(*mongo.Options)
	}{
		{"AwaitData", true, func(o *mongo.Options) { mongo.AwaitEvents(o, time.Minute) }},
		{"Polled", false, func(o *mongo.Options) { mongo.PollEvents(o, 15*time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := newCursorLog()
			prefix := fmt.Sprintf("timing-%d:", time.Now().UnixNano())
			o := &mongo.Options{Prefix: prefix, DisableEvents: true}
			tc.set(o)
			watcher, writer, next := watchPair(t, testDB(t, options.Client().SetMonitor(log.monitor())), o)
			lk := writer.Driver().Locks()
			held := 0
			for i := range 8 {
				key := fmt.Sprint("k", i)
				var g *getMore
				if tc.await && i > 0 {
					// Every event so far has been delivered: the watcher's
					// cursor is at the end, and its next getMore waits.
					g = log.waiting(t)
				}
				rec, ok, err := lk.Acquire(t.Context(), key, "w", time.Minute)
				if err != nil || !ok {
					t.Fatalf("Acquire: %v %v", ok, err)
				}
				if e := next(); e.Kind != driver.LockAcquired || e.Key != key || e.Token != rec.Token {
					t.Fatalf("event %+v, want %s acquired with token %d", e, key, rec.Token)
				}
				if g != nil {
					<-g.done
					if batch, _ := g.reply.Lookup("cursor", "nextBatch").ArrayOK(); len(batch) == 0 || !containsKey(batch, prefix+"lock:"+key) {
						t.Errorf("the getMore waiting when %s was acquired answered %v, want the event", key, g.reply)
					} else {
						held++
					}
				}
				if ok, err := lk.Release(t.Context(), key, "w", rec.Token); err != nil || !ok {
					t.Fatalf("Release: %v %v", ok, err)
				}
				if e := next(); e.Kind != driver.LockReleased || e.Key != key {
					t.Fatalf("event %+v, want %s released", e, key)
				}
			}
			if err := watcher.Close(); err != nil {
				t.Fatal(err)
			}
			// A getMore the server still holds for the closed watcher
			// returns on this event, not at its timeout.
			mustAcquire(t, writer, "last", "w")

			log.mu.Lock()
			defer log.mu.Unlock()
			cursors := 0
			for _, f := range log.finds {
				if tailable, _ := f.Lookup("tailable").BooleanOK(); !tailable {
					continue // a look for the newest event
				}
				cursors++
				if await, _ := f.Lookup("awaitData").BooleanOK(); await != tc.await {
					t.Errorf("the watcher's cursor: awaitData=%v, want %v", await, tc.await)
				}
			}
			if cursors == 0 || len(log.getMores) == 0 {
				t.Fatalf("%d tailable cursors, %d getMores on the event collection", cursors, len(log.getMores))
			}
			for _, g := range log.getMores {
				ms, has := g.cmd.Lookup("maxTimeMS").AsInt64OK()
				if has != tc.await || (has && ms != time.Minute.Milliseconds()) {
					t.Errorf("getMore %v, want maxTimeMS only with awaitData (%v)", g.cmd, tc.await)
					break
				}
			}
			if tc.await && held != 7 {
				t.Errorf("%d of 7 changes answered a waiting getMore", held)
			}
			t.Logf("%d getMores for 16 events", len(log.getMores))
		})
	}
}

// containsKey reports whether a batch of events holds one of stored key
// sk.
func containsKey(batch bson.RawArray, sk string) bool {
	vals, _ := batch.Values()
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			if k, _ := d.Lookup("key").StringValueOK(); k == sk {
				return true
			}
		}
	}
	return false
}

// TestEventsLostAfterCursorError: an event cursor that fails (a getMore
// answered with an error, as when the server goes away) may have missed
// events — a writer that cannot insert its event drops it — so the watch,
// once a cursor is open again, tells its subscribers (EventsLost) before
// the events that follow.
func TestEventsLostAfterCursorError(t *testing.T) {
	db, w := needWire(t, nil)
	prefix := fmt.Sprintf("curerr-%d:", time.Now().UnixNano())
	_, writer, next := watchPair(t, db, &mongo.Options{Prefix: prefix, DisableEvents: true})
	mustAcquire(t, writer, "a", "w")
	if e := next(); e.Kind != driver.LockAcquired || e.Key != "a" {
		t.Fatalf("event %+v, want a acquired", e)
	}
	// The watcher's next getMore on the event collection fails once.
	failed := make(chan struct{})
	var once sync.Once
	errReply, err := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "errmsg", Value: "interrupted at shutdown"},
		{Key: "code", Value: int32(11600)}, {Key: "codeName", Value: "InterruptedAtShutdown"}})
	if err != nil {
		t.Fatal(err)
	}
	w.setRoute(func(c wireCmd) wireStep {
		coll, _ := c.Body.Lookup("collection").StringValueOK()
		if c.Name != "getMore" || coll != mongo.DefaultEventsCollection {
			return wireStep{}
		}
		answered := false
		once.Do(func() { answered = true; close(failed) })
		if !answered {
			return wireStep{}
		}
		return wireStep{answer: errReply}
	})
	<-failed
	mustAcquire(t, writer, "b", "w")
	lost := false
	for {
		e := next()
		if e.Kind == driver.EventsLost {
			lost = true
			continue
		}
		if e.Kind == driver.LockAcquired && e.Key == "b" {
			break
		}
	}
	if !lost {
		t.Fatal("the watch resumed after its cursor failed without reporting that events may be lost")
	}
}

// watchPair opens a watcher store on db with options o (o.Prefix names
// the namespace) and a writer store on the test server in the same
// namespace, subscribes the watcher to lock events until the test ends
// and waits for the registration's gap marker. next returns the next
// event, failing the test if none comes before the test's deadline. Both
// stores close when the test ends.
func watchPair(t *testing.T, db *mongodrv.Database, o *mongo.Options) (watcher, writer *warden.Store, next func() driver.LockEvent) {
	t.Helper()
	watcher, err := mongo.New(db, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watcher.Close() })
	writer, err = mongo.New(testDB(t, nil), &mongo.Options{Prefix: o.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writer.Close() })
	cleanNamespace(t, o.Prefix, mongo.Collections{})
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch, err := watcher.Driver().(driver.LockNotifier).WatchLocks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next = func() driver.LockEvent {
		t.Helper()
		return nextLock(t, ch, "waiting for an event")
	}
	// The registration's gap marker (watchers.go), which comes once a
	// writer in another process would have read the registration: the
	// tests' events come after it.
	for next().Kind != driver.EventsLost {
	}
	return watcher, writer, next
}
