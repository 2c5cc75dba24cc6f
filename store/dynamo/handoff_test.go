package dynamo_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/fairtest"
	"github.com/warden-go/warden/internal/testkit"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/dynamo"
)

// Fair hand-off (handoff.go): waiters queue in the lock item, and a
// release hands the key to the one that queued first, across processes;
// a waiter that dies or gives up delays the others by a bounded time;
// the item alone decides who holds the lock.

const handoffChildEnv = "WARDEN_DYNAMO_HANDOFF_CHILD"

// handoffChild configures a child process of the fairness check.
type handoffChild struct {
	Endpoint, Table, Prefix string
	Workers, Total          int
}

func init() {
	// The child processes run the same binary; they never reach the tests.
	if js, ok := os.LookupEnv(handoffChildEnv); ok {
		os.Exit(runHandoffChild(js))
	}
}

// childClient is a client of the test endpoint for a child process.
func childClient(ep string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: staticCreds{},
	})
}

type staticCreds struct{}

func (staticCreds) Retrieve(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: "warden-test", SecretAccessKey: "warden-test"}, nil
}

// counterKey is the key of the counter the holders bump under the lock.
func counterKey(prefix string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": nS("COUNTER#" + prefix), "sk": nS("METADATA")}
}

// runHandoffChild: Workers Lockers, each on a store of its own, take the
// key "fair" in turn, bump the counter and hold the key 1 ms, until the
// counter passes Total (fairtest.Child).
func runHandoffChild(js string) int {
	var cfg handoffChild
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := childClient(cfg.Endpoint)
	var lockers []*lock.Locker
	for range cfg.Workers {
		st, err := dynamo.New(childClient(cfg.Endpoint), cfg.Table, &dynamo.Options{Prefix: cfg.Prefix})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer st.Close()
		l, err := lock.New(st, &lock.Options{TTL: 30 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer l.Close()
		lockers = append(lockers, l)
	}
	return fairtest.Child(func() testkit.FairResult {
		return fairtest.Run(ctx, lockers, "fair", cfg.Total, time.Millisecond, func(ctx context.Context) (int64, error) {
			out, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName: &cfg.Table, Key: counterKey(cfg.Prefix),
				UpdateExpression:          aws.String("ADD #n :one"),
				ExpressionAttributeNames:  map[string]string{"#n": "n"},
				ExpressionAttributeValues: map[string]types.AttributeValue{":one": nN(1)},
				ReturnValues:              types.ReturnValueUpdatedNew,
			})
			if err != nil {
				return 0, err
			}
			return strconv.ParseInt(out.Attributes["n"].(*types.AttributeValueMemberN).Value, 10, 64)
		})
	})
}

// TestHandoffFairAcrossProcesses: 2 processes × 4 workers (a Locker and a
// store each) take one key in turn, bumping a counter and holding the key
// 1 ms, until the counter reaches 120. Waiters queue in the lock item and
// releases hand the key on, so every worker gets about its share: the
// fewest acquisitions of a worker are at least half the most (with the
// events index alone, a releaser that asked again at once took the key
// back: 0.01). The tokens increase with the counter: one holder at a
// time.
func TestHandoffFairAcrossProcesses(t *testing.T) {
	testkit.FairTwice(t, func(attempt int) bool { return handoffFairRun(t, attempt) })
}

