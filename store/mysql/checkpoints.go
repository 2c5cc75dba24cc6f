package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// checkpoints is the checkpoint driver.
type checkpoints struct{ s *store }

func (c checkpoints) scan(r rowScanner) (driver.Checkpoint, error) {
	var (
		task       []byte
		seq, token int64
		ts         sql.NullTime
		progress   float64
		data, bin  []byte
		eta        sql.NullInt64
	)
	if err := r.Scan(&task, &seq, &ts, &progress, &data, &bin, &eta, &token); err != nil {
		return driver.Checkpoint{}, err
	}
	id := strings.TrimPrefix(string(task), c.s.prefix)
	return driver.Checkpoint{
		ID: driver.CheckpointID(id, seq), TaskID: id, Sequence: seq, Time: utc(ts), Progress: progress,
		Data: valueOf(data, bin), ETA: time.Duration(eta.Int64) * time.Millisecond, Token: token,
	}, nil
}

// Save implements driver.Checkpoints in one short READ COMMITTED
// transaction: the fence row's upsert decides whether the save is refused
// and assigns the sequence (holding the fence row's lock, so concurrent
// savers of a task queue) in @warden_out, then the checkpoint is inserted
// with that sequence unless refused, and read back.
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	task := s.prefix + in.TaskID
	var eta any
	if in.ETA > 0 {
		eta = driver.Millis(in.ETA)
	}
	var cp driver.Checkpoint
	var ok bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		cp, ok = driver.Checkpoint{}, false
		if _, err := tx.ExecContext(ctx, s.q.cpFenceSave, s.prefix, task, in.Token, s.prefix, task, s.prefix, task,
			in.Token, in.Token, s.prefix, task, in.Token); err != nil {
			return err
		}
		js := jsonArg(in.Data)
		res, err := tx.ExecContext(ctx, s.q.cpInsert, s.prefix, task, task, in.Progress, js, js, js, nonNil(in.Data), eta, in.Token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // refused by the fence
		}
		r, err := c.scan(tx.QueryRowContext(ctx, s.q.cpLoadOut, s.prefix, task))
		if err != nil {
			return err
		}
		cp, ok = r, true
		return nil
	})
	if err != nil {
		return driver.Checkpoint{}, false, err
	}
	return cp, ok, nil
}

// Fence implements driver.Checkpoints in one upsert of the fence row.
func (c checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	s := c.s
	task := s.prefix + taskID
	var ok int64
	err := s.tx(ctx, func(tx *sql.Tx) (err error) {
		return s.outcome(ctx, tx, s.q.cpFence, []any{s.prefix, task, token, s.prefix, task},
			func(q querier) error { return q.QueryRowContext(ctx, "SELECT @warden_out").Scan(&ok) })
	})
	return ok == 1, err
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
	cp, err := c.scan(c.s.db.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Checkpoint{}, false, nil
	}
	if err != nil {
		return driver.Checkpoint{}, false, ctxErr(ctx, err)
	}
	return cp, true, nil
}

// List implements driver.Checkpoints.
func (c checkpoints) List(ctx context.Context, taskID string) ([]driver.Checkpoint, error) {
	rows, err := c.s.db.QueryContext(ctx, c.s.q.cpList, c.s.prefix, c.s.prefix+taskID)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []driver.Checkpoint
	for rows.Next() {
		cp, err := c.scan(rows)
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		out = append(out, cp)
	}
	return out, ctxErr(ctx, rows.Err())
}

// Cleanup implements driver.Checkpoints in one READ COMMITTED transaction:
// with a token, lock the task's fence row and compare (refused if the
// fence is above the token); find the newest sequence to drop, delete it
// and all older ones. A Fence or a save of the task waits for the
// transaction, and saves are transactions too, so none lands after it.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	s := c.s
	task := s.prefix + taskID
	return c.fencedDelete(ctx, task, token, func(tx *sql.Tx) (sql.Result, error) {
		var seq int64
		err := tx.QueryRowContext(ctx, s.q.cpNth, s.prefix, task, int64(keep)).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return tx.ExecContext(ctx, s.q.cpCleanup, s.prefix, task, seq)
	})
}

// DeleteAll implements driver.Checkpoints as Cleanup does, with one DELETE.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	s := c.s
	task := s.prefix + taskID
	return c.fencedDelete(ctx, task, token, func(tx *sql.Tx) (sql.Result, error) {
		return tx.ExecContext(ctx, s.q.cpDelete, s.prefix, task)
	})
}

// fencedDelete runs del in a transaction after the fence check; del may
// return a nil result (nothing to delete).
func (c checkpoints) fencedDelete(ctx context.Context, task string, token int64, del func(tx *sql.Tx) (sql.Result, error)) (int64, bool, error) {
	s := c.s
	var n int64
	var ok bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n, ok = 0, false
		if token > 0 {
			var fence int64
			err := tx.QueryRowContext(ctx, s.q.cpFenceLock, s.prefix, task).Scan(&fence)
			if errors.Is(err, sql.ErrNoRows) {
				err = tx.QueryRowContext(ctx, s.q.cpMaxToken, s.prefix, task).Scan(&fence)
			}
			if err != nil {
				return err
			}
			if fence > token {
				return nil
			}
		}
		res, err := del(tx)
		if err != nil {
			return err
		}
		if res != nil {
			if n, err = res.RowsAffected(); err != nil {
				return err
			}
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
	err := c.s.list(ctx, c.s.q.cpTasks, "task_id", c.s.prefix, pattern, func(rows *sql.Rows) error {
		var t []byte
		if err := rows.Scan(&t); err != nil {
			return err
		}
		if id, ok := strings.CutPrefix(string(t), c.s.prefix); ok && pattern.Match(id) {
			out = append(out, id)
		}
		return nil
	})
	return out, err
}
