package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// recordsClaimIndex is the index the harness's Claim filter (status, by
// rank then id) reads.
var recordsClaimIndex = bson.D{{Key: "status", Value: 1}, {Key: "rank", Value: 1}, {Key: "_id", Value: 1}}

// recordsDB is the process's database for the record-lock harness: the
// harness runs in the suite's child processes too, without a *testing.T.
var recordsDB = sync.OnceValues(func() (*mongodrv.Database, error) {
	raw := os.Getenv("WARDEN_TEST_MONGODB_URL")
	if raw == "" {
		return nil, errors.New("WARDEN_TEST_MONGODB_URL is not set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	db := q.Get("database")
	q.Del("database")
	u.RawQuery = q.Encode()
	if db == "" {
		db = strings.TrimPrefix(u.Path, "/")
	}
	if db == "" {
		db = testDatabase
	}
	client, err := mongodrv.Connect(options.Client().ApplyURI(u.String()))
	if err != nil {
		return nil, err
	}
	return client.Database(db), nil
})

func recordsColl(table string) (*mongodrv.Collection, error) {
	db, err := recordsDB()
	if err != nil {
		return nil, err
	}
	return db.Collection(table), nil
}

// recordID is the id of the harness's row n.
func recordID(n int) any { return fmt.Sprintf("rec-%06d", n) }

// recordHarness is the conformance harness of mongo.Records.
var recordHarness = recordlocktest.Harness[mongo.RecordFilter]{
	Name: "mongodb",
	// The test server (FerretDB behind the write-serialising proxy) runs
	// each claim alone and reads the whole collection for it: 8 workers
	// drain 1 000 records in about four minutes there.
	Timeout: 10 * time.Minute,
	Create: func(ctx context.Context, table string, rows []recordlocktest.Row) error {
		c, err := recordsColl(table)
		if err != nil {
			return err
		}
		if err := c.Drop(ctx); err != nil {
			return err
		}
		docs := make([]any, len(rows))
		for i, r := range rows {
			docs[i] = bson.D{{Key: "_id", Value: recordID(r.N)}, {Key: "status", Value: r.Status},
				{Key: "rank", Value: r.Rank}, {Key: "note", Value: r.Note}}
		}
		if len(docs) > 0 {
			if _, err := c.InsertMany(ctx, docs); err != nil {
				return err
			}
		}
		rt, err := mongo.Records(c, &mongo.RecordOptions{ClaimIndex: recordsClaimIndex})
		if err != nil {
			return err
		}
		return rt.Migrate(ctx)
	},
	Drop: func(ctx context.Context, table string) error {
		c, err := recordsColl(table)
		if err != nil {
			return err
		}
		return c.Drop(ctx)
	},
	Open: func(_ context.Context, table string) (driver.Records[mongo.RecordFilter], func(), error) {
		c, err := recordsColl(table)
		if err != nil {
			return nil, nil, err
		}
		rt, err := mongo.Records(c, &mongo.RecordOptions{ClaimIndex: recordsClaimIndex})
		if err != nil {
			return nil, nil, err
		}
		return rt, func() {}, nil
	},
	ID: recordID,
	Read: func(ctx context.Context, table string, id any) (recordlocktest.Row, bool, error) {
		c, err := recordsColl(table)
		if err != nil {
			return recordlocktest.Row{}, false, err
		}
		var d struct {
			Status string `bson:"status"`
			Rank   int    `bson:"rank"`
			Note   string `bson:"note"`
		}
		err = c.FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}}).Decode(&d)
		if errors.Is(err, mongodrv.ErrNoDocuments) {
			return recordlocktest.Row{}, false, nil
		}
		return recordlocktest.Row{Status: d.Status, Rank: d.Rank, Note: d.Note}, err == nil, err
	},
	SetNote: func(ctx context.Context, table string, id any, note string) error {
		c, err := recordsColl(table)
		if err != nil {
			return err
		}
		_, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "note", Value: note}}}})
		return err
	},
	Count: func(ctx context.Context, table string) (int, error) {
		c, err := recordsColl(table)
		if err != nil {
			return 0, err
		}
		n, err := c.CountDocuments(ctx, bson.D{})
		return int(n), err
	},
	ByStatus: byStatus,
	HostileIDs: []any{
		"$where", "rec-000001' || '1'=='1", ".*", "^rec", "rec-%", `{"$ne": null}`, "this.status == 'todo'",
		bson.D{{Key: "$ne", Value: nil}}, bson.D{{Key: "$gt", Value: ""}}, bson.D{{Key: "$exists", Value: true}},
		bson.D{{Key: "$regex", Value: "^rec"}}, bson.D{{Key: "$in", Value: bson.A{"rec-000001", "rec-000002"}}},
		bson.D{{Key: "$where", Value: "true"}},
	},
}

