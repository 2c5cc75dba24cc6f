package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/warden-go/warden/store/mongo" // registers mongodb://
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// mongoEnv names the MongoDB server of the benchmarks (a real MongoDB, or
// the FerretDB test server of testenv/ferretdb), as in the tests; without
// it the mongodb cases are left out.
const mongoEnv = "WARDEN_TEST_MONGODB_URL"

// mongoDatabase is the database the benchmarks use when the URL names none.
const mongoDatabase = "warden_bench"

// mongoCases returns the MongoDB groups, measured on the server at base (a
// mongodb:// URL). Cases() includes them when WARDEN_TEST_MONGODB_URL is
// set.
func mongoCases(base string) []Case {
	return []Case{
		{Group: "mongodb lock cycle", Name: "raw findOneAndUpdate upsert + deleteOne (mongo-driver v2)", Baseline: true, Run: func(b *testing.B) { rawMongoCycle(b, base) }},
		{Group: "mongodb lock cycle", Name: "raw pair on a kept document shaped as warden's (unique key and key+namespace indexes, purgeAt index; release keeps it, key parked)", Run: func(b *testing.B) { rawMongoShapedCycle(b, base) }},
		{Group: "mongodb lock cycle", Name: "warden primitives Acquire + Release", Run: func(b *testing.B) { primitiveCycle(b, mongoURL(base)) }},
		{Group: "mongodb lock cycle", Name: "warden primitives Acquire + Release, events off", Run: func(b *testing.B) { primitiveCycle(b, mongoURL(base)+"&events=false") }},
		{Group: "mongodb lock cycle", Name: "lock.Locker TryAcquire + Release", Run: func(b *testing.B) { lockerCycle(b, mongoURL(base)) }},
		{Group: "mongodb cache get", Name: "raw findOne (mongo-driver v2)", Baseline: true, Run: func(b *testing.B) { rawMongoGet(b, base) }},
		{Group: "mongodb cache get", Name: "warden Cache().Get", Run: func(b *testing.B) { mongoCacheGet(b, mongoURL(base)) }},
		{Group: "lock hand-off (p50 µs, release → waiting Acquire on another connection)", Name: "mongodb (notifications: capped collection, tailable cursor)", Metric: HandoffMetric, Run: func(b *testing.B) { handoff(b, mongoURL(base)) }},
	}
}

var mongoRuns atomic.Int64

// mongoBase returns base with the benchmark database when it names none.
func mongoBase(base string) (*url.URL, string) {
	u, err := url.Parse(base)
	if err != nil {
		return &url.URL{Scheme: "mongodb", Host: "invalid"}, mongoDatabase
	}
	db := u.Query().Get("database")
	if db == "" && len(u.Path) > 1 {
		db = u.Path[1:]
	}
	if db == "" {
		db = mongoDatabase
		q := u.Query()
		q.Set("database", db)
		u.RawQuery = q.Encode()
	}
	return u, db
}

// mongoURL is base with the benchmark database and a namespace of the
// run's own.
func mongoURL(base string) string {
	u, _ := mongoBase(base)
	q := u.Query()
	q.Set("prefix", fmt.Sprintf("bench%d%d%d:", os.Getpid(), time.Now().UnixNano(), mongoRuns.Add(1)))
	u.RawQuery = q.Encode()
	return u.String()
}

// rawMongoColl connects with the driver's defaults and returns a
// collection of the benchmark database.
func rawMongoColl(b *testing.B, base, name string) *mongo.Collection {
	b.Helper()
	u, db := mongoBase(base)
	q := u.Query()
	q.Del("database")
	u.RawQuery = q.Encode()
	client, err := mongo.Connect(options.Client().ApplyURI(u.String()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Disconnect(context.Background()) })
	return client.Database(db).Collection(name)
}

// rawMongoCycle: the least a MongoDB lock can do — one findOneAndUpdate
// with upsert that takes an absent or expired key (a live one makes the
// upsert collide, E11000), then an owner-checked deleteOne.
func rawMongoCycle(b *testing.B, base string) {
	ctx := context.Background()
	c := rawMongoColl(b, base, "bench_raw_locks")
	key := fmt.Sprintf("bench-%d-%d", os.Getpid(), mongoRuns.Add(1))
	b.Cleanup(func() { c.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}}) })
	for b.Loop() {
		now := time.Now()
		err := c.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: "owner"}, {Key: "expiresAt", Value: now.Add(time.Minute)}}}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Err()
		if err != nil {
			b.Fatal("raw acquire failed: ", err)
		}
		res, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "owner"}})
		if err != nil || res.DeletedCount != 1 {
			b.Fatal("raw release failed: ", err)
		}
	}
}

