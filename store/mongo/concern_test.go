package mongo_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// weakParams ask for what coordination state must never use: reads from
// a secondary, local read concern, unacknowledged-by-majority writes.
const weakParams = "readPreference=secondary&readConcernLevel=local&w=1"

// coordination are the roles whose collections hold coordination state.
var coordination = []string{"locks", "circuits", "idempotency", "checkpoints", "fences"}

// TestCoordinationConcernsByURL: a store opened by a URL asking for
// secondary reads, local read concern and w=1 still reads coordination
// state from the primary with majority read concern and writes it with
// majority write concern; the cache follows the URL.
func TestCoordinationConcernsByURL(t *testing.T) {
	st, err := mongo.Open(t.Context(), serverURL(t, fmt.Sprintf("concerns-%d:", time.Now().UnixNano()))+"&"+weakParams, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := mongo.Concerns(st)
	want := mongo.Concern{ReadPref: "primary", ReadConcern: "majority", WriteConcern: "majority"}
	for _, role := range coordination {
		if got[role] != want {
			t.Errorf("%s collection: %+v, want %+v whatever the URL says", role, got[role], want)
		}
	}
	if c := got["cache"]; c.ReadPref != "secondary" || c.ReadConcern != "local" || c.WriteConcern != "1" {
		t.Errorf("cache collection: %+v, want the URL's (secondary, local, 1)", c)
	}
}

// sentCommand is what a command said about where and how it reads and
// writes.
type sentCommand struct {
	name, coll          string
	readPref, readLevel string // "" when the command did not say
	w                   string
}

// TestCoordinationConcernsSent: on a database handle whose client asks
// for secondary reads, local read concern and w=1, the commands a store
// made by New sends for locks, idempotency keys and circuits — the read
// after a collision (E11000) and the read of a refused probe included —
// carry majority read concern (and no read preference but primary) and
// majority write concern; the cache's reads carry the client's.
func TestCoordinationConcernsSent(t *testing.T) {
	var mu sync.Mutex
	var sent []sentCommand
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c := sentCommand{name: e.CommandName}
		c.coll, _ = e.Command.Lookup(e.CommandName).StringValueOK()
		if rp, err := e.Command.LookupErr("$readPreference", "mode"); err == nil {
			c.readPref = rp.StringValue()
		}
		if rl, err := e.Command.LookupErr("readConcern", "level"); err == nil {
			c.readLevel = rl.StringValue()
		}
		if w, err := e.Command.LookupErr("writeConcern", "w"); err == nil {
			c.w = w.String()
		}
		mu.Lock()
		sent = append(sent, c)
		mu.Unlock()
	}}
	co := options.Client().SetMonitor(mon).SetReadPreference(readpref.Secondary()).
		SetReadConcern(readconcern.Local()).SetWriteConcern(writeconcern.W1())
	db := testDB(t, co)
	prefix := fmt.Sprintf("concerns-sent-%d:", time.Now().UnixNano())
	st, err := mongo.New(db, &mongo.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	d := st.Driver()
	mu.Lock()
	sent = nil
	mu.Unlock()

	if _, ok, err := d.Locks().Acquire(ctx, "k", "a", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire: ok=%v err=%v", ok, err)
	}
	if _, ok, err := d.Locks().Acquire(ctx, "k", "b", time.Minute); err != nil || ok {
		t.Fatalf("Acquire of a held lock: ok=%v err=%v", ok, err)
	}
	if _, _, err := d.Locks().Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Idempotency().Claim(ctx, "i", "a", time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	if _, o, err := d.Idempotency().Claim(ctx, "i", "b", time.Minute, ""); err != nil || o != driver.InProgress {
		t.Fatalf("Claim of a claimed key: outcome %v err=%v", o, err)
	}
	if _, err := d.Circuits().RecordFailure(ctx, "c", 1, driver.AnyGeneration); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.Circuits().TryProbe(ctx, "c", "p", time.Hour, time.Minute); err != nil || ok {
		t.Fatalf("TryProbe of a circuit open for an hour: ok=%v err=%v", ok, err)
	}
	if err := d.Cache().Set(ctx, "x", []byte("v"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Cache().Get(ctx, "x"); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	coord := map[string]bool{mongo.DefaultLocksCollection: true, mongo.DefaultIdempotencyCollection: true, mongo.DefaultCircuitsCollection: true}
	reads := map[string]int{}
	for _, c := range sent {
		if c.readPref != "" && c.readPref != "primary" && coord[c.coll] {
			t.Errorf("%s on %s sent read preference %q, want primary", c.name, c.coll, c.readPref)
		}
		switch {
		case coord[c.coll] && c.name == "find":
			reads[c.coll]++
			if c.readLevel != "majority" {
				t.Errorf("find on %s sent read concern %q, want majority", c.coll, c.readLevel)
			}
		case coord[c.coll] && (c.name == "insert" || c.name == "update" || c.name == "findAndModify" || c.name == "delete"):
			if c.w != `"majority"` {
				t.Errorf("%s on %s sent write concern w=%s, want \"majority\"", c.name, c.coll, c.w)
			}
		case c.coll == mongo.DefaultCacheCollection && c.name == "find":
			reads[c.coll]++
			if c.readLevel != "local" {
				t.Errorf("find on the cache sent read concern %q, want the client's (local)", c.readLevel)
			}
		}
	}
	// The reads this test is about did happen: the holder read after the
	// colliding acquire, the claim read after the colliding claim, the
	// circuit read after the refused probe, the cache read.
	for _, coll := range []string{mongo.DefaultLocksCollection, mongo.DefaultIdempotencyCollection, mongo.DefaultCircuitsCollection, mongo.DefaultCacheCollection} {
		if reads[coll] == 0 {
			t.Errorf("no find on %s was sent", coll)
		}
	}
}