// byStatus is the harness's Claim filter: status equal to a value (under
// $eq, so that a document value is a value), by rank then id.
func byStatus(status string) mongo.RecordFilter {
	return mongo.RecordFilter{
		Filter: bson.D{{Key: "status", Value: bson.D{{Key: "$eq", Value: status}}}},
		Sort:   bson.D{{Key: "rank", Value: 1}, {Key: "_id", Value: 1}},
	}
}

// TestRecordsConformance runs the record-lock conformance suite on
// mongo.Records.
func TestRecordsConformance(t *testing.T) {
	serverURL(t, "")
	recordlocktest.Run(t, recordHarness)
}

// newRecords makes a collection of its own for a test (dropped when it
// ends), holding docs, on a client with co's options, and a driver over it.
func newRecords(t *testing.T, co *options.ClientOptions, opts *mongo.RecordOptions, docs ...any) (*mongo.RecordTable, *mongodrv.Collection) {
	t.Helper()
	db := testDB(t, co)
	name := fmt.Sprintf("records_%s_%d", strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_")), time.Now().UnixNano())
	c := db.Collection(name)
	t.Cleanup(func() { _ = c.Drop(context.Background()) })
	if len(docs) > 0 {
		if _, err := c.InsertMany(t.Context(), docs); err != nil {
			t.Fatal(err)
		}
	}
	rt, err := mongo.Records(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rt, c
}

// rawDoc reads a document as the database holds it.
func rawDoc(t *testing.T, c *mongodrv.Collection, id any) bson.M {
	t.Helper()
	var m bson.M
	if err := c.FindOne(context.Background(), bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}}).Decode(&m); err != nil {
		t.Fatalf("reading %v: %v", id, err)
	}
	return m
}

// expire moves record id's expiry into the past, as time passing would:
// the tests never sleep through a holding.
func expire(t *testing.T, c *mongodrv.Collection, field string, id any) {
	t.Helper()
	res, err := c.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: field, Value: time.Now().Add(-time.Second)}}}})
	if err != nil || res.MatchedCount != 1 {
		t.Fatalf("expire %v: %v (matched %d)", id, err, res.MatchedCount)
	}
}

func doc(id any, status string, rank int) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "status", Value: status}, {Key: "rank", Value: rank}, {Key: "note", Value: "n"}}
}