// rawMongoShapedCycle: the raw pair on a document shaped as warden's lock
// documents (docs/backends.md): the go-go-scope adapter's unique index on
// key and warden's on key + namespace, the purgeAt index; the acquire is
// one findOneAndUpdate with upsert over a free or expired document whose
// token is lower, writing the same fields; the release keeps the document
// (its token fences later holders) and parks its key. What is left between
// this and warden's primitives is warden's own code and concerns.
func rawMongoShapedCycle(b *testing.B, base string) {
	ctx := context.Background()
	c := rawMongoColl(b, base, "bench_raw_locks_shaped")
	for _, ix := range []mongo.IndexModel{
		{Keys: bson.D{{Key: "key", Value: 1}, {Key: "namespace", Value: 1}}, Options: options.Index().SetUnique(true)},
		{Keys: bson.D{{Key: "key", Value: 1}}, Options: options.Index().SetUnique(true)},
		{Keys: bson.D{{Key: "purgeAt", Value: 1}}},
	} {
		if _, err := c.Indexes().CreateOne(ctx, ix); err != nil {
			b.Fatal(err)
		}
	}
	key := fmt.Sprintf("bench-%d-%d", os.Getpid(), mongoRuns.Add(1))
	b.Cleanup(func() { c.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}}) })
	for b.Loop() {
		now := time.Now().UTC().Truncate(time.Millisecond)
		token := now.UnixMicro()
		err := c.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: key}, {Key: "token", Value: bson.D{{Key: "$lt", Value: token}}}, {Key: "$or", Value: bson.A{
				bson.D{{Key: "released", Value: true}},
				bson.D{{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now}}}},
			}}},
			bson.D{
				{Key: "$set", Value: bson.D{{Key: "key", Value: key}, {Key: "owner", Value: "owner"}, {Key: "token", Value: token},
					{Key: "acquiredAt", Value: now}, {Key: "expiresAt", Value: now.Add(time.Minute)},
					{Key: "released", Value: false}, {Key: "releasedAt", Value: nil}, {Key: "purgeAt", Value: now.Add(25 * time.Hour)}, {Key: "updatedAt", Value: now}}},
				{Key: "$setOnInsert", Value: bson.D{{Key: "createdAt", Value: now}, {Key: "namespace", Value: "bench:"}}},
			},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Err()
		if err != nil {
			b.Fatal("raw shaped acquire failed: ", err)
		}
		res, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "owner"}, {Key: "token", Value: token}, {Key: "released", Value: false}},
			bson.D{
				{Key: "$set", Value: bson.D{{Key: "key", Value: ":released:" + key}, {Key: "released", Value: true}, {Key: "releasedAt", Value: now},
					{Key: "purgeAt", Value: now.Add(24 * time.Hour)}, {Key: "updatedAt", Value: now}}},
				{Key: "$unset", Value: bson.D{{Key: "expiresAt", Value: ""}}},
			})
		if err != nil || res.MatchedCount != 1 {
			b.Fatal("raw shaped release failed: ", err)
		}
		for time.Now().UnixMicro() == token {
		} // the next token must be higher
	}
}

// rawMongoGet: a read by _id with an expiry check.
func rawMongoGet(b *testing.B, base string) {
	ctx := context.Background()
	c := rawMongoColl(b, base, "bench_raw_cache")
	key := fmt.Sprintf("cache:bench-%d-%d", os.Getpid(), mongoRuns.Add(1))
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "value", Value: []byte("value")}, {Key: "expiresAt", Value: nil}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}}) })
	for b.Loop() {
		var d struct {
			Value []byte `bson:"value"`
		}
		err := c.FindOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "$or", Value: bson.A{
			bson.D{{Key: "expiresAt", Value: nil}},
			bson.D{{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: time.Now()}}}},
		}}}).Decode(&d)
		if err != nil || len(d.Value) == 0 {
			b.Fatal(errors.Join(errors.New("raw get failed"), err))
		}
	}
}

// mongoCacheGet: a hit through the store's checked cache primitive.
func mongoCacheGet(b *testing.B, u string) {
	ctx := context.Background()
	c := open(b, u).Cache()
	if err := c.Set(ctx, "bench", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Delete(ctx, "bench") })
	for b.Loop() {
		if _, ok, err := c.Get(ctx, "bench"); err != nil || !ok {
			b.Fatal(fmt.Sprint(ok), err)
		}
	}
}
