package mongo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// Default lock fields of Records.
const (
	DefaultRecordIDField    = "_id"
	DefaultRecordUntilField = "lockedUntil"
	DefaultRecordOwnerField = "lockedBy"
	DefaultRecordTokenField = "lockToken"
)

// RecordOptions configure Records. The zero value (or nil) uses the
// default field names.
type RecordOptions struct {
	// IDField is the field that identifies a record. "": "_id". Another
	// field must hold unique values (give it a unique index): Lock
	// changes the one document it finds by it.
	IDField string
	// UntilField holds the lock's expiry, a BSON date (milliseconds).
	// "": "lockedUntil".
	UntilField string
	// OwnerField holds the holder, a string. "": "lockedBy".
	OwnerField string
	// TokenField holds the last fencing token issued for the record, a
	// 64-bit integer. "": "lockToken".
	TokenField string
	// ClaimIndex are the keys of an index for Claim that Migrate creates
	// besides the one on UntilField: the fields your Claim filters test
	// for equality, then the fields of their sort, for example
	// bson.D{{Key: "status", Value: 1}, {Key: "priority", Value: -1},
	// {Key: "_id", Value: 1}}. nil: none (index your filters yourself).
	ClaimIndex bson.D
}

// RecordFilter is Claim's filter on MongoDB: a query over the collection's
// own fields and the order in which matching records are claimed. Values
// in it are the program's: write {status: {$eq: v}} rather than
// {status: v} when v comes from outside, so that a document value cannot
// act as an operator.
type RecordFilter struct {
	// Filter is a query document (bson.D, bson.M, …). nil matches every
	// record.
	Filter any
	// Sort is a sort document (bson.D). nil: the id field, ascending.
	Sort any
}

// RecordTable is the record-lock driver on one MongoDB collection (see
// Records). Its methods are safe for concurrent use.
type RecordTable struct {
	coll                       *mongo.Collection
	id, until, owner, token    string
	idPath, untilPath, ownPath []string
	tokPath                    []string
	claimIndex                 bson.D
	proj                       bson.D
	tries                      int
}

var _ driver.Records[RecordFilter] = (*RecordTable)(nil)