// TestRecordsLockExtendRelease: Lock, Extend, Release and ForceRelease
// act only on the holding they are given (holder, token, expiry), keep the
// token across releases, and time the expiry from the clock of the
// operation to the millisecond.
func TestRecordsLockExtendRelease(t *testing.T) {
	rt, c := newRecords(t, nil, nil, doc("a", "todo", 1))
	ctx := t.Context()
	d := 90*time.Second + 1500*time.Microsecond // rounded up to whole ms

	rec, found, ok, err := rt.Lock(ctx, "a", "alice", d)
	if err != nil || !found || !ok {
		t.Fatalf("Lock: found %v ok %v err %v", found, ok, err)
	}
	if rec.Owner != "alice" || rec.Token != 1 || rec.ID != "a" || rec.Until.Sub(rec.Now) != 90*time.Second+2*time.Millisecond || !rec.Live() {
		t.Errorf("Lock: %+v; want alice, token 1, until now+90.002s", rec)
	}
	if rec.Now.Location() != time.UTC || rec.Now.Nanosecond()%int(time.Millisecond) != 0 {
		t.Errorf("Lock: Now %v, want UTC milliseconds", rec.Now)
	}
	if u, ok := rawDoc(t, c, "a")["lockedUntil"].(bson.DateTime); !ok || u.Time().UTC() != rec.Until {
		t.Errorf("stored lockedUntil %#v, want the BSON date %v", rawDoc(t, c, "a")["lockedUntil"], rec.Until)
	}

	for _, owner := range []string{"bob", "alice"} { // not reentrant
		got, found, ok, err := rt.Lock(ctx, "a", owner, d)
		if err != nil || !found || ok || got.Owner != "alice" || got.Token != 1 || got.Until != rec.Until || !got.Live() {
			t.Errorf("Lock by %s of a held record: %+v found %v ok %v err %v; want refused, naming alice's holding", owner, got, found, ok, err)
		}
	}

	for _, x := range []struct {
		owner string
		token int64
	}{{"bob", 1}, {"alice", 2}, {"alice", 0}} {
		if got, found, ok, err := rt.Extend(ctx, "a", x.owner, x.token, time.Hour); err != nil || !found || ok || got.Until != rec.Until {
			t.Errorf("Extend(%s, %d) of alice's token 1: %+v found %v ok %v err %v; want refused, expiry unchanged", x.owner, x.token, got, found, ok, err)
		}
		if ok, err := rt.Release(ctx, "a", x.owner, x.token); err != nil || ok {
			t.Errorf("Release(%s, %d) of alice's token 1: ok %v err %v; want refused", x.owner, x.token, ok, err)
		}
	}
	ext, found, ok, err := rt.Extend(ctx, "a", "alice", 1, time.Hour)
	if err != nil || !found || !ok || ext.Until.Sub(ext.Now) != time.Hour || ext.Token != 1 || ext.Owner != "alice" {
		t.Errorf("Extend of the holding: %+v found %v ok %v err %v", ext, found, ok, err)
	}

	if ok, err := rt.Release(ctx, "a", "alice", 1); err != nil || !ok {
		t.Fatalf("Release: ok %v err %v", ok, err)
	}
	if ok, err := rt.Release(ctx, "a", "alice", 1); err != nil || ok {
		t.Errorf("second Release: ok %v err %v; want not held", ok, err)
	}
	got, found, err := rt.Get(ctx, "a")
	if err != nil || !found || got.Owner != "" || !got.Until.IsZero() || got.Token != 1 || got.Live() {
		t.Errorf("Get after Release: %+v found %v err %v; want no holder, no expiry, token 1", got, found, err)
	}
	m := rawDoc(t, c, "a")
	if _, has := m["lockedBy"]; has {
		t.Errorf("lockedBy kept after release: %v", m)
	}
	if _, has := m["lockedUntil"]; has {
		t.Errorf("lockedUntil kept after release: %v", m)
	}
	if m["lockToken"] != int64(1) {
		t.Errorf("lockToken %#v after release, want int64(1)", m["lockToken"])
	}
	if _, _, ok, _ := rt.Extend(ctx, "a", "alice", 1, time.Hour); ok {
		t.Error("Extend of a released holding succeeded")
	}

	// Bob's turn; an operator force-releases it.
	rec, _, ok, err = rt.Lock(ctx, "a", "bob", time.Minute)
	if err != nil || !ok || rec.Token != 2 {
		t.Fatalf("Lock after release: %+v ok %v err %v; want token 2", rec, ok, err)
	}
	was, found, err := rt.ForceRelease(ctx, "a")
	if err != nil || !found || was.Owner != "bob" || was.Token != 2 || was.Until != rec.Until {
		t.Errorf("ForceRelease: %+v found %v err %v; want bob's holding", was, found, err)
	}
	if ok, err := rt.Release(ctx, "a", "bob", 2); err != nil || ok {
		t.Errorf("Release of a force-released holding: ok %v err %v; want not held", ok, err)
	}
	if got, _, err := rt.Get(ctx, "a"); err != nil || got.Owner != "" || got.Token != 2 {
		t.Errorf("Get after ForceRelease: %+v err %v", got, err)
	}

	// An expired holding: refused to Extend, released by its holder,
	// taken by anyone at once.
	if _, _, ok, err := rt.Lock(ctx, "a", "carol", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	expire(t, c, "lockedUntil", "a")
	if got, _, ok, err := rt.Extend(ctx, "a", "carol", 3, time.Hour); err != nil || ok || got.Live() {
		t.Errorf("Extend of an expired holding: %+v ok %v err %v; want refused", got, ok, err)
	}
	if ok, err := rt.Release(ctx, "a", "carol", 3); err != nil || !ok {
		t.Errorf("Release of its expired holding by the holder: ok %v err %v; want released", ok, err)
	}
	if _, _, ok, err := rt.Lock(ctx, "a", "dave", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	expire(t, c, "lockedUntil", "a")
	rec, _, ok, err = rt.Lock(ctx, "a", "erin", time.Hour)
	if err != nil || !ok || rec.Owner != "erin" || rec.Token != 5 {
		t.Errorf("Lock of an expired holding: %+v ok %v err %v; want erin with token 5", rec, ok, err)
	}
	if ok, err := rt.Release(ctx, "a", "dave", 4); err != nil || ok {
		t.Errorf("the expired holder's Release after a takeover: ok %v err %v; want refused", ok, err)
	}
}

// TestRecordsMissingID: no operation on an id no document has creates a
// document (no upsert) or reports one.
func TestRecordsMissingID(t *testing.T) {
	rt, c := newRecords(t, nil, nil, doc("a", "todo", 1))
	ctx := t.Context()
	for _, id := range []any{"b", "A", "a ", int64(1), bson.D{{Key: "_id", Value: "a"}}} {
		if rec, found, ok, err := rt.Lock(ctx, id, "o", time.Minute); err != nil || found || ok {
			t.Errorf("Lock(%v): %+v found %v ok %v err %v; want not found", id, rec, found, ok, err)
		}
		if _, found, ok, err := rt.Extend(ctx, id, "o", 1, time.Minute); err != nil || found || ok {
			t.Errorf("Extend(%v): found %v ok %v err %v", id, found, ok, err)
		}
		if ok, err := rt.Release(ctx, id, "o", 1); err != nil || ok {
			t.Errorf("Release(%v): ok %v err %v", id, ok, err)
		}
		if _, found, err := rt.ForceRelease(ctx, id); err != nil || found {
			t.Errorf("ForceRelease(%v): found %v err %v", id, found, err)
		}
		if _, found, err := rt.Get(ctx, id); err != nil || found {
			t.Errorf("Get(%v): found %v err %v", id, found, err)
		}
	}
	if n, err := c.CountDocuments(ctx, bson.D{}); err != nil || n != 1 {
		t.Errorf("%d documents (%v), want the 1 inserted", n, err)
	}
	if m := rawDoc(t, c, "a"); len(m) != 4 {
		t.Errorf("document a written: %v", m)
	}
}

// TestRecordsUserFieldsUntouched: lock, extend and release write only the
// lock fields; a field another program edits during the lock keeps its
// edit, and the others their values (nested and typed ones included).
func TestRecordsUserFieldsUntouched(t *testing.T) {
	created := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	user := bson.D{{Key: "_id", Value: "a"}, {Key: "status", Value: "todo"}, {Key: "rank", Value: int32(3)},
		{Key: "note", Value: "before"}, {Key: "createdAt", Value: created},
		{Key: "payload", Value: bson.D{{Key: "n", Value: int64(7)}, {Key: "tags", Value: bson.A{"x", "y"}}}}}
	rt, c := newRecords(t, nil, nil, user)
	ctx := t.Context()
	rec, _, ok, err := rt.Lock(ctx, "a", "alice", time.Minute)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "note", Value: "edited"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := rt.Extend(ctx, "a", "alice", rec.Token, time.Minute); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, ok, err := rt.Lock(ctx, "a", "bob", time.Minute); err != nil || ok {
		t.Fatal(ok, err)
	}
	if ok, err := rt.Release(ctx, "a", "alice", rec.Token); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, _, err := rt.ForceRelease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	var got bson.D
	if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(user)
	want[3].Value = "edited"
	want = append(want, bson.E{Key: "lockToken", Value: int64(1)})
	gotJ, _ := bson.MarshalExtJSON(got, true, false)
	wantJ, _ := bson.MarshalExtJSON(want, true, false)
	if string(gotJ) != string(wantJ) {
		t.Errorf("document after lock, edit, extend, refused lock, release, force release:\n got %s\nwant %s", gotJ, wantJ)
	}
}

// TestRecordsHostileIDs: an id is a value. A document id whose keys are
// operators matches only a document with that very id; a string that
// reads like a query or pattern matches only that string; bson.M is
// refused before any I/O (its field order is random).
func TestRecordsHostileIDs(t *testing.T) {
	docs := []any{doc("a", "todo", 1), doc("b", "todo", 2), doc("$where", "todo", 3),
		doc(bson.D{{Key: "k", Value: 1}, {Key: "j", Value: "z"}}, "todo", 4)}
	rt, c := newRecords(t, nil, nil, docs...)
	ctx := t.Context()
	for _, id := range []any{
		bson.D{{Key: "$ne", Value: nil}}, bson.D{{Key: "$gt", Value: ""}}, bson.D{{Key: "$exists", Value: true}},
		bson.D{{Key: "$regex", Value: "."}}, bson.D{{Key: "$in", Value: bson.A{"a", "b"}}},
		bson.D{{Key: "j", Value: "z"}, {Key: "k", Value: 1}}, // another field order: another value
		".*", "^a", "a' || '1'=='1", "this._id == 'a'",
	} {
		if rec, found, ok, err := rt.Lock(ctx, id, "mallory", time.Minute); err != nil || found || ok {
			t.Errorf("Lock(%v): %+v found %v ok %v err %v; want not found", id, rec, found, ok, err)
		}
	}
	for _, id := range []any{bson.M{"$ne": nil}, map[string]any{"$gt": ""}, bson.A{"a"}, []string{"a"}, nil,
		bson.Regex{Pattern: "."}, 1.5, true, "", strings.Repeat("a", 513)} {
		if err := rt.CheckID(id); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("CheckID(%#v): %v; want ErrInvalidArgument", id, err)
		}
		if _, _, _, err := rt.Lock(ctx, id, "mallory", time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%#v): %v; want ErrInvalidArgument", id, err)
		} else if len(err.Error()) > 200 {
			t.Errorf("Lock(%T): error of %d bytes, want the id cut short", id, len(err.Error()))
		}
	}
	if live, err := rt.List(ctx, 10); err != nil || len(live) != 0 {
		t.Errorf("after hostile ids, live locks %+v (%v); want none", live, err)
	}
	// The ids that look like operators lock their own documents only.
	for _, id := range []any{"$where", bson.D{{Key: "k", Value: 1}, {Key: "j", Value: "z"}}} {
		rec, found, ok, err := rt.Lock(ctx, id, "owner", time.Minute)
		if err != nil || !found || !ok || fmt.Sprint(rec.ID) != fmt.Sprint(id) {
			t.Errorf("Lock(%v): %+v found %v ok %v err %v; want that document locked", id, rec, found, ok, err)
		}
	}
	if n, err := c.CountDocuments(ctx, bson.D{{Key: "lockedBy", Value: bson.D{{Key: "$exists", Value: true}}}}); err != nil || n != 2 {
		t.Errorf("%d documents locked (%v), want 2", n, err)
	}
}

// TestRecordsHostileFilter: a filter value that is a document of
// operators, under $eq, is a value: it matches nothing.
func TestRecordsHostileFilter(t *testing.T) {
	rt, _ := newRecords(t, nil, nil, doc("a", "todo", 1), doc("b", "done", 2))
	ctx := t.Context()
	for _, v := range []any{bson.M{"$ne": ""}, bson.D{{Key: "$gt", Value: ""}}, bson.D{{Key: "$regex", Value: "."}}, ".*", "todo|done"} {
		f := mongo.RecordFilter{Filter: bson.D{{Key: "status", Value: bson.D{{Key: "$eq", Value: v}}}}}
		if rec, ok, err := rt.Claim(ctx, f, "mallory", time.Minute); err != nil || ok {
			t.Errorf("Claim(status $eq %v): %+v claimed %v err %v; want nothing", v, rec, ok, err)
		}
	}
	if live, err := rt.List(ctx, 10); err != nil || len(live) != 0 {
		t.Errorf("after hostile filters, live locks %+v (%v); want none", live, err)
	}
}

// TestRecordsClaimOrderAndFilter: Claim takes the unlocked records that
// match, in the filter's sort (default: id), and nothing else.
func TestRecordsClaimOrderAndFilter(t *testing.T) {
	rt, _ := newRecords(t, nil, &mongo.RecordOptions{ClaimIndex: recordsClaimIndex},
		doc("a", "todo", 3), doc("b", "done", 0), doc("c", "todo", 1), doc("d", "todo", 2), doc("e", "todo", 1))
	ctx := t.Context()
	if _, _, ok, err := rt.Lock(ctx, "c", "x", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	var got []any
	for {
		rec, ok, err := rt.Claim(ctx, byStatus("todo"), "w", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if rec.Owner != "w" || rec.Token != 1 || !rec.Live() {
			t.Errorf("claimed %+v", rec)
		}
		got = append(got, rec.ID)
	}
	if want := []any{"e", "d", "a"}; !slices.Equal(got, want) {
		t.Errorf("claimed %v, want %v (todo, unlocked, by rank then id)", got, want)
	}
	rt2, _ := newRecords(t, nil, nil, doc("z", "todo", 0), doc("y", "todo", 0), doc("x", "todo", 0))
	rec, ok, err := rt2.Claim(ctx, mongo.RecordFilter{}, "w", time.Hour)
	if err != nil || !ok || rec.ID != "x" {
		t.Errorf("Claim with no filter or sort: %+v ok %v err %v; want the least id, x", rec, ok, err)
	}
	rec, ok, err = rt2.Claim(ctx, mongo.RecordFilter{Filter: bson.D{}, Sort: bson.D{{Key: "_id", Value: -1}}}, "w", time.Hour)
	if err != nil || !ok || rec.ID != "z" {
		t.Errorf("Claim with an empty filter, by id descending: %+v ok %v err %v; want z", rec, ok, err)
	}
}

// TestRecordsExpiredClaimableAtOnce: a record whose lock expired is
// claimed (and locked) at once, with the next token.
func TestRecordsExpiredClaimableAtOnce(t *testing.T) {
	rt, c := newRecords(t, nil, nil, doc("a", "todo", 1), doc("b", "done", 1))
	ctx := t.Context()
	if _, _, ok, err := rt.Lock(ctx, "a", "old", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if _, ok, err := rt.Claim(ctx, byStatus("todo"), "new", time.Hour); err != nil || ok {
		t.Fatalf("Claim of a held record: ok %v err %v", ok, err)
	}
	expire(t, c, "lockedUntil", "a")
	rec, ok, err := rt.Claim(ctx, byStatus("todo"), "new", time.Hour)
	if err != nil || !ok || rec.ID != "a" || rec.Owner != "new" || rec.Token != 2 {
		t.Errorf("Claim after expiry: %+v ok %v err %v; want a, new, token 2", rec, ok, err)
	}
	// A holder without an expiry (written by another program) holds
	// nothing.
	if _, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "b"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "lockedBy", Value: "ghost"}}}}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := rt.Get(ctx, "b"); got.Live() {
		t.Errorf("a holder without expiry reads live: %+v", got)
	}
	if rec, _, ok, err := rt.Lock(ctx, "b", "new", time.Hour); err != nil || !ok || rec.Token != 1 {
		t.Errorf("Lock of a record with a holder but no expiry: %+v ok %v err %v", rec, ok, err)
	}
}

