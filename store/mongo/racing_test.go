package mongo_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
)

// racePair is two stores of one namespace: a, whose client goes through a
// wire double, and b, on a client of its own (the other writer of a race).
type racePair struct {
	a, b   *warden.Store
	w      *wire
	db     *mongodrv.Database // b's database
	prefix string
	ns     string // database.collection of the locks

	mu    sync.Mutex
	trace []string // a's commands on the document raced for, in order
}

func newRacePair(t *testing.T) *racePair {
	t.Helper()
	adb, w := needWire(t, nil)
	p := &racePair{w: w, db: testDB(t, nil), prefix: fmt.Sprintf("race-%d:", time.Now().UnixNano())}
	var err error
	if p.a, err = mongo.New(adb, &mongo.Options{Prefix: p.prefix}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close() })
	if p.b, err = mongo.New(p.db, &mongo.Options{Prefix: p.prefix}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.b.Close() })
	cleanNamespace(t, p.prefix, mongo.Collections{})
	p.ns = p.db.Name() + "." + mongo.DefaultLocksCollection
	return p
}

// note records one of a's commands on _id id of collection coll, by a
// short name: "upsert", "cas" (a findAndModify without upsert that
// compares the token), "renew", "read" (a find by _id), "foreign" (a
// find by key), or the command's name.
func (p *racePair) note(c wireCmd, coll, id string) {
	if c.Coll != coll {
		return
	}
	name := c.Name
	switch {
	case c.upsertOn(coll, id):
		name = "upsert"
	case c.Name == "findAndModify":
		if got, _ := c.docID(0); got != id {
			return
		}
		if _, ok := c.Body.Lookup("query", "owner").StringValueOK(); ok {
			name = "renew"
		} else {
			name = "cas"
		}
	case c.Name == "find":
		f, _ := c.Body.Lookup("filter").DocumentOK()
		switch {
		case rawString(f.Lookup("_id")) == id:
			name = "read"
		case strings.Contains(f.String(), `"$or"`):
			name = "get"
		case f.Lookup("key").Type != 0:
			name = "foreign"
		default:
			return
		}
	default:
		if got, _ := c.docID(0); got != id {
			return
		}
	}
	p.mu.Lock()
	p.trace = append(p.trace, name)
	p.mu.Unlock()
}

func (p *racePair) steps() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.trace)
}