// Records returns the record-lock driver of package recordlock on coll,
// the program's own collection: the lock of a document lives in three of
// its fields (see RecordOptions) and no other field is ever written; no
// document is ever inserted or deleted.
//
// Every call is one findOneAndUpdate, updateOne or find on the document's
// id ({id: {$eq: id}}), written with majority write concern and read from
// the primary with majority read concern, whatever coll's own options say
// (a lock granted must survive a failover; a read must see the write that
// won). A Lock or Extend that does not match costs a second round trip (a
// find by id) to tell a locked record from a missing one; Claim is one
// findOneAndUpdate with the filter's sort.
//
// The clock is the client's (UTC, milliseconds): MongoDB can read its own
// clock ($$NOW) only in aggregation-pipeline updates, which
// MongoDB-compatible servers such as FerretDB 1.x do not implement, and
// the store takes the same code path on every server. The clocks of the
// machines locking one collection must agree to well within the lock
// durations (NTP keeps them within milliseconds).
//
// Ids: non-empty UTF-8 strings and binary values of at most 512 bytes,
// int, int32, int64, bson.ObjectID, and documents as bson.D (compared by
// value, in field order). A document id is compared with $eq, so one
// whose keys look like operators ({$ne: null}) matches only a document
// whose id is that very value. bson.M and maps are refused (their field
// order, part of a document's value, is random), as are arrays, regular
// expressions, floats and nil.
func Records(coll *mongo.Collection, opts *RecordOptions) (*RecordTable, error) {
	if coll == nil {
		return nil, fmt.Errorf("mongo: Records: nil collection: %w", warden.ErrInvalidArgument)
	}
	var o RecordOptions
	if opts != nil {
		o = *opts
	}
	t := &RecordTable{id: o.IDField, until: o.UntilField, owner: o.OwnerField, token: o.TokenField, tries: retryLimit}
	for _, f := range []struct {
		p   *string
		def string
	}{
		{&t.id, DefaultRecordIDField}, {&t.until, DefaultRecordUntilField},
		{&t.owner, DefaultRecordOwnerField}, {&t.token, DefaultRecordTokenField},
	} {
		if *f.p == "" {
			*f.p = f.def
		}
		if err := checkFieldPath(*f.p); err != nil {
			return nil, err
		}
	}
	names := []string{t.id, t.until, t.owner, t.token}
	for i, a := range names {
		for _, b := range names[i+1:] {
			if a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(b, a+".") {
				return nil, fmt.Errorf("mongo: Records: the fields %q and %q overlap: %w", a, b, warden.ErrInvalidArgument)
			}
		}
	}
	for _, k := range o.ClaimIndex {
		if err := checkFieldPath(k.Key); err != nil {
			return nil, fmt.Errorf("mongo: Records: ClaimIndex: %w", err)
		}
	}
	t.idPath, t.untilPath = strings.Split(t.id, "."), strings.Split(t.until, ".")
	t.ownPath, t.tokPath = strings.Split(t.owner, "."), strings.Split(t.token, ".")
	t.claimIndex = o.ClaimIndex
	t.proj = bson.D{{Key: t.id, Value: 1}, {Key: t.until, Value: 1}, {Key: t.owner, Value: 1}, {Key: t.token, Value: 1}}
	if t.id != "_id" {
		t.proj = append(t.proj, bson.E{Key: "_id", Value: 0})
	}
	t.coll = coll.Clone(options.Collection().SetReadPreference(readpref.Primary()).
		SetReadConcern(readconcern.Majority()).SetWriteConcern(writeconcern.Majority()))
	return t, nil
}

// checkFieldPath refuses a field name that is empty, has an empty or
// $-prefixed part, or holds NUL.
func checkFieldPath(f string) error {
	for _, p := range strings.Split(f, ".") {
		if p == "" || strings.HasPrefix(p, "$") || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
			return fmt.Errorf("mongo: Records: %q is not a field name (empty, an empty or $-prefixed part, or NUL): %w", f, warden.ErrInvalidArgument)
		}
	}
	return nil
}

// Backend returns "mongodb".
func (t *RecordTable) Backend() string { return "mongodb" }

// Table returns the collection's name.
func (t *RecordTable) Table() string { return t.coll.Name() }

// CheckID accepts the id types listed on Records.
func (t *RecordTable) CheckID(id any) error {
	bad := func(why string) error {
		return fmt.Errorf("mongo: record id %s: %s: %w", shortID(id), why, warden.ErrInvalidArgument)
	}
	switch v := id.(type) {
	case string:
		if v == "" || len(v) > driver.MaxKeyBytes || !utf8.ValidString(v) {
			return bad(fmt.Sprintf("empty, over %d bytes or not UTF-8", driver.MaxKeyBytes))
		}
	case int, int32, int64, bson.ObjectID:
	case bson.Binary:
		if len(v.Data) == 0 || len(v.Data) > driver.MaxKeyBytes {
			return bad(fmt.Sprintf("empty or over %d bytes", driver.MaxKeyBytes))
		}
	case bson.D:
		b, err := bson.Marshal(v)
		if err != nil {
			return bad("not a BSON document: " + err.Error())
		}
		if len(b) > driver.MaxKeyBytes {
			return bad(fmt.Sprintf("over %d bytes as BSON", driver.MaxKeyBytes))
		}
	case nil:
		return bad("nil")
	case bson.M, map[string]any:
		return bad(fmt.Sprintf("%T is unordered: give a document id as bson.D", id))
	default:
		return bad(fmt.Sprintf("type %T: ids are strings, int, int32, int64, bson.ObjectID, bson.Binary or bson.D", id))
	}
	return nil
}