// TestRecordsTokensIncrease: concurrent lock/release cycles get tokens
// 1, 2, 3, … each once, in the order of the holdings.
func TestRecordsTokensIncrease(t *testing.T) {
	rt, _ := newRecords(t, nil, nil, doc("a", "todo", 1))
	ctx := t.Context()
	const workers, rounds = 8, 10
	var inside atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			owner := fmt.Sprint("w", w)
			for done := 0; done < rounds; {
				rec, _, ok, err := rt.Lock(ctx, "a", owner, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					continue
				}
				if inside.Add(1) != 1 {
					t.Error("two holders at once")
				}
				mu.Lock()
				tokens = append(tokens, rec.Token)
				mu.Unlock()
				inside.Add(-1)
				if ok, err := rt.Release(ctx, "a", owner, rec.Token); err != nil || !ok {
					t.Errorf("Release: %v %v", ok, err)
					return
				}
				done++
			}
		})
	}
	wg.Wait()
	for i, tok := range tokens {
		if tok != int64(i+1) {
			t.Fatalf("tokens in holding order: %v; want 1, 2, 3, …", tokens)
		}
	}
	if len(tokens) != workers*rounds {
		t.Errorf("%d holdings, want %d", len(tokens), workers*rounds)
	}
}

// TestRecordsLockRaceRetried: a Lock that misses a holding which ends
// before its read (released in between) tries again instead of reporting
// a refusal by nobody; one that loses that race on every attempt gives up
// with ErrBusy, deciding nothing.
func TestRecordsLockRaceRetried(t *testing.T) {
	var hook atomic.Pointer[func(cmd string)]
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if f := hook.Load(); f != nil {
			(*f)(e.CommandName)
		}
	}}
	rt, c := newRecords(t, options.Client().SetMonitor(mon), nil, doc("a", "todo", 1))
	ctx := t.Context()
	other, err := mongo.Records(testDB(t, nil).Collection(c.Name()), nil) // a client without the hook
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok, err := other.Lock(ctx, "a", "x", time.Hour); err != nil || !ok {
		t.Fatal(ok, err)
	}
	releaseOnRead := func(cmd string) {
		if cmd == "find" {
			if _, _, err := other.ForceRelease(ctx, "a"); err != nil {
				t.Error(err)
			}
		}
	}
	hook.Store(&releaseOnRead)
	rec, found, ok, err := rt.Lock(ctx, "a", "y", time.Hour)
	hook.Store(nil)
	if err != nil || !found || !ok || rec.Owner != "y" || rec.Token != 2 {
		t.Errorf("Lock racing a release: %+v found %v ok %v err %v; want acquired with token 2", rec, found, ok, err)
	}

	// Every attempt loses: locked before each update, released before
	// each read.
	if _, _, err := other.ForceRelease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	var tries atomic.Int32
	flip := func(cmd string) {
		switch cmd {
		case "findAndModify":
			tries.Add(1)
			if _, _, ok, err := other.Lock(ctx, "a", "x", time.Hour); err != nil || !ok {
				t.Error("hook lock", ok, err)
			}
		case "find":
			if _, _, err := other.ForceRelease(ctx, "a"); err != nil {
				t.Error(err)
			}
		}
	}
	hook.Store(&flip)
	_, _, ok, err = rt.Lock(ctx, "a", "y", time.Hour)
	hook.Store(nil)
	if !errors.Is(err, mongo.ErrBusy) || ok || !strings.Contains(err.Error(), "100 attempts") {
		t.Errorf("Lock losing every race: ok %v err %v; want ErrBusy after 100 attempts", ok, err)
	}
	if tries.Load() != 100 {
		t.Errorf("%d attempts, want 100", tries.Load())
	}
}

