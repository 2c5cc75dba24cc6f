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
//
// Hand-off (handoff.go): both statements run on a connection kept for
// the holding, the upsert taking the key's named lock too (never
// waiting), given back at once when the row was not won; when owner's
// turn came in WaitLock, they run on the connection
// holding its named lock. Without a connection to spare, the statements
// run on the pool and the holding has no named lock (its waiters poll).
// Either way a row just released and handed to a queued waiter is left
// to that waiter.
func (l locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s, h := l.s, l.s.ho
	sk := s.lockPfx + key
	name := h.lockName(sk)
	sent := time.Now()
	if t := h.take(sk, owner); t != nil {
		// Owner holds the named lock: its turn came, or it holds the key.
		rec, acquired, ours, err := l.acquireOn(ctx, t.conn, false, sk, key, owner, ttl, name)
		h.mu.Lock()
		holding := t.token != 0
		h.mu.Unlock()
		switch {
		case err != nil || !ours || (!acquired && holding):
			// A broken connection, a named lock lost, or owner's holding
			// lost: let the session (and its named lock) go.
			h.drop(t, true)
		case acquired:
			h.mu.Lock()
			h.hold(t, rec.Token, sent.Add(ttl))
			h.mu.Unlock()
			h.done(t)
		default:
			h.done(t) // keep the turn: the holder is outside the queue
		}
		return rec, acquired, ctxErr(ctx, err)
	}
	var (
		rec      driver.LockRecord
		acquired bool
	)
	err := retry(ctx, func() error {
		c, _ := h.conn(ctx)
		if c == nil {
			var err error
			rec, acquired, err = l.acquirePool(ctx, sk, key, owner, ttl, name)
			return err
		}
		var ours bool
		var err error
		rec, acquired, ours, err = l.acquireOn(ctx, c, true, sk, key, owner, ttl, name)
		switch {
		case err != nil:
			h.put(c, true)
		case acquired && ours:
			h.add(sk, owner, name, c, rec.Token, sent.Add(ttl))
		default:
			// The named lock was not taken, or given back.
			h.put(c, false)
		}
		return err
	})
	return rec, acquired, err
}

// acquireOn runs the acquire on c: the upsert, then the read. gate: the
// upsert tries to take the key's named lock too, and ours reports that it
// did and that the session still holds it: given back at once (one more
// round trip, only then) when the row was not won. Without gate the
// session holds the named lock already (owner's turn or holding), and
// ours is true.
func (l locks) acquireOn(ctx context.Context, c *sql.Conn, gate bool, sk, key, owner string, ttl time.Duration, name string) (driver.LockRecord, bool, bool, error) {
	s := l.s
	q, args := s.q.lockAcquire, []any{s.prefix, sk, owner, usec(ttl)}
	if gate {
		q = s.q.lockAcquireN
		args = append(args, name)
	}
	args = append(args, name, usec(handoffGrace))
	if _, err := c.ExecContext(ctx, q, args...); err != nil {
		return driver.LockRecord{}, false, false, err
	}
	var owned []byte
	var token int64
	var acq, exp, rel sql.NullTime
	var live bool
	var n sql.NullInt64
	var err error
	if gate {
		err = c.QueryRowContext(ctx, s.q.lockRead, s.prefix, sk).Scan(&owned, &token, &acq, &exp, &rel, &live, &n)
	} else {
		err = c.QueryRowContext(ctx, s.q.lockRowLive, s.prefix, sk).Scan(&owned, &token, &acq, &exp, &rel, &live)
	}
	if err != nil {
		return driver.LockRecord{}, false, false, fmt.Errorf("mysql: reading the lock after acquiring: %w", err)
	}
	rec := driver.LockRecord{Key: key, Owner: string(owned), Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)}
	acquired := owned != nil && string(owned) == owner && live
	if !gate {
		return rec, acquired, true, nil
	}
	ours := n.Valid && n.Int64 == 1
	if ours && !acquired {
		if _, err := c.ExecContext(ctx, "DO RELEASE_LOCK(?)", name); err != nil {
			return rec, false, true, err
		}
		ours = false
	}
	return rec, acquired, ours, nil
}

