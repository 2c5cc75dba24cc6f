package mysql

import (
	"context"
	"database/sql"
	"time"
)

// Purge implements driver.Purger in one READ COMMITTED transaction (no gap
// locks, so it does not block inserts): it deletes, in the namespace,
// expired cache entries and idempotency records, lock rows idle (released
// or expired) for at least lockRetention, and the fence rows of tasks
// without checkpoints whose fence has not changed for lockRetention.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	ret := retentionUsec(lockRetention)
	lockCond, lockArgs := keyRange("`key`", s.lockPfx)
	cacheCond, cacheArgs := keyRange("`key`", s.cachePfx)
	t := s.t
	stmts := []struct {
		q    string
		args []any
	}{
		{"DELETE FROM `" + t.Cache + "` WHERE (namespace = ? OR namespace = '') AND " + cacheCond + " AND expires_at IS NOT NULL AND expires_at <= UTC_TIMESTAMP(3)",
			append([]any{s.prefix}, cacheArgs...)},
		{"DELETE FROM `" + t.Idempotency + "` WHERE namespace = ? AND expires_at IS NOT NULL AND expires_at <= UTC_TIMESTAMP(3)",
			[]any{s.prefix}},
		// A released holding's expires_at is its release time.
		{"DELETE FROM `" + t.Locks + "` WHERE (namespace = ? OR namespace = '') AND " + lockCond + " AND expires_at <= TIMESTAMPADD(MICROSECOND, -?, UTC_TIMESTAMP(3))",
			append(append([]any{s.prefix}, lockArgs...), ret)},
		{"DELETE FROM `" + t.CheckpointTasks + "` WHERE namespace = ? AND updated_at <= TIMESTAMPADD(MICROSECOND, -?, UTC_TIMESTAMP(3))" +
			" AND NOT EXISTS (SELECT 1 FROM `" + t.Checkpoints + "` p WHERE p.namespace = `" + t.CheckpointTasks + "`.namespace AND p.task_id = `" + t.CheckpointTasks + "`.task_id)",
			[]any{s.prefix, ret}},
	}
	var total int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		total = 0
		for _, st := range stmts {
			res, err := tx.ExecContext(ctx, st.q, st.args...)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			total += n
		}
		return nil
	})
	return total, err
}

// retentionUsec is a retention in whole milliseconds, as microseconds.
func retentionUsec(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(d/time.Millisecond) * 1000
}
