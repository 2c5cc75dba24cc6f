package dynamo

import (
	"context"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// Purge implements driver.Purger with one Scan of the table filtered on
// the namespace's lock, cache, idempotency and checkpoint items, then one
// conditional DeleteItem per record to delete: expired cache entries and
// idempotency records, lock items idle (released or expired) for at least
// lockRetention, and the fence items of tasks without checkpoints whose
// fence has not changed for lockRetention. Each delete is conditioned on
// the state the Scan saw, so a record changed meanwhile stays.
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
	err := s.scan(ctx, "purging", func(it item) error {
		pk, sk := gS(it, aPk), gS(it, aSk)
		switch {
		case strings.HasPrefix(pk, s.lockPfx) && sk == metaSK:
			idle := gN(it, aExp)
			if has(it, aRel) {
				idle = min(idle, gN(it, aRel))
			}
			if idle <= cut {
				victims = append(victims, victim{pk, sk, "#version = :v AND #updatedAt = :u",
					item{":v": vN(gN(it, aVersion)), ":u": vN(gN(it, aUpd))}})
			}
		case (strings.HasPrefix(pk, s.cachePfx) || strings.HasPrefix(pk, s.idemPfx)) && sk == metaSK:
			if has(it, aExp) && gN(it, aExp) <= now {
				victims = append(victims, victim{pk, sk, "#expiresAtMs <= :now", item{":now": vN(now)}})
			}
		case strings.HasPrefix(pk, s.cpPfx):
			if sk == fenceSK {
				fences[pk] = it
			} else {
				withCheckpoints[pk] = true
			}
		}
		return nil
	}, s.lockPfx, s.cachePfx, s.idemPfx, s.cpPfx)
	if err != nil {
		return 0, err
	}
	for pk, it := range fences {
		if !withCheckpoints[pk] && gN(it, aUpd) <= cut {
			victims = append(victims, victim{pk, fenceSK, "#updatedAt = :u", item{":u": vN(gN(it, aUpd))}})
		}
	}
	var n int64
	for _, v := range victims {
		_, failed, err := s.del(ctx, "purging", v.pk, v.sk, v.cond, v.vals)
		if err != nil {
			return n, err
		}
		if !failed {
			n++
		}
	}
	return n, nil
}
