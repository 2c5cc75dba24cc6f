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

// idempotency is the idempotency-key driver.
type idempotency struct{ s *store }

// idemRow is a row of the idempotency table.
type idemRow struct {
	rec     driver.IdemRecord
	expires sql.NullInt64
}

func (i idempotency) scan(r rowScanner) (idemRow, bool, error) {
	var (
		key, status, owner, fp sql.NullString
		result                 []byte
		created, expires       sql.NullInt64
	)
	if err := r.Scan(&key, &status, &owner, &fp, &result, &created, &expires); err != nil {
		return idemRow{}, false, err
	}
	k, ok := strings.CutPrefix(key.String, i.s.cfg.prefix)
	st := driver.IdemStatus(status.String)
	if st != driver.IdemPending {
		st = driver.IdemCompleted
	}
	if st == driver.IdemCompleted {
		result = nonNil(result)
	} else {
		result = nil
	}
	return idemRow{
		rec: driver.IdemRecord{
			Key:         k,
			Status:      st,
			Owner:       owner.String,
			Fingerprint: fp.String,
			Result:      result,
			CreatedAt:   nullMsTime(created),
			ExpiresAt:   nullMsTime(expires),
		},
		expires: expires,
	}, ok, nil
}

// Claim implements driver.Idempotency in one IMMEDIATE transaction: the
// record is read and the claim written while SQLite's write lock is held,
// so exactly one of concurrent claimers wins.
func (i idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := i.s
	sk := s.cfg.prefix + key
	var rec driver.IdemRecord
	var out driver.ClaimOutcome
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := nowMs()
		args := []any{sql.Named("key", sk), sql.Named("owner", owner), sql.Named("fp", fingerprint),
			sql.Named("now", now), sql.Named("exp", now+driver.Millis(lease))}
		cur, _, err := i.scan(s.queryRow(ctx, tx, s.q.idemGetAny, sql.Named("key", sk)))
		var query string
		switch {
		case errors.Is(err, sql.ErrNoRows):
			query, out = s.q.idemInsert, driver.Claimed
		case err != nil:
			return err
		case cur.expires.Valid && cur.expires.Int64 <= now:
			// Lapsed: a new claim, even by the same owner (its lease was
			// lost in between).
			query, out = s.q.idemReclaim, driver.Claimed
			if cur.rec.Status == driver.IdemPending {
				out = driver.TakenOver
			}
		case cur.rec.Status == driver.IdemPending && cur.rec.Owner == owner:
			query, out = s.q.idemRenew, driver.Claimed
		case cur.rec.Status == driver.IdemPending:
			rec, out = cur.rec, driver.InProgress
			return nil
		default:
			rec, out = cur.rec, driver.Completed
			return nil
		}
		r, _, err := i.scan(s.queryRow(ctx, tx, query, args...))
		if err != nil {
			return err
		}
		rec = r.rec
		return nil
	})
	if err != nil {
		return driver.IdemRecord{}, 0, err
	}
	return rec, out, nil
}

// Extend implements driver.Idempotency.
func (i idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	return i.s.execOK(ctx, i.s.q.idemExtend, func(now int64) []any {
		return []any{sql.Named("key", i.s.cfg.prefix+key), sql.Named("owner", owner),
			sql.Named("now", now), sql.Named("exp", now+driver.Millis(lease))}
	})
}

// Complete implements driver.Idempotency.
func (i idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	return i.s.execOK(ctx, i.s.q.idemComplete, func(now int64) []any {
		return []any{sql.Named("key", i.s.cfg.prefix+key), sql.Named("owner", owner), sql.Named("result", nonNil(result)),
			sql.Named("now", now), sql.Named("exp", expiry(now, retain))}
	})
}

// Abandon implements driver.Idempotency.
func (i idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	return i.s.execOK(ctx, i.s.q.idemAbandon, func(int64) []any {
		return []any{sql.Named("key", i.s.cfg.prefix+key), sql.Named("owner", owner)}
	})
}

// Get implements driver.Idempotency.
func (i idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	r, _, err := i.scan(i.s.readRow(ctx, i.s.q.idemGet, sql.Named("key", i.s.cfg.prefix+key), sql.Named("now", nowMs())))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.IdemRecord{}, false, nil
	}
	if err != nil {
		return driver.IdemRecord{}, false, ctxErr(ctx, err)
	}
	return r.rec, true, nil
}

// Set implements driver.Idempotency in one upsert.
func (i idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	_, err := i.s.execCount(ctx, i.s.q.idemSet, func(now int64) []any {
		return []any{sql.Named("key", i.s.cfg.prefix+key), sql.Named("result", nonNil(result)),
			sql.Named("now", now), sql.Named("exp", expiry(now, ttl))}
	})
	return err
}

// Delete implements driver.Idempotency: it deletes the row and reports
// whether it was live.
func (i idempotency) Delete(ctx context.Context, key string) (bool, error) {
	var live bool
	err := i.s.write(ctx, func() error {
		err := i.s.queryRow(ctx, nil, i.s.q.idemDelete, sql.Named("key", i.s.cfg.prefix+key), sql.Named("now", nowMs())).Scan(&live)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	return live, err
}

// List implements driver.Idempotency.
func (i idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	s := i.s
	cond, args := s.nsRange("key", s.cfg.prefix+pattern.Prefix())
	args = append(args, pattern.SQLiteGlob(s.cfg.prefix), nowMs())
	rows, err := s.readQuery(ctx, fmt.Sprintf(s.q.idemList, cond), args...)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []driver.IdemRecord
	for rows.Next() {
		r, ok, err := i.scan(rows)
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		if ok && pattern.Match(r.rec.Key) {
			out = append(out, r.rec)
		}
	}
	return out, ctxErr(ctx, rows.Err())
}