// TestAcquireLosesUpsertRace stages, through the wire double, the races a
// MongoDB acquire meets when another writer's upsert on the same _id wins:
// the loser's upsert is answered E11000 in MongoDB's words (the winner
// inserted between the loser's dispatch and its execution; with two
// upserts racing on an absent key MongoDB answers the loser so), and the
// loser's read then finds the winner holding, the winner gone again
// (released, or the document deleted), or no document yet (a winner whose
// insert the loser's read does not see yet). Each outcome must follow from
// the document as the read found it: never two holders, never a token at
// or below one handed out, never an error or a made-up holder.
func TestAcquireLosesUpsertRace(t *testing.T) {
	const key = "k"
	locks := mongo.DefaultLocksCollection

	// stage runs acquire a's upsert number n (from 1) through step.
	stage := func(p *racePair, id string, step func(n int, c wireCmd) wireStep) {
		n := 0
		p.w.setRoute(func(c wireCmd) wireStep {
			p.note(c, locks, id)
			if !c.upsertOn(locks, id) {
				return wireStep{}
			}
			n++
			return step(n, c)
		})
	}
	// dupAfter returns an after hook that checks the reply is MongoDB's
	// E11000 on _id and then runs f.
	dupAfter := func(t *testing.T, f func()) func(bson.Raw) {
		return func(r bson.Raw) {
			if !isDupReply(r) || !strings.Contains(r.Lookup("errmsg").StringValue(), "index: _id_ dup key") {
				t.Errorf("the staged upsert was answered %v, want E11000 on _id", r)
				return
			}
			if f != nil {
				f()
			}
		}
	}

	t.Run("WinnerHolds", func(t *testing.T) {
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		var won driver.LockRecord
		stage(p, id, func(n int, c wireCmd) wireStep {
			if n > 1 {
				return wireStep{}
			}
			return wireStep{before: func() { won = mustAcquire(t, p.b, key, "b") }, after: dupAfter(t, nil)}
		})
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if err != nil || ok {
			t.Fatalf("the loser: ok=%v err=%v, want not acquired", ok, err)
		}
		if rec.Owner != "b" || rec.Token != won.Token {
			t.Errorf("the loser was told the holder %q token %d, want b's holding (token %d)", rec.Owner, rec.Token, won.Token)
		}
		wantSteps(t, p, "upsert", "read")
	})

	t.Run("WinnerReleasesBeforeTheRead", func(t *testing.T) {
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		var won driver.LockRecord
		stage(p, id, func(n int, c wireCmd) wireStep {
			if n > 1 {
				return wireStep{}
			}
			return wireStep{
				before: func() { won = mustAcquire(t, p.b, key, "b") },
				after: dupAfter(t, func() {
					if ok, err := p.b.Driver().Locks().Release(t.Context(), key, "b", won.Token); err != nil || !ok {
						t.Errorf("the winner's release: ok=%v err=%v", ok, err)
					}
				}),
			}
		})
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("the loser, the lock released before its read: ok=%v err=%v, want acquired", ok, err)
		}
		// The stored token (the winner's) is above the loser's candidate,
		// taken before the winner's: the compare-and-swap goes above it.
		if rec.Owner != "a" || rec.Token <= won.Token {
			t.Errorf("the loser's holding: owner %q token %d, want a above %d", rec.Owner, rec.Token, won.Token)
		}
		wantSteps(t, p, "upsert", "read", "cas")
		checkHolder(t, p.b, key, rec)
	})

	t.Run("WinnerExpiresBeforeTheRead", func(t *testing.T) {
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		var won driver.LockRecord
		stage(p, id, func(n int, c wireCmd) wireStep {
			if n > 1 {
				return wireStep{}
			}
			return wireStep{
				before: func() {
					var ok bool
					var err error
					if won, ok, err = p.b.Driver().Locks().Acquire(t.Context(), key, "b", 5*time.Millisecond); err != nil || !ok {
						t.Errorf("the winner: ok=%v err=%v", ok, err)
					}
				},
				after: dupAfter(t, func() {
					// Until the holding has lapsed by the store's clock.
					for {
						if _, held, err := p.b.Driver().Locks().Get(t.Context(), key); err != nil || !held {
							return
						}
						time.Sleep(time.Millisecond)
					}
				}),
			}
		})
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("the loser, the winner's holding lapsed before its read: ok=%v err=%v, want acquired", ok, err)
		}
		if rec.Owner != "a" || rec.Token <= won.Token {
			t.Errorf("the loser's holding: owner %q token %d, want a above %d", rec.Owner, rec.Token, won.Token)
		}
		wantSteps(t, p, "upsert", "read", "cas")
		// The lapsed winner can no longer release the loser's holding.
		if ok, err := p.b.Driver().Locks().Release(t.Context(), key, "b", won.Token); err != nil || ok {
			t.Errorf("the lapsed winner released: ok=%v err=%v", ok, err)
		}
		checkHolder(t, p.b, key, rec)
	})

	t.Run("WinnerDeletedBeforeTheRead", func(t *testing.T) {
		// The document deleted between the collision and the read: the
		// go-go-scope adapter's forceRelease, or a purge.
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		var won driver.LockRecord
		stage(p, id, func(n int, c wireCmd) wireStep {
			if n > 1 {
				return wireStep{}
			}
			return wireStep{
				before: func() { won = mustAcquire(t, p.b, key, "b") },
				after: dupAfter(t, func() {
					if _, err := p.db.Collection(locks).DeleteOne(t.Context(), bson.D{{Key: "_id", Value: id}}); err != nil {
						t.Error(err)
					}
				}),
			}
		})
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if err != nil || !ok {
			t.Fatalf("the loser, the document deleted before its read: ok=%v err=%v, want acquired", ok, err)
		}
		if rec.Owner != "a" || rec.Token <= won.Token {
			t.Errorf("the loser's holding: owner %q token %d, want a above %d", rec.Owner, rec.Token, won.Token)
		}
		wantSteps(t, p, "upsert", "read", "foreign", "upsert")
		checkHolder(t, p.b, key, rec)
	})

	t.Run("WinnerNotVisibleYet", func(t *testing.T) {
		// A replica set's loser: its first upserts collide with a winner
		// whose insert its majority read does not see yet (the double
		// answers them as MongoDB does, without sending them); then the
		// winner's document is there for everyone.
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		const hidden = 3
		var won driver.LockRecord
		stage(p, id, func(n int, c wireCmd) wireStep {
			switch {
			case n <= hidden:
				return wireStep{answer: dupKeyReply(p.ns, id)}
			case n == hidden+1:
				return wireStep{before: func() { won = mustAcquire(t, p.b, key, "b") }, after: dupAfter(t, nil)}
			}
			return wireStep{}
		})
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if err != nil || ok {
			t.Fatalf("the loser: ok=%v err=%v, want not acquired", ok, err)
		}
		if rec.Owner != "b" || rec.Token != won.Token {
			t.Errorf("the loser was told the holder %q token %d, want b's holding (token %d)", rec.Owner, rec.Token, won.Token)
		}
		var want []string
		for range hidden {
			want = append(want, "upsert", "read", "foreign")
		}
		wantSteps(t, p, append(want, "upsert", "read")...)
	})

	t.Run("WinnerNeverVisible", func(t *testing.T) {
		// Every upsert collides and no read finds the document: the
		// acquire gives up, deciding nothing.
		p := newRacePair(t)
		id := p.prefix + "lock:" + key
		mongo.SetTries(p.a, 4)
		stage(p, id, func(n int, c wireCmd) wireStep { return wireStep{answer: dupKeyReply(p.ns, id)} })
		rec, ok, err := p.a.Driver().Locks().Acquire(t.Context(), key, "a", time.Minute)
		if !errors.Is(err, mongo.ErrBusy) || ok || rec != (driver.LockRecord{}) {
			t.Fatalf("an acquire whose every upsert collided with nothing it could read: ok=%v rec=%+v err=%v, want ErrBusy", ok, rec, err)
		}
		if !strings.Contains(err.Error(), `"k"`) || !strings.Contains(err.Error(), "4 attempts") {
			t.Errorf("the give-up %q does not name the key and the attempts", err)
		}
	})
}

