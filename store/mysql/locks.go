package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// locks is the lock driver.
type locks struct{ s *store }

type rowScanner interface{ Scan(dest ...any) error }

func scanLock(r rowScanner, key string) (driver.LockRecord, bool, error) {
	var owner []byte
	var token int64
	var acq, exp, rel sql.NullTime
	if err := r.Scan(&owner, &token, &acq, &exp, &rel); err != nil {
		return driver.LockRecord{}, false, err
	}
	// A row released by warden has expires_at <= released_at; one the
	// go-go-scope adapter took over since is held again.
	released := rel.Valid && exp.Valid && !exp.Time.After(rel.Time)
	return driver.LockRecord{Key: key, Owner: string(owner), Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)}, released, nil
}

// Acquire implements driver.Locks in two round trips: one upsert that
// applies only when the lock is free (absent, released, expired) or held
// by owner, then a read of the row. The lock is acquired when the row
// holds owner, live. (The outcome is read from the row, not from
// LAST_INSERT_ID, which an AUTO_INCREMENT column of an adopted table
// would override.) Concurrent first acquires of a new key queue on the
// primary key's row lock: one inserts, the others update it
// conditionally; no transaction spans statements, so no deadlock.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	var rec driver.LockRecord
	var acquired bool
	err := retry(ctx, func() error {
		if _, err := s.db.ExecContext(ctx, s.q.lockAcquire, s.prefix, sk, owner, usec(ttl)); err != nil {
			return err
		}
		var owned []byte
		var token int64
		var acq, exp, rel sql.NullTime
		var live bool
		err := s.db.QueryRowContext(ctx, s.q.lockRowLive, s.prefix, sk).Scan(&owned, &token, &acq, &exp, &rel, &live)
		if err != nil {
			return fmt.Errorf("mysql: reading the lock after acquiring: %w", err)
		}
		rec = driver.LockRecord{Key: key, Owner: string(owned), Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)}
		acquired = owned != nil && string(owned) == owner && live
		return nil
	})
	return rec, acquired, err
}

// Refresh implements driver.Locks: one conditional update, then a read.
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	var n int64
	err := retry(ctx, func() (err error) {
		n, err = s.marked(ctx, s.db, s.q.lockRefresh, usec(ttl), s.prefix, s.lockPfx+key, owner, token)
		return err
	})
	if err != nil || n != 1 {
		return driver.LockRecord{}, false, err
	}
	rec, _, err := scanLock(s.db.QueryRowContext(ctx, s.q.lockRow, s.prefix, s.lockPfx+key), key)
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	return rec, rec.Owner == owner && rec.Token == token, nil
}

// Release implements driver.Locks. The row is kept, marked released, so
// that the next holder's token continues from it.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	n, err := l.s.execCount(ctx, l.s.q.lockRelease, l.s.prefix, l.s.lockPfx+key, owner, token)
	return n > 0, err
}

// ForceRelease implements driver.Locks.
func (l locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	n, err := l.s.execCount(ctx, l.s.q.lockForce, l.s.prefix, l.s.lockPfx+key)
	return n > 0, err
}

// Get implements driver.Locks.
func (l locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	rec, _, err := scanLock(l.s.db.QueryRowContext(ctx, l.s.q.lockGet, l.s.prefix, l.s.lockPfx+key), key)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.LockRecord{}, false, nil
	}
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	return rec, true, nil
}

// List implements driver.Locks.
func (l locks) List(ctx context.Context, pattern driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s
	var out []driver.LockRecord
	err := s.list(ctx, s.q.lockList, "`key`", s.lockPfx, pattern, func(rows *sql.Rows) error {
		var sk []byte
		var owner []byte
		var token int64
		var acq, exp, rel sql.NullTime
		if err := rows.Scan(&sk, &owner, &token, &acq, &exp, &rel); err != nil {
			return err
		}
		if key, ok := strings.CutPrefix(string(sk), s.lockPfx); ok && pattern.Match(key) {
			out = append(out, driver.LockRecord{Key: key, Owner: string(owner), Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)})
		}
		return nil
	})
	return out, err
}

// list runs a listing query with the namespace, key range and LIKE
// arguments for pattern under pfx.
func (s *store) list(ctx context.Context, query, col, pfx string, pattern driver.Pattern, each func(*sql.Rows) error) error {
	cond, args := keyRange(col, pfx+pattern.Prefix())
	args = append([]any{s.prefix}, args...)
	args = append(args, pattern.Like(pfx, '!'))
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf(query, cond), args...)
	if err != nil {
		return ctxErr(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return ctxErr(ctx, err)
		}
	}
	return ctxErr(ctx, rows.Err())
}
