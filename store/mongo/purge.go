package mongo

import (
	"context"
	"errors"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Purge implements driver.Purger: in the namespace, expired cache entries,
// lapsed idempotency records, lock documents idle (released or expired)
// for at least lockRetention, and the fence documents of tasks without
// checkpoints unchanged for lockRetention. On MongoDB the TTL indexes do
// the same in the background; on servers without TTL indexes (FerretDB)
// Purge is the garbage collector. The capped event collection needs none.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	t := now()
	cutoff := t.Add(-time.Duration(driver.Millis(lockRetention)) * time.Millisecond)
	var total int64
	for _, p := range []struct {
		c *mongo.Collection
		f bson.D
	}{
		{s.cache, append(s.keyRange("key", s.cachePfx), bson.E{Key: "expiresAt", Value: set("$lte", t)})},
		{s.idem, bson.D{{Key: "namespace", Value: s.prefix}, {Key: "expiresAt", Value: set("$lte", t)}}},
		// Released holdings by their release time (a released document
		// has no expiresAt and a parked key), lapsed ones by their expiry.
		{s.locks, bson.D{{Key: "namespace", Value: s.prefix}, {Key: "$or", Value: bson.A{
			bson.D{{Key: "released", Value: true}, {Key: "releasedAt", Value: set("$lte", cutoff)}},
			bson.D{{Key: "released", Value: false}, {Key: "expiresAt", Value: set("$lte", cutoff)}},
		}}}},
	} {
		res, err := p.c.DeleteMany(ctx, p.f)
		if err != nil {
			return total, ctxErr(ctx, err)
		}
		total += res.DeletedCount
	}
	// Fences idle for the retention whose task has no checkpoint. The
	// delete re-checks updatedAt, so a save racing with it keeps its fence.
	var idle []string
	err := findAll(ctx, s.fences, bson.D{{Key: "namespace", Value: s.prefix}, {Key: "updatedAt", Value: set("$lte", cutoff)}},
		set("taskId", 1), func(d *cpDoc) { idle = append(idle, d.TaskID) })
	if err != nil {
		return total, err
	}
	for _, task := range idle {
		f := bson.D{{Key: "taskId", Value: task}, {Key: "namespace", Value: s.prefix}}
		err := s.cps.FindOne(ctx, f, options.FindOne().SetProjection(set("_id", 1))).Err()
		if err == nil {
			continue
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return total, ctxErr(ctx, err)
		}
		res, err := s.fences.DeleteOne(ctx, append(f, bson.E{Key: "updatedAt", Value: set("$lte", cutoff)}))
		if err != nil {
			return total, ctxErr(ctx, err)
		}
		total += res.DeletedCount
	}
	return total, nil
}
