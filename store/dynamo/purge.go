package dynamo

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warden-go/warden/driver"
)

// Purge implements driver.Purger. It reads the namespace's lock, cache,
// idempotency and checkpoint items (see walk: one Query of the list index
// per kind, then consistent BatchGetItem reads of the lock, cache and
// idempotency items and of the fence items; the checkpoints' keys are
// enough), then deletes, with one conditional DeleteItem per record, 8 in
// flight: expired cache entries and idempotency records, lock items idle
// (released or expired) for at least lockRetention, and the fence items
// of tasks without checkpoints whose fence has not changed for
// lockRetention. Each delete is conditioned on the state read, so a
// record changed meanwhile stays: a lock taken again (its version or
// updatedAt moved) keeps its holding and its token counter, an entry set
// again keeps its new value, a fence moved by a Save or Fence keeps
// fencing. BatchWriteItem takes no condition, so these deletes cannot be
// batched without losing that guarantee.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	now := nowMs()
	cut := now - driver.Millis(max(lockRetention, 0))
	if lockRetention <= 0 {
		cut = now
	}
	type victim struct {
		pk, sk, cond string
		vals         item
	}
	var victims []victim
	fences := map[string]item{} // task pk → fence item
	withCheckpoints := map[string]bool{}
	want := func(pk, sk string) need {
		switch {
		case strings.HasPrefix(pk, s.cpPfx) && sk != fenceSK:
			return keyOnly
		case strings.HasPrefix(pk, s.cpPfx) || sk == metaSK:
			return load
		}
		return skip
	}
	spans := []span{{s.lockPfx, ""}, {s.cachePfx, ""}, {s.idemPfx, ""}, {s.cpPfx, ""}}
	err := s.walk(ctx, "purging", spans, want, func(pk, sk string, it item) error {
		switch {
		case strings.HasPrefix(pk, s.lockPfx):
			idle := gN(it, aExp)
			if has(it, aRel) {
				idle = min(idle, gN(it, aRel))
			}
			if idle <= cut {
				victims = append(victims, victim{pk, sk, "#version = :v AND #updatedAt = :u",
					item{":v": vN(gN(it, aVersion)), ":u": vN(gN(it, aUpd))}})
			}
		case strings.HasPrefix(pk, s.cachePfx) || strings.HasPrefix(pk, s.idemPfx):
			if has(it, aExp) && gN(it, aExp) <= now {
				victims = append(victims, victim{pk, sk, "#expiresAtMs <= :now", item{":now": vN(now)}})
			}
		case sk == fenceSK:
			fences[pk] = it
		default:
			withCheckpoints[pk] = true
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for pk, it := range fences {
		if !withCheckpoints[pk] && gN(it, aUpd) <= cut {
			victims = append(victims, victim{pk, fenceSK, "#updatedAt = :u", item{":u": vN(gN(it, aUpd))}})
		}
	}
	var n atomic.Int64
	err = inParallel(ctx, len(victims), func(ctx context.Context, i int) error {
		v := victims[i]
		_, failed, err := s.del(ctx, "purging", v.pk, v.sk, v.cond, v.vals)
		if err == nil && !failed {
			n.Add(1)
		}
		return err
	})
	return n.Load(), err
}