// acquirePool is the acquire on the pool, without the named lock.
func (l locks) acquirePool(ctx context.Context, sk, key, owner string, ttl time.Duration, name string) (driver.LockRecord, bool, error) {
	s := l.s
	if _, err := s.db.ExecContext(ctx, s.q.lockAcquire, s.prefix, sk, owner, usec(ttl), name, usec(handoffGrace)); err != nil {
		return driver.LockRecord{}, false, err
	}
	var owned []byte
	var token int64
	var acq, exp, rel sql.NullTime
	var live bool
	err := s.db.QueryRowContext(ctx, s.q.lockRowLive, s.prefix, sk).Scan(&owned, &token, &acq, &exp, &rel, &live)
	if err != nil {
		return driver.LockRecord{}, false, fmt.Errorf("mysql: reading the lock after acquiring: %w", err)
	}
	rec := driver.LockRecord{Key: key, Owner: string(owned), Token: token, AcquiredAt: utc(acq), ExpiresAt: utc(exp)}
	return rec, owned != nil && string(owned) == owner && live, nil
}

// Refresh implements driver.Locks: one conditional update, then a read.
// A holding with a named lock keeps it while refreshes succeed, and gives
// it up when one is refused.
func (l locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s
	sk := s.lockPfx + key
	sent := time.Now()
	var n int64
	err := retry(ctx, func() (err error) {
		n, err = s.marked(ctx, s.db, s.q.lockRefresh, usec(ttl), s.prefix, sk, owner, token)
		return err
	})
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	if n != 1 {
		s.ho.refreshed(sk, owner, token, false, time.Time{})
		return driver.LockRecord{}, false, nil
	}
	rec, _, err := scanLock(s.db.QueryRowContext(ctx, s.q.lockRow, s.prefix, sk), key)
	if err != nil {
		return driver.LockRecord{}, false, ctxErr(ctx, err)
	}
	ok := rec.Owner == owner && rec.Token == token
	s.ho.refreshed(sk, owner, token, ok, sent.Add(ttl))
	return rec, ok, nil
}

// Release implements driver.Locks. The row is kept, marked released, so
// that the next holder's token continues from it. A holding with a named
// lock is released on its connection, with the named lock, in one
// statement; if that connection fails (killed, cut), the holding is
// ended through the pool — the row decides, not the session.
func (l locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	s, h := l.s, l.s.ho
	sk := s.lockPfx + key
	if t := h.take(sk, owner); t != nil {
		h.mu.Lock()
		mine := t.token == token
		h.mu.Unlock()
		if !mine {
			h.done(t)
		} else {
			res, err := t.conn.ExecContext(ctx, s.q.lockReleaseN, t.name, t.name, s.prefix, sk, owner, token)
			var n int64
			if err == nil {
				n, err = res.RowsAffected()
			}
			if err == nil {
				if n == 0 {
					// Not held any more: the statement left the named
					// lock alone.
					_, err = t.conn.ExecContext(ctx, "DO RELEASE_LOCK(?)", t.name)
				}
				h.drop(t, err != nil)
				return n > 0, nil
			}
			h.drop(t, true)
			if ctx.Err() != nil {
				return false, ctxErr(ctx, err)
			}
			return l.releaseResolve(ctx, sk, key, owner, token)
		}
	}
	n, err := s.execCount(ctx, s.q.lockRelease, s.prefix, sk, owner, token)
	return n > 0, err
}

// releaseResolve ends owner's holding through the pool after a release on
// its own connection failed, which may or may not have applied: a row
// still showing that holding, released, counts as released.
func (l locks) releaseResolve(ctx context.Context, sk, key, owner string, token int64) (bool, error) {
	s := l.s
	n, err := s.execCount(ctx, s.q.lockRelease, s.prefix, sk, owner, token)
	if err != nil || n > 0 {
		return n > 0, err
	}
	rec, released, err := scanLock(s.db.QueryRowContext(ctx, s.q.lockRow, s.prefix, sk), key)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	return released && rec.Owner == owner && rec.Token == token, nil
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
