package postgres

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// checkpoints is the checkpoint driver.
type checkpoints struct{ s *store }

// cpRow holds the scan targets of one checkpoint row.
type cpRow struct {
	task     string
	seq, ts  int64
	progress float64
	data     []byte
	eta      sql.NullInt64
	token    int64
}

func (r *cpRow) dest() []any {
	return []any{&r.task, &r.seq, &r.ts, &r.progress, &r.data, &r.eta, &r.token}
}

func (c checkpoints) checkpoint(r *cpRow) driver.Checkpoint {
	id := strings.TrimPrefix(r.task, c.s.prefix)
	return driver.Checkpoint{
		ID: driver.CheckpointID(id, r.seq), TaskID: id, Sequence: r.seq, Time: time.UnixMilli(r.ts).UTC(),
		Progress: r.progress, Data: nonNil(r.data), ETA: time.Duration(r.eta.Int64) * time.Millisecond, Token: r.token,
	}
}

// Save implements driver.Checkpoints in one statement: the fence row's
// upsert decides whether the save is refused and assigns the sequence
// (holding the fence row's lock, so concurrent savers of a task queue),
// and the checkpoint is inserted by the same statement.
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	var eta any
	if in.ETA > 0 {
		eta = driver.Millis(in.ETA)
	}
	var r cpRow
	found, err := s.row(ctx, s.q.cpSave, []any{s.prefix, s.prefix + in.TaskID, in.Token, in.Progress, nonNil(in.Data), eta}, r.dest()...)
	if err != nil || !found {
		return driver.Checkpoint{}, false, err
	}
	return c.checkpoint(&r), true, nil
}

// Fence implements driver.Checkpoints in one upsert of the fence row.
func (c checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	var one int
	return c.s.row(ctx, c.s.q.cpFence, []any{c.s.prefix, c.s.prefix + taskID, token}, &one)
}

// Load implements driver.Checkpoints.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	return c.one(ctx, c.s.q.cpLoad, c.s.prefix, c.s.prefix+task, seq)
}

// Latest implements driver.Checkpoints.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	return c.one(ctx, c.s.q.cpLatest, c.s.prefix, c.s.prefix+taskID)
}

func (c checkpoints) one(ctx context.Context, query string, args ...any) (driver.Checkpoint, bool, error) {
	var r cpRow
	found, err := c.s.row(ctx, query, args, r.dest()...)
	if err != nil || !found {
		return driver.Checkpoint{}, false, err
	}
	return c.checkpoint(&r), true, nil
}

// List implements driver.Checkpoints.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	var out []driver.Checkpoint
	_, err := c.s.page(ctx, c.s.q.cpList, []any{c.s.prefix, c.s.prefix + taskID}, func(rows rowsIter) error {
		var r cpRow
		if err := rows.Scan(r.dest()...); err != nil {
			return err
		}
		out = append(out, c.checkpoint(&r))
		return nil
	})
	return out, c.s.wrap(ctx, err)
}

// Cleanup implements driver.Checkpoints in one transaction: lock the
// task's fence row and compare its token (refused if the fence is above
// the caller's), then delete the newest-but-keep and older checkpoints.
// A Fence or a save of the task waits for the transaction, so none lands
// in between, and the DELETE, a statement of its own, sees every save
// committed before the lock.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	return c.fencedDelete(ctx, taskID, token, c.s.q.cpCleanup, int64(keep))
}

// DeleteAll implements driver.Checkpoints as Cleanup does, with one DELETE.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	return c.fencedDelete(ctx, taskID, token, c.s.q.cpDelete)
}

func (c checkpoints) fencedDelete(ctx context.Context, taskID string, token int64, del string, extra ...any) (int64, bool, error) {
	s := c.s
	task := s.prefix + taskID
	var n int64
	var ok bool
	err := s.inTx(ctx, func(tx txn) error {
		n, ok = 0, false
		// The fence row is locked even without a token, so that a save
		// under way (it holds the row) commits before the deletion reads.
		var fence int64
		err := tx.queryRow(ctx, s.q.cpFenceLock, s.prefix, task).Scan(&fence)
		if isNoRows(err) {
			err = tx.queryRow(ctx, s.q.cpMaxToken, s.prefix, task).Scan(&fence)
		}
		if err != nil {
			return err
		}
		if token > 0 && fence > token {
			return nil
		}
		if n, err = tx.exec(ctx, del, append([]any{s.prefix, task}, extra...)...); err != nil {
			return err
		}
		ok = true
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return n, ok, nil
}

// Tasks implements driver.Checkpoints.
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	var out []string
	err := c.s.list(ctx, c.s.q.cpTasks, c.s.prefix, pattern, func(rows rowsIter) (string, error) {
		var t string
		if err := rows.Scan(&t); err != nil {
			return "", err
		}
		if id, ok := strings.CutPrefix(t, c.s.prefix); ok && pattern.Match(id) {
			out = append(out, id)
		}
		return t, nil
	})
	return out, err
}
