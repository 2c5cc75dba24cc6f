package mongo

import (
	"context"
	"fmt"
	"reflect"
	"time"
	"unsafe"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/eventhub"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// AwaitEvents makes a store opened with o watch events with an awaitData
// cursor whose getMore the server holds up to await, as on MongoDB
// (whatever the server), with no pause of the watcher's own between
// getMores.
func AwaitEvents(o *Options, await time.Duration) {
	o.tailing = &tailTiming{await: await, reopenIdle: awaitTiming.reopenIdle}
}

// PollEvents makes a store opened with o watch events with a plainly
// tailable cursor polled every pause, as on FerretDB (whatever the
// server).
func PollEvents(o *Options, pause time.Duration) {
	o.tailing = &tailTiming{pause: pause, reopenIdle: pollTiming.reopenIdle}
}

// ErrBusy is what the error of an operation that gave up wraps.
var ErrBusy = errBusy

// SetTries sets how many attempts each retry loop of st makes before it
// gives up (retryLimit by default).
func SetTries(st *warden.Store, n int) { st.Driver().(*store).tries = n }

// SetRace sets the hook st's retry loops call where they can lose a race
// (see store.raced for the sites).
func SetRace(st *warden.Store, f func(site string)) { st.Driver().(*store).race = f }

// Concern is what a collection handle reads from and with, and writes
// with.
type Concern struct {
	ReadPref, ReadConcern, WriteConcern string
}

// Concerns returns the concerns of st's collection handles by role:
// locks, circuits, cache, idempotency, checkpoints, fences, events. The
// driver has no getters for them: they are read from the handles' fields.
func Concerns(st *warden.Store) map[string]Concern {
	s := st.Driver().(*store)
	out := map[string]Concern{}
	for role, c := range map[string]*mongodrv.Collection{
		"locks": s.locks, "circuits": s.circs, "cache": s.cache, "idempotency": s.idem,
		"checkpoints": s.cps, "fences": s.fences, "events": s.events,
	} {
		var k Concern
		if rp := field[*readpref.ReadPref](c, "readPreference"); rp != nil {
			k.ReadPref = rp.Mode().String()
		}
		if rc := field[*readconcern.ReadConcern](c, "readConcern"); rc != nil {
			k.ReadConcern = rc.Level
		}
		if wc := field[*writeconcern.WriteConcern](c, "writeConcern"); wc != nil {
			k.WriteConcern = fmt.Sprint(wc.W)
		}
		out[role] = k
	}
	return out
}

// field reads the unexported field name of a collection handle.
func field[T any](c *mongodrv.Collection, name string) T {
	v := reflect.ValueOf(c).Elem().FieldByName(name)
	if !v.IsValid() || v.Type() != reflect.TypeFor[T]() {
		panic(fmt.Sprintf("mongo.Collection has no field %s of type %v (driver changed?)", name, reflect.TypeFor[T]()))
	}
	return *(*T)(unsafe.Pointer(v.UnsafeAddr()))
}

// OwnWatchCache makes a store opened with o learn who watches its
// namespace only from its own reads of the registrations, as if it were
// the only store of its process.
func OwnWatchCache(o *Options) { o.ownWatchCache = true }

// WatchersFresh is how long a writer trusts its read of the
// registrations.
const WatchersFresh = watchersFresh

// SetDropped sets the hook st's event writer calls for each lock event it
// drops because nobody watched (key, and when the writer began deciding).
func SetDropped(st *warden.Store, f func(key string, decided time.Time)) {
	st.Driver().(*store).dropped = func(ev evDoc, decided time.Time) { f(ev.Key, decided) }
}

// ExpireWatchCache makes st's event writer read the registrations again
// before its next write.
func ExpireWatchCache(st *warden.Store) {
	c := st.Driver().(*store).wc
	c.mu.Lock()
	c.read = time.Time{}
	c.mu.Unlock()
}

// RenewNow makes st's watcher renew its registrations at its next check,
// as it does every watcherTTL/3.
func RenewNow(st *warden.Store) {
	h := st.Driver().(*store).hub
	h.regSem <- struct{}{}
	for _, r := range h.reg {
		r.sent = time.Now().Add(-watcherTTL / 3)
	}
	h.unlockReg()
}

// SetAfterRegister sets the hook st's watcher calls after a registration
// was acknowledged, before the watch subscribes.
func SetAfterRegister(st *warden.Store, f func()) {
	h := st.Driver().(*store).hub
	h.regSem <- struct{}{}
	h.afterRegister = f
	h.unlockReg()
}

// StaleKeeperSync makes st's gap marker due now and runs a check of its
// registrations as the keeper of an event watcher that has been replaced
// (whose deliveries the hub refuses) would.
func StaleKeeperSync(st *warden.Store) {
	h := st.Driver().(*store).hub
	h.regSem <- struct{}{}
	h.gapAt = time.Now().Add(-time.Millisecond)
	h.unlockReg()
	h.sync(context.Background(), &eventhub.Run{})
}

// Registered returns the _ids of st's registrations as a watcher, by
// kind.
func Registered(st *warden.Store) map[string]string {
	h := st.Driver().(*store).hub
	h.regSem <- struct{}{}
	defer h.unlockReg()
	out := map[string]string{}
	for kind, r := range h.reg {
		out[kind] = r.doc
	}
	return out
}

// SetCloseHook sets a function Close calls once it refuses new queue
// entries and before it waits for the entry writes in flight.
func SetCloseHook(st *warden.Store, f func()) { st.Driver().(*store).book.SetCloseHook(f) }

// EntryName is the field name of owner's entry in a lock document's
// queue.
var EntryName = entryName