// TestClaimLosesUpsertRace: an idempotency claim whose upsert another
// claimant's wins (E11000 in MongoDB's words) reads the winner's record:
// in progress by the winner, or completed with its result when the winner
// completed before the read.
func TestClaimLosesUpsertRace(t *testing.T) {
	coll := mongo.DefaultIdempotencyCollection
	for _, completes := range []bool{false, true} {
		t.Run(map[bool]string{false: "WinnerRuns", true: "WinnerCompletesBeforeTheRead"}[completes], func(t *testing.T) {
			p := newRacePair(t)
			id := p.prefix + "i"
			n := 0
			p.w.setRoute(func(c wireCmd) wireStep {
				if c.Coll != coll || (c.Name != "findAndModify" && c.Name != "findandmodify") || !c.upsertOn(coll, id) {
					return wireStep{}
				}
				if n++; n > 1 {
					return wireStep{}
				}
				return wireStep{
					before: func() {
						if _, o, err := p.b.Driver().Idempotency().Claim(t.Context(), "i", "b", time.Minute, "fp"); err != nil || o != driver.Claimed {
							t.Errorf("the winner's claim: %v %v", o, err)
						}
					},
					after: func(r bson.Raw) {
						if !isDupReply(r) {
							t.Errorf("the staged claim was answered %v, want E11000", r)
						}
						if completes {
							if ok, err := p.b.Driver().Idempotency().Complete(t.Context(), "i", "b", []byte("done"), time.Minute); err != nil || !ok {
								t.Errorf("the winner's Complete: ok=%v err=%v", ok, err)
							}
						}
					},
				}
			})
			rec, o, err := p.a.Driver().Idempotency().Claim(t.Context(), "i", "a", time.Minute, "fp")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case n != 1:
				t.Fatalf("%d claims staged, want 1", n)
			case !completes && (o != driver.InProgress || rec.Owner != "b"):
				t.Errorf("the loser: %v, owner %q; want in progress by b", o, rec.Owner)
			case completes && (o != driver.Completed || string(rec.Result) != "done"):
				t.Errorf("the loser: %v, result %q; want completed with b's result", o, rec.Result)
			}
		})
	}
}

func mustAcquire(t *testing.T, st *warden.Store, key, owner string) driver.LockRecord {
	t.Helper()
	rec, ok, err := st.Driver().Locks().Acquire(t.Context(), key, owner, time.Minute)
	if err != nil || !ok {
		t.Errorf("%s's acquire of %q: ok=%v err=%v", owner, key, ok, err)
	}
	return rec
}

// checkHolder checks that st reads want as key's holding.
func checkHolder(t *testing.T, st *warden.Store, key string, want driver.LockRecord) {
	t.Helper()
	got, held, err := st.Driver().Locks().Get(t.Context(), key)
	if err != nil || !held || got.Owner != want.Owner || got.Token != want.Token {
		t.Errorf("Get: held=%v %+v err=%v; want %+v", held, got, err, want)
	}
}

// wantSteps checks a's commands on the document raced for.
func wantSteps(t *testing.T, p *racePair, want ...string) {
	t.Helper()
	if got := p.steps(); !slices.Equal(got, want) {
		t.Errorf("the loser's steps: %v, want %v", got, want)
	}
}

// rawString is v's string, or "" if it is none.
func rawString(v bson.RawValue) string {
	s, _ := v.StringValueOK()
	return s
}
