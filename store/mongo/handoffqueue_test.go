package mongo_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fairtest"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The queue in the lock document (handoff.go), driven through the lock
// package and the driver's LockWaiter, with the document read as stored.

// hq is one test's view of the lock documents of its prefix.
type hq struct {
	t      *testing.T
	prefix string
	locks  *mongodrv.Collection // through a client of the test's own
}

func newHQ(t *testing.T) hq {
	return hq{t, fmt.Sprintf("hq%d:", time.Now().UnixNano()), testDB(t, nil).Collection(mongo.DefaultLocksCollection)}
}

// store opens a store of the test's prefix; opts may be nil.
func (h hq) store(opts *mongo.Options) *warden.Store {
	h.t.Helper()
	o := mongo.Options{}
	if opts != nil {
		o = *opts
	}
	o.Prefix = h.prefix
	st, err := mongo.New(testDB(h.t, nil), &o)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { st.Close() })
	return st
}

// countingStore opens a store whose commands on the locks collection are
// counted.
func (h hq) countingStore(n *counter) *warden.Store {
	h.t.Helper()
	st, err := mongo.New(testDB(h.t, options.Client().SetMonitor(n.monitor())), &mongo.Options{Prefix: h.prefix})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { st.Close() })
	return st
}

func (h hq) locker(st *warden.Store) *lock.Locker {
	h.t.Helper()
	l, err := lock.New(st, &lock.Options{TTL: time.Minute})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { l.Close() })
	return l
}

// doc reads key's lock document as stored.
func (h hq) doc(key string) bson.M {
	h.t.Helper()
	var m bson.M
	err := h.locks.FindOne(context.Background(), bson.D{{Key: "_id", Value: h.prefix + "lock:" + key}}).Decode(&m)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

// queued returns the owners in the queue of key's document.
func (h hq) queued(key string) []string {
	h.t.Helper()
	m, _ := h.doc(key)["waiters"].(bson.D)
	var owners []string
	for _, e := range m {
		o, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(e.Key, "w"))
		if err != nil {
			h.t.Fatalf("queue entry %q: %v", e.Key, err)
		}
		owners = append(owners, string(o))
	}
	return owners
}

// setField sets a field of key's document, as another program would.
func (h hq) setField(key, field string, v any) {
	h.t.Helper()
	_, err := h.locks.UpdateOne(context.Background(),
		bson.D{{Key: "_id", Value: h.prefix + "lock:" + key}}, bson.D{{Key: "$set", Value: bson.D{{Key: field, Value: v}}}})
	if err != nil {
		h.t.Fatal(err)
	}
}

// putEntry sets a queue entry for owner in key's document, as a waiter's
// WaitLock does, arriving at arrival and lasting until until (ms).
func (h hq) putEntry(key, owner string, arrival, until int64) {
	h.setField(key, "waiters."+mongo.EntryName(owner), bson.D{{Key: "a", Value: arrival}, {Key: "u", Value: until}})
}

func ms(v any) int64 {
	switch x := v.(type) {
	case bson.DateTime:
		return int64(x)
	case int64:
		return x
	case int32:
		return int64(x)
	}
	return -1
}

// waitUntil polls cond (the database's state) until it holds; the test
// fails if ctx ends first.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a synchronisation
	}
}

// waitAsync starts w.WaitLock(ctx, key, owner, a minute) and delivers its
// error (a decline is an error here) on the channel returned.
func waitAsync(ctx context.Context, w driver.LockWaiter, key, owner string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		again, err := w.WaitLock(ctx, key, owner, time.Minute)
		if err == nil && !again {
			err = errors.New("WaitLock declined")
		}
		ch <- err
	}()
	return ch
}