func handoffFairRun(t *testing.T, attempt int) bool {
	const procs, workers, total = 2, 4, 120
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	table := testTable(t)
	prefix := fmt.Sprintf("fair%d:", attempt)
	// The table exists before the children open it.
	st, err := dynamo.New(newClient(t), table, &dynamo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	cfg := handoffChild{Endpoint: endpoint(t), Table: table, Prefix: prefix, Workers: workers, Total: total}
	js, _ := json.Marshal(cfg)
	results := fairtest.Children(t, ctx, procs, handoffChildEnv, string(js))
	return testkit.CheckFair(t, results, workers, total)
}

// handoffStore opens a store of prefix "h:" on table.
func handoffStore(t *testing.T, table string, mws ...func(*middleware.Stack) error) *warden.Store {
	t.Helper()
	st, err := dynamo.New(newClient(t, mws...), table, &dynamo.Options{Prefix: "h:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func handoffLocker(t *testing.T, st *warden.Store) *lock.Locker {
	t.Helper()
	l, err := lock.New(st, &lock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// lockItem reads the lock item of key (prefix "h:") as stored.
func readLockItem(t *testing.T, table, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := newClient(t).GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: &table, ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": nS("LOCK#h:lock:" + key), "sk": nS("METADATA")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// queued returns the owners in the queue of key's item.
func queued(t *testing.T, table, key string) []string {
	t.Helper()
	m, _ := readLockItem(t, table, key)["waiters"].(*types.AttributeValueMemberM)
	if m == nil {
		return nil
	}
	var owners []string
	for o := range m.Value {
		owners = append(owners, o)
	}
	return owners
}

func numAttr(it map[string]types.AttributeValue, name string) int64 {
	n, _ := it[name].(*types.AttributeValueMemberN)
	if n == nil {
		return 0
	}
	v, _ := strconv.ParseInt(n.Value, 10, 64)
	return v
}

func strAttr(it map[string]types.AttributeValue, name string) string {
	s, _ := it[name].(*types.AttributeValueMemberS)
	if s == nil {
		return ""
	}
	return s.Value
}

// waitUntil polls cond (the table's state) until it holds; the test fails
// if ctx ends first.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a synchronisation
	}
}

var acquireAsync = fairtest.AcquireAsync

// TestHandoffReleaserDoesNotBarge: a holder releases while a waiter of
// another store is queued, and asks again at once. The key goes to the
// waiter: the releaser's TryAcquire is refused naming the waiter, and the
// waiter's lease has the next token.
func TestHandoffReleaserDoesNotBarge(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	holder := handoffLocker(t, handoffStore(t, table))
	waiter := handoffLocker(t, handoffStore(t, table))
	for round := range 3 {
		held, err := holder.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(ctx, waiter, "k")
		waitUntil(t, ctx, "the waiter to queue", func() bool {
			q := queued(t, table, "k")
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
		it := readLockItem(t, table, "k")
		if q := queued(t, table, "k"); len(q) != 0 {
			t.Errorf("round %d: queue %v after the hand-off, want empty", round, q)
		}
		if numAttr(it, "expiresAtMs") != numAttr(it, "updatedAt")+time.Minute.Milliseconds() {
			t.Errorf("round %d: the waiter's holding expires at %d, last written at %d: want its own TTL (1m) from its Acquire",
				round, numAttr(it, "expiresAtMs"), numAttr(it, "updatedAt"))
		}
		if err := r.Lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// putEntry writes a queue entry for owner into key's item, as a waiter's
// WaitLock does, arriving at arrival and lasting until until (ms).
func putEntry(t *testing.T, table, key, owner string, arrival, until int64) {
	t.Helper()
	_, err := newClient(t).UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName:        &table,
		Key:              map[string]types.AttributeValue{"pk": nS("LOCK#h:lock:" + key), "sk": nS("METADATA")},
		UpdateExpression: aws.String("SET #w = :m"), ConditionExpression: aws.String("attribute_exists(pk)"),
		ExpressionAttributeNames: map[string]string{"#w": "waiters"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			owner: &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"a": nN(arrival), "u": nN(until)}},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestHandoffDeadWaiterBounded: the first waiter in the queue is dead (its
// entry written as a WaitLock writes it, never renewed). The release hands
// it the key with an expiry of exactly handoff.Grace (2 s) from the release,
// and removes its entry; a live waiter queued behind it gets the key once
// that holding lapses, and a dead entry whose time ran out is skipped
// and removed.
func TestHandoffDeadWaiterBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	st := handoffStore(t, table)
	holder := handoffLocker(t, st)
	waiter := handoffLocker(t, handoffStore(t, table))

	held, err := holder.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	putEntry(t, table, "k", "dead", 1, time.Now().Add(time.Hour).UnixMilli())
	got := acquireAsync(ctx, waiter, "k")
	waitUntil(t, ctx, "the live waiter to queue", func() bool { return len(queued(t, table, "k")) == 2 })
	sent := time.Now().UnixMilli()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	done := time.Now().UnixMilli()
	it := readLockItem(t, table, "k")
	if o := strAttr(it, "owner"); o != "dead" {
		t.Fatalf("after the release the key is held by %q, want the dead waiter that queued first", o)
	}
	at, exp := numAttr(it, "acquiredAt"), numAttr(it, "expiresAtMs")
	if at < sent || at > done || exp != at+2000 {
		t.Errorf("handed holding from %d to %d; the release was sent at %d and answered at %d: want it to last exactly 2000 ms from the release", at, exp, sent, done)
	}
	if q := queued(t, table, "k"); len(q) != 1 || q[0] != waiter.Owner() {
		t.Errorf("queue %v after the hand-off, want only the live waiter", q)
	}
	deadToken := numAttr(it, "version")
	r := <-got
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	it = readLockItem(t, table, "k")
	if r.Lease.Token() <= deadToken || strAttr(it, "owner") != waiter.Owner() {
		t.Errorf("the live waiter holds token %d (item owner %q) after the dead waiter's %d", r.Lease.Token(), strAttr(it, "owner"), deadToken)
	}
	if numAttr(it, "acquiredAt") < exp {
		t.Errorf("the live waiter's holding began at %d, before the handed holding lapsed at %d", numAttr(it, "acquiredAt"), exp)
	}
	if err := r.Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A dead entry whose time ran out is not handed the key: the release
	// frees the item and removes the entry.
	held, err = holder.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	putEntry(t, table, "k", "lapsed", 1, time.Now().Add(-time.Millisecond).UnixMilli())
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	it = readLockItem(t, table, "k")
	if _, released := it["releasedAt"]; !released || strAttr(it, "owner") != holder.Owner() {
		t.Errorf("release with only a lapsed entry queued: owner %q, released %v; want released by the holder", strAttr(it, "owner"), released)
	}
	if q := queued(t, table, "k"); len(q) != 0 {
		t.Errorf("queue %v after the release, want the lapsed entry removed", q)
	}
}

// TestHandoffLeaveHandsOn: a waiter whose wait saw the key handed to it
// but gives up (LeaveLock, as the lock package calls it when the waiting
// Acquire ends without a lease) releases the holding, which goes to the
// next waiter in the queue; a LeaveLock after the Acquire took the
// holding releases nothing.
func TestHandoffLeaveHandsOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	holder := handoffStore(t, table)
	first := handoffStore(t, table).Driver().(driver.LockWaiter)
	second := handoffStore(t, table).Driver().(driver.LockWaiter)
	rec, ok, err := holder.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	waited := make(chan error, 1)
	go func() {
		again, err := first.WaitLock(ctx, "k", "first", time.Minute)
		if err == nil && !again {
			err = errors.New("WaitLock declined")
		}
		waited <- err
	}()
	waitUntil(t, ctx, "the first waiter to queue", func() bool { return len(queued(t, table, "k")) == 1 })
	secondDone := make(chan error, 1)
	go func() {
		again, err := second.WaitLock(ctx, "k", "second", time.Minute)
		if err == nil && !again {
			err = errors.New("WaitLock declined")
		}
		secondDone <- err
	}()
	waitUntil(t, ctx, "the second waiter to queue", func() bool { return len(queued(t, table, "k")) == 2 })
	if ok, err := holder.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if o := strAttr(readLockItem(t, table, "k"), "owner"); o != "first" {
		t.Fatalf("key handed to %q, want the first waiter", o)
	}
	first.LeaveLock("k", "first")
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	it := readLockItem(t, table, "k")
	if o := strAttr(it, "owner"); o != "second" {
		t.Fatalf("after the first waiter left, the key is held by %q, want it handed on to the second", o)
	}
	// The second waiter's Acquire takes the holding; its LeaveLock, which
	// the lock package calls after a waiting Acquire either way, keeps it.
	got, ok, err := second.(driver.Store).Locks().Acquire(ctx, "k", "second", time.Minute)
	if err != nil || !ok || got.Token != numAttr(it, "version") {
		t.Fatalf("the second waiter's Acquire: %+v, %v, %v; want the handed holding (token %d)", got, ok, err, numAttr(it, "version"))
	}
	second.LeaveLock("k", "second")
	it = readLockItem(t, table, "k")
	if _, released := it["releasedAt"]; released || strAttr(it, "owner") != "second" {
		t.Errorf("LeaveLock after the Acquire took the holding released it (owner %q)", strAttr(it, "owner"))
	}
}

// TestRoundTripsHandoff counts the requests of the contended paths: a
// release that finds a waiter it did not know of (the plain release's
// condition fails: 2 requests where the endpoint returns the item with a
// failed condition, 3 on dynalite), and the Acquire of the waiter it was
// handed to (one Refresh). The uncontended cycle stays 1 + 1
// (TestRoundTrips).
func TestRoundTripsHandoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	var n, wn atomic.Int64 // the holder's requests, the waiter's
	hst := handoffStore(t, table, countAttempts(&n))
	wst := handoffStore(t, table, countAttempts(&wn))
	rec, ok, err := hst.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	w := wst.Driver().(driver.LockWaiter)
	waited := make(chan error, 1)
	go func() {
		_, err := w.WaitLock(ctx, "k", "waiter", time.Minute)
		waited <- err
	}()
	waitUntil(t, ctx, "the waiter to queue", func() bool { return len(queued(t, table, "k")) == 1 })
	n.Store(0)
	if ok, err := hst.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got := n.Load(); got < 2 || got > 3 {
		t.Errorf("release with an unknown waiter: %d requests, want 2 (3 without the item in the failed condition's reply)", got)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	wn.Store(0)
	got, ok, err := wst.Locks().Acquire(ctx, "k", "waiter", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if got := wn.Load(); got != 1 {
		t.Errorf("the Acquire of a waiter handed the key: %d requests, want 1", got)
	}
	if ok, err := wst.Locks().Release(ctx, "k", "waiter", got.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}

	// A waiter that takes a free key (its holder's holding lapsed; no
	// hand-off) leaves its own entry behind until its acquire removes it;
	// its release with nobody waiting is then still one request.
	rec, ok, err = hst.Locks().Acquire(ctx, "k", "dying", 300*time.Millisecond)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var cn atomic.Int64 // writes and reads of the waiter's store (its watcher's Queries aside)
	l := handoffLocker(t, handoffStore(t, table, countOp("UpdateItem", &cn), countOp("GetItem", &cn)))
	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token() <= rec.Token {
		t.Errorf("token %d after %d", lease.Token(), rec.Token)
	}
	cn.Store(0)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cn.Load(); got != 1 {
		t.Errorf("release after a waiter took a free key, nobody waiting: %d requests, want 1", got)
	}
}

// TestHandoffDisabled: a store opened with DisableHandoff (handoff=false)
// declines to wait — its waiters poll — and writes no queue entry; a
// release by it still hands the key to a waiter another store queued.
func TestHandoffDisabled(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	off, err := dynamo.New(newClient(t), table, &dynamo.Options{Prefix: "h:", DisableHandoff: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { off.Close() })
	on := handoffStore(t, table)
	rec, ok, err := on.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	again, err := off.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "polling", time.Minute)
	if err != nil || again {
		t.Fatalf("WaitLock on a store without hand-off: %v, %v; want false (the waiter polls)", again, err)
	}
	if q := queued(t, table, "k"); len(q) != 0 {
		t.Fatalf("queue %v after a declined wait, want none", q)
	}
	if ok, err := on.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	rec, ok, err = off.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := on.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "queued", time.Minute)
		waited <- err
	}()
	waitUntil(t, ctx, "the waiter to queue", func() bool { return len(queued(t, table, "k")) == 1 })
	if ok, err := off.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if o := strAttr(readLockItem(t, table, "k"), "owner"); o != "queued" {
		t.Errorf("a release by a store without hand-off left the key to %q, want the waiter queued by another store", o)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

// TestHandoffLeaveKeepsLease: a Locker's waiting Acquire is handed the key,
// but a TryAcquire of the same Locker takes the holding first (as a
// re-entrant acquire: a lease); the waiting Acquire's store wait then sees
// the key "handed" to its owner. When that Acquire gives up, its
// LeaveLock must not release the lease: it releases only a holding that
// no Acquire or Refresh took (the handoff mark). Before, the lease's key
// was released behind it and another Locker took it.
func TestHandoffLeaveKeepsLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	// Waits that notice a hand-off only at their renewal (500 ms): the
	// TryAcquire comes first.
	slow, err := dynamo.New(newClient(t), table, &dynamo.Options{Prefix: "h:", EventPoll: time.Hour, HandoffPoll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	a := handoffLocker(t, slow)
	b := handoffLocker(t, handoffStore(t, table))
	held, err := b.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	waiting := acquireAsync(actx, a, "k")
	waitUntil(t, ctx, "A to queue", func() bool {
		q := queued(t, table, "k")
		return len(q) == 1 && q[0] == a.Owner()
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if o := strAttr(readLockItem(t, table, "k"), "owner"); o != a.Owner() {
		t.Fatalf("key handed to %q, want A", o)
	}
	lease, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("A's TryAcquire of the key handed to A: %v", err)
	}
	// A's wait renews its entry (its owner holds the key now) ...
	waitUntil(t, ctx, "A's wait to renew its entry", func() bool { return len(queued(t, table, "k")) == 1 })
	// ... and gives up.
	acancel()
	if r := <-waiting; r.Err == nil {
		r.Lease.Release(ctx)
		t.Fatal("the waiting Acquire got a second lease of a key its Locker holds")
	}
	it := readLockItem(t, table, "k")
	if _, released := it["releasedAt"]; released || strAttr(it, "owner") != a.Owner() || numAttr(it, "version") != lease.Token() {
		t.Fatalf("after the waiting Acquire gave up, the item is owner %q token %d released %v; want A's lease (token %d) intact",
			strAttr(it, "owner"), numAttr(it, "version"), released, lease.Token())
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

// TestHandoffForeignWaitersAttribute: a waiters attribute of another type,
// written by another program, does not stop a release (before: every
// release gave up with an error blaming a race): the release frees the
// key and removes the attribute. A wait on such an item declines.
func TestHandoffForeignWaitersAttribute(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	st := handoffStore(t, table)
	c := newClient(t)
	for name, v := range map[string]types.AttributeValue{
		"string": nS("junk"), "number": nN(7), "list": &types.AttributeValueMemberL{Value: []types.AttributeValue{nS("x")}},
		"null": &types.AttributeValueMemberNULL{Value: true},
	} {
		rec, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Minute)
		if err != nil || !ok {
			t.Fatal(name, ok, err)
		}
		if _, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: &table, Key: map[string]types.AttributeValue{"pk": nS("LOCK#h:lock:k"), "sk": nS("METADATA")},
			UpdateExpression:          aws.String("SET #w = :v"),
			ExpressionAttributeNames:  map[string]string{"#w": "waiters"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": v},
		}); err != nil {
			t.Fatal(err)
		}
		again, err := st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "waiter", time.Minute)
		if err != nil || again {
			t.Errorf("%s: WaitLock on an item with a foreign waiters attribute: %v, %v; want it to decline", name, again, err)
		}
		if ok, err := st.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
			t.Fatalf("%s: release with a foreign waiters attribute: %v, %v", name, ok, err)
		}
		it := readLockItem(t, table, "k")
		if _, released := it["releasedAt"]; !released {
			t.Errorf("%s: not released", name)
		}
		if _, left := it["waiters"]; left {
			t.Errorf("%s: the foreign waiters attribute is still there", name)
		}
	}
}

// TestHandoffWaitBadInput: WaitLock refuses an owner or key the store's
// lock operations refuse, with ErrInvalidKey, before queueing (before, a
// release handed the key to an owner whose Acquire was then refused).
func TestHandoffWaitBadInput(t *testing.T) {
	table := testTable(t)
	w := handoffStore(t, table).Driver().(driver.LockWaiter)
	for _, c := range []struct{ key, owner string }{
		{"k", "a\x00b"}, {"k", strings.Repeat("o", 2000)}, {"k", ""}, {"", "o"}, {strings.Repeat("k", 600), "o"},
	} {
		again, err := w.WaitLock(t.Context(), c.key, c.owner, time.Second)
		if again || !errors.Is(err, warden.ErrInvalidKey) {
			t.Errorf("WaitLock(%.20q, %.20q) = %v, %v; want ErrInvalidKey", c.key, c.owner, again, err)
		}
	}
	if q := queued(t, table, "k"); len(q) != 0 {
		t.Errorf("queue %v", q)
	}
}

// TestHandoffNodeItemDeclines: an item of the go-go-scope layout (no
// expiresAtMs) takes no queue: WaitLock declines, and while that holding
// lasts later waits decline without a request (before: five requests per
// wait, each of the lock package's retries).
func TestHandoffNodeItemDeclines(t *testing.T) {
	ctx := t.Context()
	table := testTable(t)
	var n atomic.Int64 // UpdateItem and GetItem requests (the watcher's Queries aside)
	st := handoffStore(t, table, countOp("UpdateItem", &n), countOp("GetItem", &n))
	_, err := newClient(t).PutItem(ctx, &dynamodb.PutItemInput{TableName: &table, Item: map[string]types.AttributeValue{
		"pk": nS("LOCK#h:lock:k"), "sk": nS("METADATA"), "owner": nS("node"), "version": nN(1),
		"expiresAt": nN(time.Now().Add(time.Hour).Unix()),
	}})
	if err != nil {
		t.Fatal(err)
	}
	w := st.Driver().(driver.LockWaiter)
	for i, want := range []int64{3, 0} {
		n.Store(0)
		again, err := w.WaitLock(ctx, "k", "waiter", time.Minute)
		if err != nil || again {
			t.Fatalf("wait %d on a go-go-scope holding: %v, %v; want it to decline", i, again, err)
		}
		if got := n.Load(); got > want {
			t.Errorf("wait %d on a go-go-scope holding: %d requests, want at most %d", i, got, want)
		}
	}
	if _, ok := readLockItem(t, table, "k")["waiters"]; ok {
		t.Error("a queue was written into a go-go-scope item")
	}
}

// TestHandoffCloseWaitsForEntryWrite: Close while a wait's queue entry is
// being written. Close refuses new entries, waits for the write in flight
// (up to 1 s), then takes its owners out of the queues: no entry is left
// to be handed the key after the store is gone (before, an entry written
// after Close's removal stayed, and a release handed it the key: 2 s
// lost).
func TestHandoffCloseWaitsForEntryWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	holder := handoffStore(t, table)
	if _, ok, err := holder.Locks().Acquire(ctx, "k", "holder", time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	blockJoin := func(st *middleware.Stack) error {
		return st.Initialize.Add(middleware.InitializeMiddlewareFunc("block-join",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if u, ok := in.Parameters.(*dynamodb.UpdateItemInput); ok && strings.HasPrefix(aws.ToString(u.UpdateExpression), "SET #waiters") {
					once.Do(func() {
						close(entered)
						<-gate // until Close refuses new entries
					})
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	}
	st, err := dynamo.New(newClient(t, blockJoin), table, &dynamo.Options{Prefix: "h:"})
	if err != nil {
		t.Fatal(err)
	}
	dynamo.SetCloseHook(st, func() { close(gate) })
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "closing", time.Minute)
	}()
	<-entered
	st.Close()
	<-waited
	if q := queued(t, table, "k"); len(q) != 0 {
		t.Errorf("queue %v after Close: an entry of the closed store stays to be handed the key", q)
	}
}

// exprLimit refuses, as DynamoDB does (4 KB per expression; dynalite does
// not check), an UpdateItem whose update or condition expression is
// longer than 4096 bytes.
func exprLimit(st *middleware.Stack) error {
	return st.Initialize.Add(middleware.InitializeMiddlewareFunc("expr-limit",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if u, ok := in.Parameters.(*dynamodb.UpdateItemInput); ok {
				for _, e := range []*string{u.UpdateExpression, u.ConditionExpression} {
					if n := len(aws.ToString(e)); n > 4096 {
						return middleware.InitializeOutput{}, middleware.Metadata{}, fmt.Errorf("ValidationException: expression of %d bytes exceeds 4096", n)
					}
				}
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
}

// TestHandoffManyLapsedEntries: 300 dead waiters' entries (lapsed) and two
// live ones. The release hands the key to the first live waiter and
// removes 50 lapsed entries, not all of them: an expression naming 300
// would pass the 4 KB DynamoDB allows (before: every release failed there
// and the holder kept the key until its TTL). A waiter's renewal removes
// up to 8 more.
func TestHandoffManyLapsedEntries(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	table := testTable(t)
	st := handoffStore(t, table, exprLimit)
	rec, ok, err := st.Locks().Acquire(ctx, "k", "holder", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	now := time.Now().UnixMilli()
	m := map[string]types.AttributeValue{}
	for i := range 300 {
		m[fmt.Sprintf("dead-%04d#0123456789ab", i)] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"a": nN(now - 10_000 + int64(i)), "u": nN(now - 5_000)}}
	}
	for i := range 2 {
		m[fmt.Sprintf("live-%d", i)] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"a": nN(now + int64(i)), "u": nN(now + 600_000)}}
	}
	if _, err := newClient(t).UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &table, Key: map[string]types.AttributeValue{"pk": nS("LOCK#h:lock:k"), "sk": nS("METADATA")},
		UpdateExpression:          aws.String("SET #w = :m"),
		ExpressionAttributeNames:  map[string]string{"#w": "waiters"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: m}},
	}); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.Locks().Release(ctx, "k", "holder", rec.Token); err != nil || !ok {
		t.Fatalf("release with 300 lapsed entries queued: %v, %v", ok, err)
	}
	if o := strAttr(readLockItem(t, table, "k"), "owner"); o != "live-0" {
		t.Fatalf("key handed to %q, want live-0", o)
	}
	if n := len(queued(t, table, "k")); n != 302-1-50 {
		t.Errorf("%d entries left after the release, want %d (the handed one and 50 lapsed removed)", n, 302-1-50)
	}
	// A waiter's renewal removes 8 of the lapsed entries it read.
	type waited struct {
		again bool
		err   error
	}
	ended := make(chan waited, 1)
	go func() {
		again, err := st.Driver().(driver.LockWaiter).WaitLock(ctx, "k", "renewing", 5*time.Second)
		ended <- waited{again, err}
	}()
	for n := len(queued(t, table, "k")); n > 302-1-50+1-8; n = len(queued(t, table, "k")) {
		select {
		case w := <-ended:
			t.Fatalf("the wait ended (%v, %v) with %d entries queued, before a renewal removed lapsed ones", w.again, w.err, n)
		case <-ctx.Done():
			t.Fatalf("%d entries queued: no renewal removed lapsed ones", n)
		case <-time.After(5 * time.Millisecond): // polling interval, not a synchronisation
		}
	}
}
