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

// locks is the lock driver.
type locks struct{ s *store }

type rowScanner interface{ Scan(dest ...any) error }

// scanLock reads owner, token, acquired_at, expires_at.
func scanLock(r rowScanner, key string) (driver.LockRecord, error) {
	var owner sql.NullString
	var token, acquired, expires sql.NullInt64
	if err := r.Scan(&owner, &token, &acquired, &expires); err != nil {
		return driver.LockRecord{}, err
	}
	return driver.LockRecord{
		Key:        key,
		Owner:      owner.String,
		Token:      token.Int64,
		AcquiredAt: nullMsTime(acquired),
		ExpiresAt:  nullMsTime(expires),
	}, nil
}

// Acquire implements driver.Locks. The fast path is one upsert that applies
// only when the lock is free, expired, released or held by owner. When it
// does not apply, the live holder is read (without the write lock): at that
// moment the lock was held by someone else, so "not acquired" with that
// holder is a consistent answer. If the read finds no live holder (it was
// released in between), the attempt is repeated in an IMMEDIATE
// transaction that also reads the holder.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	var rec driver.LockRecord
	var acquired bool
	try := func(tx *sql.Tx, t time.Time) error {
		now := t.UnixMilli()
		row := s.queryRow(ctx, tx, s.q.lockAcquire,
			sql.Named("key", sk), sql.Named("owner", owner), sql.Named("now", now),
			sql.Named("exp", now+driver.Millis(ttl)), sql.Named("base", driver.TokenBaseMicro(t)))
		r, err := scanLock(row, key)
		if err == nil {
			rec, acquired = r, true
			return nil
		}
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	}
	if s.queued(sk, owner) {
		return l.acquireQueued(ctx, key, owner, try, &rec, &acquired)
	}
	err := s.write(ctx, func() error { return try(nil, time.Now()) })
	if err != nil || acquired {
		return rec, acquired, err
	}
	holder, found, err := l.Get(ctx, key)
	if err != nil || (found && holder.Owner != owner) {
		return holder, false, err
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if err := try(tx, time.Now()); err != nil || acquired {
			return err
		}
		r, err := scanLock(s.queryRow(ctx, tx, s.q.lockHolder, sql.Named("key", sk)), key)
		if err != nil {
			return fmt.Errorf("sqlite: lock not acquired but no holder found: %w", err)
		}
		rec = r
		return nil
	})
	return rec, acquired, err
}

// acquireQueued is Acquire by an owner queued for the key (turns.go), in
// one IMMEDIATE transaction: the upsert and, if it applied, the deletion
// of owner's queue entry; if it did not, the row read as it stands.
func (l locks) acquireQueued(ctx context.Context, key, owner string, try func(*sql.Tx, time.Time) error,
	rec *driver.LockRecord, acquired *bool) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	err := s.tx(ctx, func(tx *sql.Tx) error {
		*acquired = false
		if err := try(tx, time.Now()); err != nil {
			return err
		}
		if *acquired {
			st, err := s.stmt(ctx, s.q.turnLeave)
			if err != nil {
				return err
			}
			_, err = tx.StmtContext(ctx, st).ExecContext(ctx, s.withNS(turnArgs(sk, owner, nowMs()))...)
			return err
		}
		r, err := scanLock(s.queryRow(ctx, tx, s.q.lockHolder, sql.Named("key", sk)), key)
		if err != nil {
			return fmt.Errorf("sqlite: lock not acquired but no holder found: %w", err)
		}
		*rec = r
		return nil
	})
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	if *acquired {
		s.turns.remove(turnKey{sk, owner})
	}
	return *rec, *acquired, nil
}

// Refresh implements driver.Locks.
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	var rec driver.LockRecord
	var ok bool
	err := s.write(ctx, func() error {
		now := nowMs()
		r, err := scanLock(s.queryRow(ctx, nil, s.q.lockRefresh,
			sql.Named("key", s.lockPfx+key), sql.Named("owner", owner), sql.Named("token", token),
			sql.Named("now", now), sql.Named("exp", now+driver.Millis(ttl))), key)
		switch {
		case err == nil:
			rec, ok = r, true
		case errors.Is(err, sql.ErrNoRows):
		default:
			return err
		}
		return nil
	})
	return rec, ok, err
}

// Release implements driver.Locks. The record is kept, marked released, so
// that the next holder's token continues from it.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	s := l.s
	return s.execOK(ctx, s.q.lockRelease, func(now int64) []any {
		return []any{sql.Named("key", s.lockPfx+key), sql.Named("owner", owner), sql.Named("token", token), sql.Named("now", now)}
	})
}

// ForceRelease implements driver.Locks.
func (l locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	s := l.s
	return s.execOK(ctx, s.q.lockForce, func(now int64) []any {
		return []any{sql.Named("key", s.lockPfx+key), sql.Named("now", now)}
	})
}

// Get implements driver.Locks.
func (l locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	s := l.s
	rec, err := scanLock(s.readRow(ctx, s.q.lockGet, sql.Named("key", s.lockPfx+key), sql.Named("now", nowMs())), key)
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
	cond, args := s.nsRange("key", s.lockPfx+pattern.Prefix())
	args = append(args, pattern.SQLiteGlob(s.lockPfx), nowMs())
	rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.lockList, cond), args...)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []driver.LockRecord
	for rows.Next() {
		var sk string
		var owner sql.NullString
		var token, acquired, expires sql.NullInt64
		if err := rows.Scan(&sk, &owner, &token, &acquired, &expires); err != nil {
			return nil, ctxErr(ctx, err)
		}
		key, ok := strings.CutPrefix(sk, s.lockPfx)
		if !ok || !pattern.Match(key) {
			continue
		}
		out = append(out, driver.LockRecord{Key: key, Owner: owner.String, Token: token.Int64,
			AcquiredAt: nullMsTime(acquired), ExpiresAt: nullMsTime(expires)})
	}
	return out, ctxErr(ctx, rows.Err())
}

// execCount runs one write statement, with arguments made from the store
// clock read once the process's write turn has come, and returns the
// number of rows it changed (not counting rows changed by triggers).
func (s *store) execCount(ctx context.Context, query string, args func(now int64) []any) (int64, error) {
	var n int64
	err := s.write(ctx, func() error {
		res, err := s.exec(ctx, query, args(nowMs())...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// execOK is execCount reporting whether a row changed.
func (s *store) execOK(ctx context.Context, query string, args func(now int64) []any) (bool, error) {
	n, err := s.execCount(ctx, query, args)
	return n > 0, err
}