// TestHandoffReleaserDoesNotBarge: a holder releases while a waiter of
// another store is queued, and asks again at once. The key goes to the
// waiter: the releaser's TryAcquire is refused naming the waiter, the
// waiter's lease has the next token, and its holding carries its own TTL
// from its Acquire.
func TestHandoffReleaserDoesNotBarge(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	holder := h.locker(h.store(nil))
	waiter := h.locker(h.store(nil))
	for round := range 3 {
		held, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := fairtest.AcquireAsync(ctx, waiter, "k")
		waitUntil(t, ctx, "the waiter to queue", func() bool {
			q := h.queued("k")
			return len(q) == 1 && q[0] == waiter.Owner()
		})
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		again, err := holder.TryAcquire(ctx, "k")
		if err == nil {
			again.Release(ctx)
			t.Fatalf("round %d: the releaser took the key back past the waiter queued before its release", round)
		}
		var he *lock.HeldError
		if !errors.As(err, &he) {
			t.Fatal(err)
		}
		if he.Owner != waiter.Owner() {
			t.Errorf("round %d: the releaser was refused for %q, want the waiter %q", round, he.Owner, waiter.Owner())
		}
		r := <-got
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if r.Lease.Token() <= held.Token() {
			t.Errorf("round %d: token %d after %d", round, r.Lease.Token(), held.Token())
		}
		d := h.doc("k")
		if q := h.queued("k"); len(q) != 0 {
			t.Errorf("round %d: queue %v after the hand-off, want empty", round, q)
		}
		if _, marked := d["handoff"]; marked {
			t.Errorf("round %d: the hand-off mark stayed after the waiter's Acquire took the holding", round)
		}
		if ms(d["expiresAt"]) != ms(d["updatedAt"])+time.Minute.Milliseconds() {
			t.Errorf("round %d: the waiter's holding expires at %d, last written at %d: want its own TTL (1m) from its Acquire",
				round, ms(d["expiresAt"]), ms(d["updatedAt"]))
		}
		if err := r.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandoffDeadWaiterBounded: the first waiter in the queue is dead (its
// entry set as a WaitLock sets it, never renewed). The release hands it
// the key with an expiry of exactly 2 s from the release, and removes its
// entry; a live waiter queued behind it gets the key once that holding
// lapses, and a dead entry whose time ran out is skipped and removed.
func TestHandoffDeadWaiterBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	holder := h.locker(h.store(nil))
	waiter := h.locker(h.store(nil))

	held, err := holder.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	h.putEntry("k", "dead", 1, time.Now().Add(time.Hour).UnixMilli())
	got := fairtest.AcquireAsync(ctx, waiter, "k")
	waitUntil(t, ctx, "the live waiter to queue", func() bool { return len(h.queued("k")) == 2 })
	sent := time.Now().UnixMilli()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	done := time.Now().UnixMilli()
	d := h.doc("k")
	if d["owner"] != "dead" {
		t.Fatalf("after the release the key is held by %q, want the dead waiter that queued first", d["owner"])
	}
	at, exp := ms(d["acquiredAt"]), ms(d["expiresAt"])
	if at < sent || at > done || exp != at+2000 {
		t.Errorf("handed holding from %d to %d; the release was sent at %d and answered at %d: want it to last exactly 2000 ms from the release", at, exp, sent, done)
	}
	if q := h.queued("k"); len(q) != 1 || q[0] != waiter.Owner() {
		t.Errorf("queue %v after the hand-off, want only the live waiter", q)
	}
	deadToken := ms(d["token"])
	r := <-got
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	d = h.doc("k")
	if r.Lease.Token() <= deadToken || d["owner"] != waiter.Owner() {
		t.Errorf("the live waiter holds token %d (document owner %q) after the dead waiter's %d", r.Lease.Token(), d["owner"], deadToken)
	}
	if ms(d["acquiredAt"]) < exp {
		t.Errorf("the live waiter's holding began at %d, before the handed holding lapsed at %d", ms(d["acquiredAt"]), exp)
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A dead entry whose time ran out is not handed the key: the release
	// frees it and removes the entry.
	held, err = holder.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	h.putEntry("k", "lapsed", 1, time.Now().Add(-time.Millisecond).UnixMilli())
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	d = h.doc("k")
	if d["released"] != true || d["owner"] != holder.Owner() {
		t.Errorf("release with only a lapsed entry queued: owner %q, released %v; want released by the holder", d["owner"], d["released"])
	}
	if _, left := d["waiters"]; left {
		t.Errorf("queue %v after the release, want the lapsed entry removed", d["waiters"])
	}
}

// TestHandoffLeaveHandsOn: a waiter whose wait saw the key handed to it
// but gives up (LeaveLock, as the lock package calls it when the waiting
// Acquire ends without a lease) releases the holding, which goes to the
// next waiter in the queue; a LeaveLock after the Acquire took the
// holding releases nothing. The owners are not plain field names.
func TestHandoffLeaveHandsOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	holder := h.store(nil)
	first := h.store(nil).Driver().(driver.LockWaiter)
	second := h.store(nil).Driver().(driver.LockWaiter)
	const o1, o2 = "fir.st", "$sec.ond"
	rec, ok, err := holder.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	waited := waitAsync(ctx, first, "k", o1)
	waitUntil(t, ctx, "the first waiter to queue", func() bool { return len(h.queued("k")) == 1 })
	secondDone := waitAsync(ctx, second, "k", o2)
	waitUntil(t, ctx, "the second waiter to queue", func() bool { return len(h.queued("k")) == 2 })
	if ok, err := holder.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if o := h.doc("k")["owner"]; o != o1 {
		t.Fatalf("key handed to %q, want the first waiter", o)
	}
	first.LeaveLock("k", o1)
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	d := h.doc("k")
	if d["owner"] != o2 {
		t.Fatalf("after the first waiter left, the key is held by %q, want it handed on to the second", d["owner"])
	}
	// The second waiter's Acquire takes the holding; its LeaveLock, which
	// the lock package calls after a waiting Acquire either way, keeps it.
	got, ok, err := second.(driver.Store).Locks().Acquire(ctx, "k", o2, time.Minute)
	if err != nil || !ok || got.Token != ms(d["token"]) {
		t.Fatalf("the second waiter's Acquire: %+v, %v, %v; want the handed holding (token %d)", got, ok, err, ms(d["token"]))
	}
	second.LeaveLock("k", o2)
	d = h.doc("k")
	if d["released"] != false || d["owner"] != o2 {
		t.Errorf("LeaveLock after the Acquire took the holding released it (owner %q, released %v)", d["owner"], d["released"])
	}
}

// TestHandoffLeaveKeepsLease: a Locker's waiting Acquire is handed the key,
// but a TryAcquire of the same Locker takes the holding first (as a
// re-entrant acquire: a lease); the waiting Acquire's store wait then sees
// the key "handed" to its owner. When that Acquire gives up, its
// LeaveLock must not release the lease: it releases only a holding that
// no Acquire or Refresh took (the handoff mark).
func TestHandoffLeaveKeepsLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	// A's wait notices a hand-off only at its renewal (500 ms): no
	// first-waiter reads, and B writes no events. The TryAcquire comes
	// first.
	a := h.locker(h.store(&mongo.Options{HandoffPoll: time.Hour}))
	b := h.locker(h.store(&mongo.Options{DisableEvents: true}))
	held, err := b.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	waiting := fairtest.AcquireAsync(actx, a, "k")
	waitUntil(t, ctx, "A to queue", func() bool {
		q := h.queued("k")
		return len(q) == 1 && q[0] == a.Owner()
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if o := h.doc("k")["owner"]; o != a.Owner() {
		t.Fatalf("key handed to %q, want A", o)
	}
	lease, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("A's TryAcquire of the key handed to A: %v", err)
	}
	// A's wait renews its entry (its owner holds the key now) ...
	waitUntil(t, ctx, "A's wait to renew its entry", func() bool { return len(h.queued("k")) == 1 })
	// ... and gives up.
	acancel()
	if r := <-waiting; r.Err == nil {
		r.Lease.Release(ctx)
		t.Fatal("the waiting Acquire got a second lease of a key its Locker holds")
	}
	d := h.doc("k")
	if d["released"] != false || d["owner"] != a.Owner() || ms(d["token"]) != lease.Token() {
		t.Fatalf("after the waiting Acquire gave up, the document is owner %q token %d released %v; want A's lease (token %d) intact",
			d["owner"], ms(d["token"]), d["released"], lease.Token())
	}
	if other, err := b.TryAcquire(ctx, "k"); err == nil {
		other.Release(ctx)
		t.Fatal("B took the key while A's lease is live")
	} else if !errors.Is(err, lock.ErrLocked) {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRoundTripsHandoff counts the commands of the contended paths: a
// release that finds a waiter it did not know of (the plain release's
// filter fails, a read, the hand-off: 3), a release that knows its
// waiters from its last write (1), and the Acquire of the waiter the key
// was handed to (one Refresh). The uncontended cycle stays 1 + 1
// (TestRoundTrips).
func TestRoundTripsHandoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	var hn, wn counter // the holder's commands, the waiter's
	hst := h.countingStore(&hn)
	wst := h.countingStore(&wn)
	w := wst.Driver().(driver.LockWaiter)
	rec, ok, err := hst.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	for _, known := range []bool{false, true} {
		waited := waitAsync(ctx, w, "k", "waiter")
		waitUntil(t, ctx, "the waiter to queue", func() bool { return len(h.queued("k")) == 1 })
		want := int64(3)
		if known {
			// The holder's refresh brings the queue back with the holding.
			if _, ok, err := hst.Locks().Refresh(ctx, "k", "holder", rec.Token, time.Minute); err != nil || !ok {
				t.Fatal(ok, err)
			}
			want = 1
		}
		before := hn.cmds.Load()
		if ok, err := hst.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		if got := hn.cmds.Load() - before; got != want {
			t.Errorf("release with a waiter (known from the last write: %v): %d commands, want %d", known, got, want)
		}
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		before = wn.cmds.Load()
		got, ok, err := wst.Locks().Acquire(ctx, "k", "waiter", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if n := wn.cmds.Load() - before; n != 1 {
			t.Errorf("the Acquire of a waiter handed the key: %d commands, want 1", n)
		}
		if ok, err := wst.Locks().Release(ctx, "k", "waiter", got.Token); err != nil || !ok {
			t.Fatal(ok, err)
		}
		rec, ok, err = hst.Locks().Acquire(ctx, "k", "holder", time.Minute)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if ok, err := hst.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}

	// A waiter that takes a free key (its holder's holding lapsed: no
	// hand-off) removes its own entry in its acquire; its release with
	// nobody waiting is then one command.
	rec, ok, err = hst.Locks().Acquire(ctx, "k", "dying", 300*time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	lease, err := h.locker(wst).Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token() <= rec.Token {
		t.Errorf("token %d after %d", lease.Token(), rec.Token)
	}
	if q := h.queued("k"); len(q) != 0 {
		t.Errorf("queue %v once the waiter holds the key", q)
	}
	before := wn.cmds.Load()
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := wn.cmds.Load() - before; got != 1 {
		t.Errorf("release after a waiter took a free key, nobody waiting: %d commands, want 1", got)
	}
}

// TestHandoffDisabled: a store opened with DisableHandoff (handoff=false)
// declines to wait — its waiters poll — and sets no queue entry; a release
// by it still hands the key to a waiter another store queued.
func TestHandoffDisabled(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	off := h.store(&mongo.Options{DisableHandoff: true})
	on := h.store(nil)
	rec, ok, err := on.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	again, err := off.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "polling", time.Minute)
	if err != nil || again {
		t.Fatalf("WaitLock on a store without hand-off: %v, %v; want false (the waiter polls)", again, err)
	}
	if q := h.queued("k"); len(q) != 0 {
		t.Fatalf("queue %v after a declined wait, want none", q)
	}
	if ok, err := on.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	rec, ok, err = off.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	waited := waitAsync(ctx, on.Driver().(driver.LockWaiter), "k", "queued")
	waitUntil(t, ctx, "the waiter to queue", func() bool { return len(h.queued("k")) == 1 })
	if ok, err := off.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if o := h.doc("k")["owner"]; o != "queued" {
		t.Errorf("a release by a store without hand-off left the key to %q, want the waiter queued by another store", o)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

// TestHandoffForeignWaitersField: a waiters field of another type, set by
// another program, does not stop a release: the release frees the key and
// removes the field. A wait on such a document declines (its waiter
// polls).
func TestHandoffForeignWaitersField(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	st := h.store(nil)
	for name, v := range map[string]any{"string": "junk", "number": 7, "array": bson.A{"x"}, "null": nil} {
		rec, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Minute)
		if err != nil || !ok {
			t.Fatal(name, ok, err)
		}
		h.setField("k", "waiters", v)
		again, err := st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "waiter", time.Minute)
		if err != nil || again {
			t.Errorf("%s: WaitLock on a document with a foreign waiters field: %v, %v; want it to decline", name, again, err)
		}
		if ok, err := st.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
			t.Fatalf("%s: release with a foreign waiters field: %v, %v", name, ok, err)
		}
		d := h.doc("k")
		if d["released"] != true {
			t.Errorf("%s: not released", name)
		}
		if _, left := d["waiters"]; left {
			t.Errorf("%s: the foreign waiters field is still there: %v", name, d["waiters"])
		}
	}
}

// TestHandoffWaitBadInput: WaitLock refuses the keys and owners the lock
// operations refuse, before queueing anything (a release would hand the
// key to such an owner).
func TestHandoffWaitBadInput(t *testing.T) {
	ctx := t.Context()
	h := newHQ(t)
	st := h.store(nil)
	if _, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	w := st.Driver().(driver.LockWaiter)
	for _, c := range []struct{ key, owner string }{
		{"k", "a\x00b"}, {"k", strings.Repeat("o", 2000)}, {"k", ""}, {"", "o"}, {strings.Repeat("k", 600), "o"},
	} {
		again, err := w.WaitLock(ctx, c.key, c.owner, time.Second)
		if again || !errors.Is(err, warden.ErrInvalidKey) {
			t.Errorf("WaitLock(%.20q, %.20q) = %v, %v; want ErrInvalidKey", c.key, c.owner, again, err)
		}
	}
	if q := h.queued("k"); len(q) != 0 {
		t.Errorf("queue %v", q)
	}
}

// TestHandoffNodeDocDeclines: a key held by a service of the go-go-scope
// layout (its own document, no token) takes no queue: WaitLock declines,
// and a second wait while that holding lasts costs no command.
func TestHandoffNodeDocDeclines(t *testing.T) {
	for _, expiry := range []bool{true, false} {
		t.Run(fmt.Sprintf("expiresAt=%v", expiry), func(t *testing.T) { nodeDocDeclines(t, expiry) })
	}
}

// nodeDocDeclines is TestHandoffNodeDocDeclines, with a go-go-scope
// document that has an expiresAt (an hour away) or none (the adapter's
// holding then never expires, as an acquire reads it).
func nodeDocDeclines(t *testing.T, expiry bool) {
	ctx := t.Context()
	h := newHQ(t)
	var n counter
	st := h.countingStore(&n)
	coll := h.locks
	doc := bson.D{{Key: "key", Value: h.prefix + "lock:k"}, {Key: "owner", Value: "node"}, {Key: "createdAt", Value: time.Now()}}
	if expiry {
		doc = append(doc, bson.E{Key: "expiresAt", Value: time.Now().Add(time.Hour)})
	}
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.Locks().Acquire(ctx, "k", "waiter", time.Minute); err != nil || ok {
		t.Fatalf("Acquire of a key a go-go-scope service holds: %v, %v; want refused", ok, err)
	}
	w := st.Driver().(driver.LockWaiter)
	for i, want := range []int64{2, 0} {
		before := n.cmds.Load()
		again, err := w.WaitLock(ctx, "k", "waiter", time.Minute)
		if err != nil || again {
			t.Fatalf("wait %d on a go-go-scope holding: %v, %v; want it to decline", i, again, err)
		}
		if got := n.cmds.Load() - before; got > want {
			t.Errorf("wait %d on a go-go-scope holding: %d commands, want at most %d", i, got, want)
		}
	}
	if c, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: h.prefix + "lock:k"}}); err != nil || c != 0 {
		t.Errorf("a document of warden's was created for a wait on a go-go-scope holding: %d, %v", c, err)
	}
}