// shortID formats an id for messages, cut short.
func shortID(id any) string {
	var s string
	switch v := id.(type) {
	case string:
		s = fmt.Sprintf("%q", v)
	case bson.D, bson.M, map[string]any:
		if b, err := bson.MarshalExtJSON(v, false, false); err == nil {
			s = string(b)
		} else {
			s = fmt.Sprintf("%v", v)
		}
	default:
		s = fmt.Sprintf("%v", id)
	}
	if len(s) > 64 {
		s = s[:61] + "..."
	}
	return s
}

// byID is the filter of the record id, compared as a value.
func (t *RecordTable) byID(id any) bson.D {
	return bson.D{{Key: t.id, Value: bson.D{{Key: "$eq", Value: id}}}}
}

// unlocked is the condition of a record without a live lock at now: no
// holder, or an expiry that is not a date after now (missing, null,
// passed).
func (t *RecordTable) unlocked(now time.Time) bson.E {
	return bson.E{Key: "$or", Value: bson.A{
		bson.D{{Key: t.owner, Value: bson.D{{Key: "$in", Value: bson.A{nil, ""}}}}},
		bson.D{{Key: t.until, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: now}}}}}},
	}}
}

// take is the update that locks a record for owner until until.
func (t *RecordTable) take(owner string, until time.Time) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: t.owner, Value: owner}, {Key: t.until, Value: until}}},
		{Key: "$inc", Value: bson.D{{Key: t.token, Value: int64(1)}}},
	}
}

// clear is the update that ends a holding, keeping the token.
func (t *RecordTable) clear() bson.D {
	return bson.D{{Key: "$unset", Value: bson.D{{Key: t.owner, Value: ""}, {Key: t.until, Value: ""}}}}
}

// state reads the lock fields of a returned document. A holder that is
// not a string is shown as its extended JSON; an expiry that is not a date
// reads as none (the record is then not locked, as the filters see it).
func (t *RecordTable) state(doc bson.Raw, now time.Time) driver.RecordLock {
	rec := driver.RecordLock{Now: now}
	if v, err := doc.LookupErr(t.idPath...); err == nil {
		var id any
		if v.Unmarshal(&id) == nil {
			rec.ID = id
		}
	}
	if v, err := doc.LookupErr(t.ownPath...); err == nil && v.Type != bson.TypeNull && v.Type != bson.TypeUndefined {
		if s, ok := v.StringValueOK(); ok {
			rec.Owner = s
		} else {
			rec.Owner = v.String()
		}
	}
	if v, err := doc.LookupErr(t.untilPath...); err == nil {
		if ms, ok := v.DateTimeOK(); ok {
			rec.Until = time.UnixMilli(ms).UTC()
		}
	}
	if v, err := doc.LookupErr(t.tokPath...); err == nil {
		if n, ok := v.AsInt64OK(); ok {
			rec.Token = n
		}
	}
	return rec
}

// fail wraps a driver error with the operation and id.
func (t *RecordTable) fail(ctx context.Context, op string, id any, err error) error {
	what := t.coll.Name()
	if id != nil {
		what += " " + shortID(id)
	}
	return fmt.Errorf("mongo: %s record %s: %w", op, what, ctxErr(ctx, err))
}

func checkDuration(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("mongo: lock duration %v: must be positive: %w", d, warden.ErrInvalidArgument)
	}
	return nil
}

// after returns the document as the update left it. No projection:
// FerretDB does not implement findAndModify's "fields", and the store
// sends the same commands to every server.
func afterUpdate() *options.FindOneAndUpdateOptionsBuilder {
	return options.FindOneAndUpdate().SetReturnDocument(options.After)
}

