package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// locks is the lock driver.
type locks struct{ s *store }

// errRace is returned by a statement that lost a race to a concurrent
// first insert of its row and must run again.
var errRace = errors.New("postgres: lost a race to a concurrent insert")

// raceAttempts bounds how often a statement that lost such a race runs
// again (each loss means another caller created the row meanwhile).
const raceAttempts = 10

// Acquire implements driver.Locks in one statement: the current row is
// locked, then upserted only when the lock is free (absent, released or
// expired) or held live by owner; the statement returns the new holding,
// or the current holder's, and notifies watchers of a new holding.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	for range raceAttempts {
		var rec driver.LockRecord
		var own sql.NullString
		var acq, exp sql.NullTime
		var acquired bool
		var events int64
		found, err := s.row(ctx, s.q.lockAcquire, []any{s.prefix, s.lockPfx + key, owner, driver.Millis(ttl)},
			&own, &rec.Token, &acq, &exp, &acquired, &events)
		if err != nil {
			return driver.LockRecord{}, false, err
		}
		if !found {
			continue
		}
		rec.Key, rec.Owner, rec.AcquiredAt, rec.ExpiresAt = key, own.String, utc(acq), utc(exp)
		return rec, acquired, nil
	}
	return driver.LockRecord{}, false, errRace
}

// Refresh implements driver.Locks in one conditional update.
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	var own sql.NullString
	var rec driver.LockRecord
	var acq, exp sql.NullTime
	found, err := s.row(ctx, s.q.lockRefresh, []any{s.prefix, s.lockPfx + key, owner, token, driver.Millis(ttl)},
		&own, &rec.Token, &acq, &exp)
	if err != nil || !found {
		return driver.LockRecord{}, false, err
	}
	rec.Key, rec.Owner, rec.AcquiredAt, rec.ExpiresAt = key, own.String, utc(acq), utc(exp)
	return rec, true, nil
}

// Release implements driver.Locks in one statement. The row is kept,
// marked released (its expiry moved back to now), so that the next
// holder's token continues from it.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	s := l.s
	var n, events int64
	_, err := s.row(ctx, s.q.lockRelease, []any{s.prefix, s.lockPfx + key, owner, token}, &n, &events)
	return n > 0, err
}

// ForceRelease implements driver.Locks.
func (l locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	s := l.s
	var n, events int64
	_, err := s.row(ctx, s.q.lockForce, []any{s.prefix, s.lockPfx + key}, &n, &events)
	return n > 0, err
}

// Get implements driver.Locks.
func (l locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	s := l.s
	var own sql.NullString
	var rec driver.LockRecord
	var acq, exp sql.NullTime
	found, err := s.row(ctx, s.q.lockGet, []any{s.prefix, s.lockPfx + key}, &own, &rec.Token, &acq, &exp)
	if err != nil || !found {
		return driver.LockRecord{}, false, err
	}
	rec.Key, rec.Owner, rec.AcquiredAt, rec.ExpiresAt = key, own.String, utc(acq), utc(exp)
	return rec, true, nil
}

// List implements driver.Locks.
func (l locks) List(ctx context.Context, pattern driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s
	var out []driver.LockRecord
	err := s.list(ctx, s.q.lockList, s.lockPfx, pattern, func(rows rowsIter) (string, error) {
		var sk string
		var own sql.NullString
		var token int64
		var acq, exp sql.NullTime
		if err := rows.Scan(&sk, &own, &token, &acq, &exp); err != nil {
			return "", err
		}
		if key, ok := strings.CutPrefix(sk, s.lockPfx); ok && pattern.Match(key) {
			out = append(out, driver.LockRecord{Key: key, Owner: own.String, Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)})
		}
		return sk, nil
	})
	return out, err
}

// list runs a listing query page by page (keyset pagination on the
// stored key): the namespace, the key range and LIKE pattern for pattern
// under pfx, and the last key of the previous page. each scans one row
// and returns its stored key. Pages are not retried (a read does not fail
// with a serialization error, and each has already seen the rows).
func (s *store) list(ctx context.Context, query, pfx string, pattern driver.Pattern, each func(rowsIter) (string, error)) error {
	lo, hi := keyRange(pfx + pattern.Prefix())
	like := pattern.Like(pfx, '!')
	after := ""
	for {
		n, err := s.page(ctx, query, []any{s.prefix, lo, hi, like, after}, func(rows rowsIter) error {
			k, err := each(rows)
			after = k
			return err
		})
		if err != nil {
			return s.wrap(ctx, err)
		}
		if n < listPage {
			return nil
		}
	}
}

// page runs one listing query and calls each for every row; it returns
// how many rows there were.
func (s *store) page(ctx context.Context, query string, args []any, each func(rowsIter) error) (int, error) {
	rows, err := s.db.query(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		if err := each(rows); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}

// listPage is the page size of listings.
const listPage = 500