// TestHandoffCloseWaitsForEntryWrite: Close races a wait whose entry write
// is in flight. Close refuses new entries and waits for those in flight
// before it takes its owners out of the queues, so no entry of the closed
// store stays behind to be handed the key (a 2 s stall for the others).
func TestHandoffCloseWaitsForEntryWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	holder := h.store(nil)
	if _, ok, err := holder.Locks().Acquire(ctx, "k", "holder", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	entered, gate, leaving := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once, leaveOnce sync.Once
	var leaveID atomic.Int64 // the request that takes the entry out of the queue
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName != "findAndModify" {
			return
		}
		switch cmd := e.Command.String(); {
		case strings.Contains(cmd, `"$set"`) && strings.Contains(cmd, `"waiters.`):
			once.Do(func() {
				close(entered)
				<-gate // until Close refuses new entries
				// Then until the store has left the queue — which it must
				// not do before this write is answered — or a while
				// shorter than its wait for writes in flight (1 s).
				t := time.NewTimer(300 * time.Millisecond)
				defer t.Stop()
				select {
				case <-leaving:
				case <-t.C:
				}
			})
		case strings.Contains(cmd, `"$unset"`) && strings.Contains(cmd, `"waiters.`):
			leaveID.CompareAndSwap(0, e.RequestID)
		}
	}, Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
		if e.RequestID == leaveID.Load() {
			leaveOnce.Do(func() { close(leaving) })
		}
	}}
	st, err := mongo.New(testDB(t, options.Client().SetMonitor(mon)), &mongo.Options{Prefix: h.prefix})
	if err != nil {
		t.Fatal(err)
	}
	mongo.SetCloseHook(st, func() { close(gate) })
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "closing", time.Minute)
	}()
	<-entered
	st.Close()
	<-waited
	if q := h.queued("k"); len(q) != 0 {
		t.Errorf("queue %v after Close: an entry of the closed store stays to be handed the key", q)
	}
}