// TestRecordsCommands: every call is the documented number of commands
// (round trips); writes carry majority write concern and reads primary
// with majority read concern, whatever the collection's client asks
// for; no write is an upsert.
func TestRecordsCommands(t *testing.T) {
	var mu sync.Mutex
	var sent []bson.Raw
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "ping" || e.CommandName == "endSessions" {
			return
		}
		mu.Lock()
		sent = append(sent, slices.Clone(e.Command))
		mu.Unlock()
	}}
	co := options.Client().SetMonitor(mon).SetReadPreference(readpref.SecondaryPreferred()).SetWriteConcern(writeconcern.W1())
	rt, _ := newRecords(t, co, nil, doc("a", "todo", 1), doc("b", "todo", 2))
	ctx := t.Context()
	count := func(name string, want int, f func()) {
		t.Helper()
		mu.Lock()
		sent = nil
		mu.Unlock()
		f()
		mu.Lock()
		defer mu.Unlock()
		if len(sent) != want {
			t.Errorf("%s: %d commands, want %d", name, len(sent), want)
		}
		for _, cmd := range sent {
			if cmd.Index(0).Key() == "find" {
				if rc, err := cmd.LookupErr("readConcern", "level"); err != nil || rc.String() != `"majority"` {
					t.Errorf("%s: find without majority read concern: %s", name, cmd)
				}
				if rp, err := cmd.LookupErr("$readPreference", "mode"); err == nil && rp.String() != `"primary"` {
					t.Errorf("%s: find reads %s", name, rp)
				}
				continue
			}
			if w, err := cmd.LookupErr("writeConcern", "w"); err != nil || w.String() != `"majority"` {
				t.Errorf("%s: %s without majority write concern: %s", name, cmd.Index(0).Key(), cmd)
			}
			if u, err := cmd.LookupErr("upsert"); err == nil && u.Boolean() {
				t.Errorf("%s: an upsert: %s", name, cmd)
			}
			if s := cmd.String(); strings.Contains(s, `"upsert":true`) {
				t.Errorf("%s: an upsert: %s", name, s)
			}
		}
	}
	var tok int64
	count("Lock", 1, func() {
		rec, _, _, _ := rt.Lock(ctx, "a", "o", time.Minute)
		tok = rec.Token
	})
	count("Lock of a held record", 2, func() { _, _, _, _ = rt.Lock(ctx, "a", "p", time.Minute) })
	count("Lock of a missing record", 2, func() { _, _, _, _ = rt.Lock(ctx, "zz", "p", time.Minute) })
	count("Extend", 1, func() { _, _, _, _ = rt.Extend(ctx, "a", "o", tok, time.Minute) })
	count("Extend refused", 2, func() { _, _, _, _ = rt.Extend(ctx, "a", "p", tok, time.Minute) })
	count("Get", 1, func() { _, _, _ = rt.Get(ctx, "a") })
	count("List", 1, func() { _, _ = rt.List(ctx, 10) })
	count("Release", 1, func() { _, _ = rt.Release(ctx, "a", "o", tok) })
	count("Claim", 1, func() { _, _, _ = rt.Claim(ctx, byStatus("todo"), "o", time.Minute) })
	count("Claim of nothing", 1, func() { _, _, _ = rt.Claim(ctx, byStatus("none"), "o", time.Minute) })
	count("ForceRelease", 1, func() { _, _, _ = rt.ForceRelease(ctx, "a") })
}