// Lock implements driver.Records: one findOneAndUpdate of {id: {$eq: id}}
// and no live lock, which sets the holder and the expiry and increments
// the token; never an upsert. When it matches nothing, a find by id tells
// a missing record (found false) from a locked one (its holding
// returned). If that find sees the record unlocked (released or expired
// in between), the lock is tried again, up to 100 times before giving up
// with an error (ErrBusy).
func (t *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	if err := t.CheckID(id); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	if err := checkDuration(d); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	for range t.tries {
		n := now()
		filter := append(t.byID(id), t.unlocked(n))
		doc, err := t.coll.FindOneAndUpdate(ctx, filter, t.take(owner, after(n, d)), afterUpdate()).Raw()
		if err == nil {
			return t.state(doc, n), true, true, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return driver.RecordLock{}, false, false, t.fail(ctx, "locking", id, err)
		}
		rec, found, err := t.Get(ctx, id)
		if err != nil || !found {
			return driver.RecordLock{}, found, false, err
		}
		if rec.Live() {
			return rec, true, false, nil
		}
		// Released or expired since the update: try again.
	}
	return driver.RecordLock{}, true, false, &busyError{op: "locking record in " + t.coll.Name(), key: shortID(id), tries: t.tries}
}

// Extend implements driver.Records: one findOneAndUpdate of the live
// holding (holder, token, expiry after now) setting the expiry; a miss
// reads the record (a second round trip) to return its state.
func (t *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	if err := t.CheckID(id); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	if err := checkDuration(d); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	n := now()
	filter := append(t.byID(id),
		bson.E{Key: t.owner, Value: bson.D{{Key: "$eq", Value: owner}}},
		bson.E{Key: t.token, Value: bson.D{{Key: "$eq", Value: token}}},
		bson.E{Key: t.until, Value: bson.D{{Key: "$gt", Value: n}}})
	// $max: an extension never moves the expiry earlier, even one that
	// reaches the server after a later, longer one.
	update := bson.D{{Key: "$max", Value: bson.D{{Key: t.until, Value: after(n, d)}}}}
	doc, err := t.coll.FindOneAndUpdate(ctx, filter, update, afterUpdate()).Raw()
	if err == nil {
		return t.state(doc, n), true, true, nil
	}
	if !errors.Is(err, mongo.ErrNoDocuments) {
		return driver.RecordLock{}, false, false, t.fail(ctx, "extending the lock of", id, err)
	}
	rec, found, err := t.Get(ctx, id)
	return rec, found, false, err
}

// Release implements driver.Records: one updateOne of the holding
// (holder, token), expired or not, removing the holder and expiry fields;
// the token stays.
func (t *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	if err := t.CheckID(id); err != nil {
		return false, err
	}
	filter := append(t.byID(id),
		bson.E{Key: t.owner, Value: bson.D{{Key: "$eq", Value: owner}}},
		bson.E{Key: t.token, Value: bson.D{{Key: "$eq", Value: token}}})
	res, err := t.coll.UpdateOne(ctx, filter, t.clear())
	if err != nil {
		return false, t.fail(ctx, "releasing the lock of", id, err)
	}
	return res.MatchedCount == 1, nil
}

// ForceRelease implements driver.Records: one findOneAndUpdate by id
// removing the holder and expiry fields, returning the state it cleared.
func (t *RecordTable) ForceRelease(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	if err := t.CheckID(id); err != nil {
		return driver.RecordLock{}, false, err
	}
	n := now()
	doc, err := t.coll.FindOneAndUpdate(ctx, t.byID(id), t.clear(),
		options.FindOneAndUpdate().SetReturnDocument(options.Before)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.RecordLock{}, false, nil
	}
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "force-releasing", id, err)
	}
	return t.state(doc, n), true, nil
}

// Get implements driver.Records: one find by id, projected on the id and
// the lock fields.
func (t *RecordTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	if err := t.CheckID(id); err != nil {
		return driver.RecordLock{}, false, err
	}
	n := now()
	doc, err := t.coll.FindOne(ctx, t.byID(id), options.FindOne().SetProjection(t.proj)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.RecordLock{}, false, nil
	}
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "reading the lock of", id, err)
	}
	return t.state(doc, n), true, nil
}

