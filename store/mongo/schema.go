package mongo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// LockRetention is how long the TTL index keeps a lock document after its
// holding ended (released or expired): the document carries the lock's
// fencing-token counter, see docs/design.md. It matches Store.Purge's
// default lock retention.
const LockRetention = 24 * time.Hour

// ttlWarn logs a server without TTL indexes once per process; noTTL
// remembers the servers (serverKey) that answered so.
var (
	ttlWarn sync.Once
	noTTL   sync.Map
)

// Server error codes the store handles.
const (
	codeNamespaceExists      = 48
	codeIndexOptionsConflict = 85
	codeIndexKeySpecConflict = 86
	codeNotImplemented       = 238
)

// serverCode returns the server error code of err, 0 if none.
func serverCode(err error) int {
	var se mongo.ServerError
	if errors.As(err, &se) {
		for _, c := range []int{codeNamespaceExists, codeIndexOptionsConflict, codeIndexKeySpecConflict, codeNotImplemented} {
			if se.HasErrorCode(c) {
				return c
			}
		}
	}
	return 0
}

// index is one index the store wants.
type index struct {
	coll   *mongo.Collection
	keys   bson.D
	name   string
	unique bool
	ttl    int32 // expireAfterSeconds; -1: not a TTL index
}

// indexes lists the store's indexes: a unique index on each record's key
// within its namespace; the go-go-scope adapter's unique index on key alone
// for locks, circuits and cache (under its name, key_1: it is what makes
// the adapter's insert-only lock acquire exclude warden's holdings, and
// stored keys are unambiguous across namespaces, see driver.ValidatePrefix);
// TTL indexes on expiresAt where records expire (under the adapter's name,
// expiresAt_1, with its options, so that its connect() finds them made);
// the lock documents' TTL index on purgeAt (they outlive their holding by
// LockRetention, carrying the fencing counter); the unique {taskId,
// sequence} of checkpoints and the fences' unique task id.
func (s *store) indexes() []index {
	keyNS := bson.D{{Key: "key", Value: 1}, {Key: "namespace", Value: 1}}
	key := bson.D{{Key: "key", Value: 1}}
	exp := bson.D{{Key: "expiresAt", Value: 1}}
	return []index{
		{s.locks, keyNS, "warden_key_namespace", true, -1},
		{s.locks, key, "key_1", true, -1},
		{s.locks, bson.D{{Key: "purgeAt", Value: 1}}, "warden_purgeAt_ttl", false, 0},
		{s.circs, keyNS, "warden_key_namespace", true, -1},
		{s.circs, key, "key_1", true, -1},
		{s.cache, keyNS, "warden_key_namespace", true, -1},
		{s.cache, key, "key_1", true, -1},
		{s.cache, exp, "expiresAt_1", false, 0},
		{s.idem, keyNS, "warden_key_namespace", true, -1},
		{s.idem, exp, "expiresAt_1", false, 0},
		{s.cps, bson.D{{Key: "taskId", Value: 1}, {Key: "sequence", Value: 1}, {Key: "namespace", Value: 1}}, "warden_task_sequence", true, -1},
		{s.fences, bson.D{{Key: "taskId", Value: 1}, {Key: "namespace", Value: 1}}, "warden_task", true, -1},
	}
}

// obsoleteIndexes are indexes earlier versions of warden created that
// Migrate drops once the ones above exist: TTL indexes on expiresAt under
// warden's own name. The go-go-scope adapter's connect() creates
// expiresAt_1 on those collections and fails on MongoDB when the same keys
// are indexed under another name or with other options; and on locks,
// expiresAt + 24 h no longer collects released documents (they have no
// expiresAt).
func (s *store) obsoleteIndexes() []index {
	exp := bson.D{{Key: "expiresAt", Value: 1}}
	return []index{
		{s.locks, exp, "warden_expiresAt_ttl", false, -1},
		{s.cache, exp, "warden_expiresAt_ttl", false, -1},
		{s.idem, exp, "warden_expiresAt_ttl", false, -1},
	}
}