// TestRecordsList: List returns the live locks only, in id order, at most
// limit.
func TestRecordsList(t *testing.T) {
	rt, c := newRecords(t, nil, nil, doc("e", "t", 0), doc("d", "t", 0), doc("c", "t", 0), doc("b", "t", 0), doc("a", "t", 0))
	ctx := t.Context()
	for _, id := range []string{"e", "c", "a", "b"} {
		if _, _, ok, err := rt.Lock(ctx, id, "o-"+id, time.Hour); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	expire(t, c, "lockedUntil", "b")
	got, err := rt.List(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []any
	for _, r := range got {
		ids = append(ids, r.ID)
		if r.Owner != "o-"+r.ID.(string) || !r.Live() || r.Token != 1 {
			t.Errorf("List: %+v", r)
		}
	}
	if want := []any{"a", "c", "e"}; !slices.Equal(ids, want) {
		t.Errorf("List: %v, want %v", ids, want)
	}
	if got, err := rt.List(ctx, 2); err != nil || len(got) != 2 || got[1].ID != "c" {
		t.Errorf("List(2): %+v %v", got, err)
	}
	if _, err := rt.List(ctx, 0); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("List(0): %v", err)
	}
}

// TestRecordsOptions: field names are checked; other names (nested ones
// included) and another id field are used as given.
func TestRecordsOptions(t *testing.T) {
	c := testDB(t, nil).Collection("records_options_unused")
	for _, o := range []mongo.RecordOptions{
		{UntilField: "$until"}, {OwnerField: "a..b"}, {TokenField: "x.$y"}, {IDField: "."},
		{OwnerField: "lockToken"}, {UntilField: "lock", OwnerField: "lock.by"}, {IDField: "lockedBy"},
		{ClaimIndex: bson.D{{Key: "$x", Value: 1}}},
	} {
		if _, err := mongo.Records(c, &o); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(%+v): %v; want ErrInvalidArgument", o, err)
		}
	}
	if _, err := mongo.Records(nil, nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Records(nil): %v", err)
	}

	o := &mongo.RecordOptions{IDField: "sku", UntilField: "lock.until", OwnerField: "lock.by", TokenField: "fence"}
	rt, coll := newRecords(t, nil, o,
		bson.D{{Key: "_id", Value: 1}, {Key: "sku", Value: "S-2"}}, bson.D{{Key: "_id", Value: 2}, {Key: "sku", Value: "S-1"}})
	ctx := t.Context()
	rec, found, ok, err := rt.Lock(ctx, "S-2", "o", time.Minute)
	if err != nil || !found || !ok || rec.ID != "S-2" || rec.Token != 1 {
		t.Fatalf("Lock by sku: %+v found %v ok %v err %v", rec, found, ok, err)
	}
	var m struct {
		Lock struct {
			Until time.Time `bson:"until"`
			By    string    `bson:"by"`
		} `bson:"lock"`
		Fence int64 `bson:"fence"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&m); err != nil || m.Lock.By != "o" || !m.Lock.Until.Equal(rec.Until) || m.Fence != 1 {
		t.Errorf("stored %+v (%v); want the lock in lock.by, lock.until and fence", m, err)
	}
	if got, _, err := rt.Get(ctx, "S-2"); err != nil || got.Owner != "o" || got.ID != "S-2" || !got.Live() {
		t.Errorf("Get: %+v %v", got, err)
	}
	if c, ok, err := rt.Claim(ctx, mongo.RecordFilter{}, "w", time.Minute); err != nil || !ok || c.ID != "S-1" {
		t.Errorf("Claim: %+v %v %v; want S-1 (by sku)", c, ok, err)
	}
	if ok, err := rt.Release(ctx, "S-2", "o", 1); err != nil || !ok {
		t.Errorf("Release: %v %v", ok, err)
	}
}

// TestRecordsMigrate: Migrate creates the expiry index and the claim
// index, again without harm; Migration prints the same.
func TestRecordsMigrate(t *testing.T) {
	rt, c := newRecords(t, nil, &mongo.RecordOptions{ClaimIndex: recordsClaimIndex}, doc("a", "t", 0))
	ctx := t.Context()
	if err := rt.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	specs, err := c.Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if want := []string{"_id_", "lockedUntil_1", "status_1_rank_1__id_1"}; !slices.Equal(names, want) {
		t.Errorf("indexes %v, want %v", names, want)
	}
	want := fmt.Sprintf("db.getCollection(%q).createIndex({\"lockedUntil\":1})\ndb.getCollection(%q).createIndex({\"status\":1,\"rank\":1,\"_id\":1})\n", c.Name(), c.Name())
	if got := rt.Migration(); got != want {
		t.Errorf("Migration:\n%s\nwant\n%s", got, want)
	}
}
