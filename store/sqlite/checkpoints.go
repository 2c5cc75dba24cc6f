package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// checkpoints is the checkpoint driver.
type checkpoints struct{ s *store }

func (c checkpoints) scan(r rowScanner) (driver.Checkpoint, error) {
	var (
		task       string
		seq, ts    int64
		progress   float64
		data       []byte
		eta, token sql.NullInt64
	)
	if err := r.Scan(&task, &seq, &ts, &progress, &data, &eta, &token); err != nil {
		return driver.Checkpoint{}, err
	}
	task = strings.TrimPrefix(task, c.s.cfg.prefix)
	return driver.Checkpoint{
		ID:       driver.CheckpointID(task, seq),
		TaskID:   task,
		Sequence: seq,
		Time:     msTime(ts),
		Progress: progress,
		Data:     nonNil(data),
		ETA:      time.Duration(eta.Int64) * time.Millisecond,
		Token:    token.Int64,
	}, nil
}

// Save implements driver.Checkpoints in one IMMEDIATE transaction: the
// upsert of the task's fence row decides whether the save is refused and
// assigns the sequence, then the checkpoint is inserted.
func (c checkpoints) Save(ctx context.Context, in driver.CheckpointInput) (driver.Checkpoint, bool, error) {
	s := c.s
	var cp driver.Checkpoint
	var ok bool
	var eta any
	if in.ETA > 0 {
		eta = driver.Millis(in.ETA)
	}
	task := s.cfg.prefix + in.TaskID
	err := s.tx(ctx, func(tx *sql.Tx) error {
		cp, ok = driver.Checkpoint{}, false
		now := nowMs()
		var seq int64
		err := s.queryRow(ctx, tx, s.q.cpFenceSave,
			sql.Named("task", task), sql.Named("token", in.Token), sql.Named("now", now)).Scan(&seq)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // refused: the token is below the fence
		}
		if err != nil {
			return err
		}
		r, err := c.scan(s.queryRow(ctx, tx, s.q.cpInsert,
			sql.Named("task", task), sql.Named("seq", seq), sql.Named("now", now), sql.Named("progress", in.Progress),
			sql.Named("data", nonNil(in.Data)), sql.Named("eta", eta), sql.Named("token", in.Token)))
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

// Fence implements driver.Checkpoints in one upsert of the task's fence
// row.
func (c checkpoints) Fence(ctx context.Context, taskID string, token int64) (bool, error) {
	s := c.s
	var ok bool
	err := s.write(ctx, func() error {
		var one int
		err := s.queryRow(ctx, nil, s.q.cpFence,
			sql.Named("task", s.cfg.prefix+taskID), sql.Named("token", token), sql.Named("now", nowMs())).Scan(&one)
		switch {
		case err == nil:
			ok = true
		case errors.Is(err, sql.ErrNoRows):
			ok = false
		default:
			return err
		}
		return nil
	})
	return ok, err
}

// Load implements driver.Checkpoints.
func (c checkpoints) Load(ctx context.Context, id string) (driver.Checkpoint, bool, error) {
	task, seq, ok := driver.ParseCheckpointID(id)
	if !ok {
		return driver.Checkpoint{}, false, nil
	}
	return c.one(ctx, c.s.q.cpLoad, sql.Named("task", c.s.cfg.prefix+task), sql.Named("seq", seq))
}

// Latest implements driver.Checkpoints.
func (c checkpoints) Latest(ctx context.Context, taskID string) (driver.Checkpoint, bool, error) {
	return c.one(ctx, c.s.q.cpLatest, sql.Named("task", c.s.cfg.prefix+taskID))
}

func (c checkpoints) one(ctx context.Context, query string, args ...any) (driver.Checkpoint, bool, error) {
	cp, err := c.scan(c.s.readRow(ctx, query, args...))
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
	rows, err := c.s.readQuery(ctx, c.s.q.cpList, sql.Named("task", c.s.cfg.prefix+taskID))
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

// Cleanup implements driver.Checkpoints: in one IMMEDIATE transaction,
// the task's fence is read (refused if above token) and one DELETE runs.
// Saves are transactions too, so none lands after the deletion.
func (c checkpoints) Cleanup(ctx context.Context, taskID string, keep int, token int64) (int64, bool, error) {
	return c.fencedDelete(ctx, taskID, token, c.s.q.cpCleanup, sql.Named("keep", int64(keep)))
}

// DeleteAll implements driver.Checkpoints as Cleanup does.
func (c checkpoints) DeleteAll(ctx context.Context, taskID string, token int64) (int64, bool, error) {
	return c.fencedDelete(ctx, taskID, token, c.s.q.cpDeleteAll)
}

func (c checkpoints) fencedDelete(ctx context.Context, taskID string, token int64, query string, args ...any) (int64, bool, error) {
	s := c.s
	task := sql.Named("task", s.cfg.prefix+taskID)
	var n int64
	var ok bool
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n, ok = 0, false
		if token > 0 {
			var fence int64
			if err := s.queryRow(ctx, tx, s.q.cpFenceOf, task).Scan(&fence); err != nil {
				return err
			}
			if fence > token {
				return nil
			}
		}
		st, err := s.stmt(ctx, query)
		if err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, st).ExecContext(ctx, s.withNS(append([]any{task}, args...))...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		ok = err == nil
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return n, ok, nil
}

// Tasks implements driver.Checkpoints.
func (c checkpoints) Tasks(ctx context.Context, pattern driver.Pattern) ([]string, error) {
	s := c.s
	cond, args := s.nsRange("task_id", s.cfg.prefix+pattern.Prefix())
	args = append(args, pattern.SQLiteGlob(s.cfg.prefix))
	rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.cpTasks, cond), args...)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, ctxErr(ctx, err)
		}
		if id, ok := strings.CutPrefix(t, s.cfg.prefix); ok && pattern.Match(id) {
			out = append(out, id)
		}
	}
	return out, ctxErr(ctx, rows.Err())
}