// Migrate implements driver.Migrator: it creates the capped event
// collection (with its first document, which tailable cursors need) and,
// unless DisableAutoIndex, the indexes. It is idempotent and works on
// collections the go-go-scope adapter created. A server without TTL
// indexes (FerretDB answers "not implemented", code 238) is logged once
// and tolerated: every operation checks expiry itself and Purge collects
// the garbage. An index that exists under another name or with other
// options (a go-go-scope TTL index, say) is kept, with a warning.
func (s *store) Migrate(ctx context.Context) error {
	if err := s.migrateEvents(ctx); err != nil {
		return ctxErr(ctx, fmt.Errorf("mongo: creating the event collection: %w", err))
	}
	if !s.autoIdx {
		return nil
	}
	have := map[string]map[string]bool{} // collection → index names present
	for _, ix := range s.indexes() {
		if _, ok := have[ix.coll.Name()]; ok {
			continue
		}
		names := map[string]bool{}
		have[ix.coll.Name()] = names
		if specs, err := ix.coll.Indexes().ListSpecifications(ctx); err == nil {
			for _, sp := range specs {
				names[sp.Name] = true
			}
		}
	}
	// Before changing anything: a unique index to create on records
	// another program wrote (the go-go-scope adapter's, say) must find no
	// duplicates.
	for _, ix := range s.indexes() {
		if ix.unique && !have[ix.coll.Name()][ix.name] {
			if err := s.noDuplicates(ctx, ix); err != nil {
				return err
			}
		}
	}
	for _, ix := range s.indexes() {
		names := have[ix.coll.Name()]
		if names[ix.name] {
			continue // present: creating it again would be a write for nothing
		}
		if _, no := noTTL.Load(s.serverKey()); no && ix.ttl >= 0 {
			continue // this server said it has no TTL indexes
		}
		o := options.Index().SetName(ix.name)
		if ix.unique {
			o.SetUnique(true)
		}
		if ix.ttl >= 0 {
			o.SetExpireAfterSeconds(ix.ttl)
		}
		_, err := ix.coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: ix.keys, Options: o})
		switch code := serverCode(err); {
		case err == nil:
		case code == codeNotImplemented && ix.ttl >= 0:
			noTTL.Store(s.serverKey(), true)
			ttlWarn.Do(func() {
				s.log.Warn("warden: the MongoDB server does not implement TTL indexes; expired records stay until Store.Purge deletes them (expiry is still checked by every operation)",
					"collection", ix.coll.Name(), "error", err.Error())
			})
		case code == codeIndexOptionsConflict || code == codeIndexKeySpecConflict:
			s.log.Warn("warden: an index on these keys exists already with other options; keeping it",
				"collection", ix.coll.Name(), "index", ix.name, "error", err.Error())
		case mongo.IsDuplicateKeyError(err):
			return ctxErr(ctx, fmt.Errorf("mongo: cannot adopt collection %s: creating the unique index %s on %v found two records with the same value (written by another program); remove one, then migrate again: %w",
				ix.coll.Name(), ix.name, ix.keys, err))
		default:
			return ctxErr(ctx, fmt.Errorf("mongo: creating index %s on %s: %w", ix.name, ix.coll.Name(), err))
		}
	}
	for _, ix := range s.obsoleteIndexes() {
		if !have[ix.coll.Name()][ix.name] {
			continue
		}
		if err := ix.coll.Indexes().DropOne(ctx, ix.name); err != nil {
			return ctxErr(ctx, fmt.Errorf("mongo: dropping the obsolete index %s on %s: %w", ix.name, ix.coll.Name(), err))
		}
	}
	return nil
}

// noDuplicates refuses, naming the collection, the index and the value,
// records that share the keys of unique index ix: one aggregation that
// groups the collection by those keys (run only while the index is
// missing, so once per database).
func (s *store) noDuplicates(ctx context.Context, ix index) error {
	group := bson.D{}
	for _, k := range ix.keys {
		group = append(group, bson.E{Key: k.Key, Value: "$" + k.Key})
	}
	pipe := mongo.Pipeline{
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: group}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
		{{Key: "$match", Value: bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 1}}}}}},
		{{Key: "$limit", Value: 1}},
	}
	cur, err := ix.coll.Aggregate(ctx, pipe)
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("mongo: looking for duplicates before creating index %s on %s: %w", ix.name, ix.coll.Name(), err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var dup struct {
		ID bson.Raw `bson:"_id"`
		N  int64    `bson:"n"`
	}
	if cur.Next(ctx) {
		if err := cur.Decode(&dup); err != nil {
			return err
		}
		return fmt.Errorf("mongo: cannot adopt collection %s: %d records share %s, which the unique index %s needs unique (records another program wrote); remove all but one, then migrate again (nothing was changed)",
			ix.coll.Name(), dup.N, dup.ID, ix.name)
	}
	return ctxErr(ctx, cur.Err())
}

// migrateEvents creates the capped event collection and its first
// document.
func (s *store) migrateEvents(ctx context.Context) error {
	names, err := s.db.ListCollectionNames(ctx, bson.D{{Key: "name", Value: s.names.Events}})
	if err != nil || len(names) == 0 {
		err = s.db.CreateCollection(ctx, s.names.Events, options.CreateCollection().SetCapped(true).SetSizeInBytes(s.evSize))
		if err != nil && serverCode(err) != codeNamespaceExists {
			return err
		}
	}
	err = s.events.FindOne(ctx, bson.D{}).Err()
	if errors.Is(err, mongo.ErrNoDocuments) {
		_, err = s.events.InsertOne(ctx, bson.D{{Key: "kind", Value: evInit}, {Key: "at", Value: now()}})
	}
	return err
}