// Claim implements driver.Records: one findOneAndUpdate of {$and:
// [filter, no live lock]} with the filter's sort (default: the id field
// ascending), locking the first match as Lock does. MongoDB applies it to
// one document atomically, so two claims never take the same record. It
// reads the index of the filter and sort (see RecordOptions.ClaimIndex),
// passing over the records locked at the front of that order.
func (t *RecordTable) Claim(ctx context.Context, f RecordFilter, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	if err := checkDuration(d); err != nil {
		return driver.RecordLock{}, false, err
	}
	n := now()
	filter := bson.D{t.unlocked(n)}
	if f.Filter != nil {
		filter = bson.D{{Key: "$and", Value: bson.A{f.Filter, filter}}}
	}
	var sort any = bson.D{{Key: t.id, Value: 1}}
	if f.Sort != nil {
		sort = f.Sort
	}
	doc, err := t.coll.FindOneAndUpdate(ctx, filter, t.take(owner, after(n, d)), afterUpdate().SetSort(sort)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.RecordLock{}, false, nil
	}
	if err != nil {
		return driver.RecordLock{}, false, t.fail(ctx, "claiming a", nil, err)
	}
	return t.state(doc, n), true, nil
}

// List implements driver.Records: one find of the live locks (a holder and
// an expiry after now) in id order, projected on the lock fields.
func (t *RecordTable) List(ctx context.Context, limit int) ([]driver.RecordLock, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("mongo: List: limit %d: must be positive: %w", limit, warden.ErrInvalidArgument)
	}
	n := now()
	filter := bson.D{
		{Key: t.owner, Value: bson.D{{Key: "$nin", Value: bson.A{nil, ""}}}},
		{Key: t.until, Value: bson.D{{Key: "$gt", Value: n}}},
	}
	cur, err := t.coll.Find(ctx, filter, options.Find().SetProjection(t.proj).
		SetSort(bson.D{{Key: t.id, Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, t.fail(ctx, "listing the locked", nil, err)
	}
	defer cur.Close(ctx)
	var out []driver.RecordLock
	for cur.Next(ctx) {
		out = append(out, t.state(cur.Current, n))
	}
	if err := cur.Err(); err != nil {
		return nil, t.fail(ctx, "listing the locked", nil, err)
	}
	return out, nil
}

// indexes are the indexes Migrate creates: the expiry field (List, and
// expired locks), then ClaimIndex if set.
func (t *RecordTable) indexes() []bson.D {
	ix := []bson.D{{{Key: t.until, Value: 1}}}
	if len(t.claimIndex) > 0 {
		ix = append(ix, t.claimIndex)
	}
	return ix
}

// Migrate creates the indexes record locks use, under MongoDB's default
// names: one on the expiry field, and RecordOptions.ClaimIndex. MongoDB
// needs no field added: a document without lock fields is unlocked. It is
// idempotent; keys already indexed under another name or with other
// options are left as they are.
func (t *RecordTable) Migrate(ctx context.Context) error {
	for _, keys := range t.indexes() {
		_, err := t.coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: keys})
		if err != nil && serverCode(err) != codeIndexOptionsConflict {
			return fmt.Errorf("mongo: creating the index %v on %s: %w", keyJSON(keys), t.coll.Name(), ctxErr(ctx, err))
		}
	}
	return nil
}

// Migration returns the mongosh commands Migrate runs, one a line.
func (t *RecordTable) Migration() string {
	name, _ := json.Marshal(t.coll.Name())
	var b strings.Builder
	for _, keys := range t.indexes() {
		fmt.Fprintf(&b, "db.getCollection(%s).createIndex(%s)\n", name, keyJSON(keys))
	}
	return b.String()
}

// keyJSON writes index keys as a shell document.
func keyJSON(keys bson.D) string {
	b, err := bson.MarshalExtJSON(keys, false, false)
	if err != nil {
		return fmt.Sprintf("%v", keys)
	}
	return string(b)
}