// TestHandoffNodeDocAfterRelease: warden's document of a key is released
// and a service of the go-go-scope layout holds the key with a document
// of its own. A wait finds warden's document free, but must not send its
// waiter to try again at once (it would find the key held, again and
// again): it declines, takes its entry out, and later waits while that
// holding lasts cost no command.
func TestHandoffNodeDocAfterRelease(t *testing.T) {
	ctx := t.Context()
	h := newHQ(t)
	var n counter
	st := h.countingStore(&n)
	rec, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := st.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := h.locks.InsertOne(ctx, bson.D{{Key: "key", Value: h.prefix + "lock:k"}, {Key: "owner", Value: "node"},
		{Key: "expiresAt", Value: time.Now().Add(time.Hour)}, {Key: "createdAt", Value: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	w := st.Driver().(driver.LockWaiter)
	for i, want := range []int64{3, 0} {
		before := n.cmds.Load()
		again, err := w.WaitLock(ctx, "k", "waiter", time.Minute)
		if err != nil || again {
			t.Fatalf("wait %d on a key a go-go-scope service holds: %v, %v; want it to decline", i, again, err)
		}
		if got := n.cmds.Load() - before; got > want {
			t.Errorf("wait %d on a key a go-go-scope service holds: %d commands, want at most %d", i, got, want)
		}
	}
	if q := h.queued("k"); len(q) != 0 {
		t.Errorf("queue %v after declined waits, want none", q)
	}
}

// TestHandoffKilledWaiter: the first waiter in the queue is a process that
// is SIGKILLed while it waits, its entry still live. The release hands it
// the key (it cannot know), for exactly 2 s from the release; the waiter
// of this process queued behind it takes the key once that holding lapses,
// with a greater token. A dead waiter delays the others once, by a bounded
// time.
func TestHandoffKilledWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	h := newHQ(t)
	st := h.store(nil)
	rec, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Hour)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	spec, _ := json.Marshal(handoffSpec{URL: serverURL(t, h.prefix), Key: "k"})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), handoffChildEnv+"="+string(spec))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if sc := bufio.NewScanner(out); !sc.Scan() || sc.Text() != "waiting" {
		t.Fatalf("the waiter process said %q, want waiting", sc.Text())
	}
	waitUntil(t, ctx, "the waiter process to queue", func() bool { return len(h.queued("k")) == 1 })
	l := h.locker(h.store(nil))
	got := fairtest.AcquireAsync(ctx, l, "k")
	waitUntil(t, ctx, "the waiter of this process to queue", func() bool { return len(h.queued("k")) == 2 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // dead before the release
	if ok, err := st.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	d := h.doc("k")
	if o, _ := d["owner"].(string); !strings.HasPrefix(o, "waiter") {
		t.Fatalf("the release left the key to %q, want the killed waiter, first in the queue", o)
	}
	handedExp, handedToken := ms(d["expiresAt"]), ms(d["token"])
	if handedExp != ms(d["acquiredAt"])+2000 {
		t.Errorf("the killed waiter's holding runs from %d to %d, want exactly 2000 ms", ms(d["acquiredAt"]), handedExp)
	}
	r := <-got
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	d = h.doc("k")
	if d["owner"] != l.Owner() || r.Lease.Token() <= handedToken || r.Lease.Token() <= rec.Token {
		t.Errorf("the live waiter holds token %d (document owner %q) after the killed waiter's %d", r.Lease.Token(), d["owner"], handedToken)
	}
	if ms(d["acquiredAt"]) < handedExp {
		t.Errorf("the live waiter's holding began at %d, before the killed waiter's lapsed at %d", ms(d["acquiredAt"]), handedExp)
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
