package mongo_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// giveUpTries is the attempts each retry loop makes in these tests.
const giveUpTries = 5

// TestGiveUp: a retry loop whose every attempt loses a race gives up with
// an error that says so — naming the operation's key and the number of
// attempts, wrapping ErrBusy — never with a made-up outcome (not
// acquired, in progress). Each loop's race is made to happen on every
// attempt, at the hook sites of the store (see SetRace).
func TestGiveUp(t *testing.T) {
	open := func(t *testing.T) (*warden.Store, string, *mongodrv.Database) {
		db := testDB(t, nil)
		prefix := fmt.Sprintf("giveup-%d:", time.Now().UnixNano())
		st, err := mongo.New(db, &mongo.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		cleanNamespace(t, prefix, mongo.Collections{})
		mongo.SetTries(st, giveUpTries)
		return st, prefix, db
	}
	t.Run("Locks.Acquire", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultLocksCollection)
		id := prefix + "lock:k"
		var attempts, renewals int
		token := driver.TokenBase(time.Now())
		mongo.SetRace(st, func(site string) {
			switch site {
			case "write": // the caller's own live holding is there as each attempt starts
				attempts++
				token++
				tm := time.Now().UTC()
				upsert(t, coll, id, bson.D{{Key: "key", Value: id}, {Key: "namespace", Value: prefix}, {Key: "owner", Value: "me"},
					{Key: "token", Value: token}, {Key: "acquiredAt", Value: tm}, {Key: "expiresAt", Value: tm.Add(time.Minute)},
					{Key: "released", Value: false}})
			case "renew": // and ends (force-released, purged) before the store renews it
				renewals++
				deleteID(t, coll, id)
			}
		})
		rec, ok, err := st.Driver().Locks().Acquire(t.Context(), "k", "me", time.Minute)
		checkGaveUp(t, err, "k", attempts)
		if ok || rec != (driver.LockRecord{}) {
			t.Errorf("a give-up returned acquired=%v and the record %+v, want false and none", ok, rec)
		}
		if renewals != giveUpTries {
			t.Errorf("%d renewals lost, want one per attempt (%d)", renewals, giveUpTries)
		}
	})
	t.Run("Idempotency.Claim", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultIdempotencyCollection)
		id := prefix + "i"
		var attempts, renewals int
		mongo.SetRace(st, func(site string) {
			switch site {
			case "write": // the caller's own live claim is there as each attempt starts
				attempts++
				tm := time.Now().UTC()
				upsert(t, coll, id, bson.D{{Key: "key", Value: id}, {Key: "namespace", Value: prefix},
					{Key: "status", Value: string(driver.IdemPending)}, {Key: "owner", Value: "me"},
					{Key: "createdAt", Value: tm}, {Key: "expiresAt", Value: tm.Add(time.Minute)}})
			case "renew": // and is gone before the store renews it
				renewals++
				deleteID(t, coll, id)
			}
		})
		rec, outcome, err := st.Driver().Idempotency().Claim(t.Context(), "i", "me", time.Minute, "")
		checkGaveUp(t, err, "i", attempts)
		if outcome != 0 || rec.Status != "" {
			t.Errorf("a give-up returned the outcome %v and the record %+v, want none", outcome, rec)
		}
		if renewals != giveUpTries {
			t.Errorf("%d renewals lost, want one per attempt (%d)", renewals, giveUpTries)
		}
	})
	t.Run("Circuits.RecordSuccess", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultCircuitsCollection)
		id := prefix + "circuit:c"
		steps := 0
		mongo.SetRace(st, func(site string) {
			if site != "step" {
				return
			}
			// Before each conditional step the circuit changes
			// state away from the one that step applies to. A
			// success's steps are tried in the order closed,
			// half-open, open: the circuit turns open under the
			// first, closed under the second, half-open under the
			// third.
			steps++
			state := [...]driver.CircuitState{driver.HalfOpen, driver.Open, driver.Closed}[steps%3]
			upsert(t, coll, id, bson.D{{Key: "key", Value: id}, {Key: "namespace", Value: prefix},
				{Key: "state", Value: string(state)}, {Key: "failureCount", Value: int64(0)}, {Key: "version", Value: int64(steps)}})
		})
		rec, err := st.Driver().Circuits().RecordSuccess(t.Context(), "c", driver.AnyGeneration)
		checkGaveUp(t, err, "c", steps/3)
		if rec != (driver.CircuitRecord{}) {
			t.Errorf("a give-up returned the record %+v, want none", rec)
		}
	})
	t.Run("Circuits.TryProbes", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultCircuitsCollection)
		id := prefix + "circuit:c"
		// A half-open circuit whose slots turn from live with one
		// free to lapsed and back before every grant the store
		// chose from its read: the chosen way never applies.
		slots := func(until time.Time) {
			upsert(t, coll, id, bson.D{{Key: "key", Value: id}, {Key: "namespace", Value: prefix},
				{Key: "state", Value: string(driver.HalfOpen)}, {Key: "probeOwner", Value: "p"},
				{Key: "probeUntil", Value: until}, {Key: "probes", Value: int64(1)}, {Key: "version", Value: int64(1)}})
		}
		slots(time.Now().Add(time.Hour))
		flips := 0
		mongo.SetRace(st, func(site string) {
			if site != "probe" {
				return
			}
			flips++
			if flips%2 == 1 {
				slots(time.Now().Add(-time.Hour))
			} else {
				slots(time.Now().Add(time.Hour))
			}
		})
		rec, granted, err := st.Driver().Circuits().TryProbes(t.Context(), "c", "q", time.Minute, time.Minute, 2)
		checkGaveUp(t, err, "c", flips)
		if granted || rec != (driver.CircuitRecord{}) {
			t.Errorf("a give-up returned granted=%v and the record %+v, want none", granted, rec)
		}
	})
	// Cache.Set and Idempotency.Set upsert by _id and retry on a
	// duplicate key. A document of another writer (go-go-scope's
	// adapter, say) holding the same key and namespace under another
	// _id collides with every attempt on the unique {key, namespace}
	// index.
	t.Run("Cache.Set", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultCacheCollection)
		upsert(t, coll, "foreign-"+prefix, bson.D{{Key: "key", Value: prefix + "cache:x"}, {Key: "namespace", Value: prefix}})
		attempts := 0
		mongo.SetRace(st, func(site string) { attempts++ })
		checkGaveUp(t, st.Driver().Cache().Set(t.Context(), "x", []byte("v"), time.Minute), "x", attempts)
	})
	t.Run("Idempotency.Set", func(t *testing.T) {
		st, prefix, db := open(t)
		coll := db.Collection(mongo.DefaultIdempotencyCollection)
		upsert(t, coll, "foreign-"+prefix, bson.D{{Key: "key", Value: prefix + "i"}, {Key: "namespace", Value: prefix}})
		attempts := 0
		mongo.SetRace(st, func(site string) { attempts++ })
		checkGaveUp(t, st.Driver().Idempotency().Set(t.Context(), "i", []byte("r"), time.Minute), "i", attempts)
	})
}

// checkGaveUp checks the error of an operation on key that gave up after
// giveUpTries attempts, of which the hook saw attempts.
func checkGaveUp(t *testing.T, err error, key string, attempts int) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("no error after %d lost attempts: the store made an outcome up", attempts)
	case !errors.Is(err, mongo.ErrBusy):
		t.Errorf("error %v does not wrap ErrBusy", err)
	case !strings.Contains(err.Error(), strconv.Quote(key)) || !strings.Contains(err.Error(), fmt.Sprintf("%d attempts", giveUpTries)):
		t.Errorf("error %q does not name the key %q and the %d attempts", err, key, giveUpTries)
	}
	if attempts != giveUpTries {
		t.Errorf("the hook saw %d attempts, want %d", attempts, giveUpTries)
	}
	t.Logf("%v", err)
}

func upsert(t *testing.T, c *mongodrv.Collection, id string, fields bson.D) {
	t.Helper()
	_, err := c.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: fields}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		t.Fatal(err)
	}
}

func deleteID(t *testing.T, c *mongodrv.Collection, id string) {
	t.Helper()
	if _, err := c.DeleteOne(t.Context(), bson.D{{Key: "_id", Value: id}}); err != nil {
		t.Fatal(err)
	}
}
