package postgres

import (
	"context"
	"time"

	"github.com/warden-go/warden/driver"
)

// Purge implements driver.Purger. It deletes, in the namespace and in
// batches of at most 1000 rows per statement (no table-wide delete, no
// long lock), expired cache entries and idempotency records, lock rows
// idle (released or expired) for at least lockRetention, and the fence
// rows of tasks without checkpoints whose fence has not changed for
// lockRetention.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	ret := int64(0)
	if lockRetention > 0 {
		ret = driver.Millis(lockRetention)
	}
	cacheLo, cacheHi := keyRange(s.cachePfx)
	lockLo, lockHi := keyRange(s.lockPfx)
	batches := []struct {
		q    string
		args []any
	}{
		{s.q.purgeCache, []any{s.prefix, cacheLo, cacheHi}},
		{s.q.purgeIdem, []any{s.prefix}},
		{s.q.purgeLocks, []any{s.prefix, lockLo, lockHi, ret}},
		{s.q.purgeFences, []any{s.prefix, ret}},
	}
	var total int64
	for _, b := range batches {
		for {
			n, err := s.exec(ctx, b.q, b.args...)
			if err != nil {
				return total, err
			}
			total += n
			if n < purgeBatch {
				break
			}
		}
	}
	return total, nil
}
