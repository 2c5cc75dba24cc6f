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

// idempotency is the idempotency-key driver.
type idempotency struct{ s *store }

// scan reads a record; with code, the row is preceded by @warden_out.
func (i idempotency) scan(r rowScanner, code ...*int64) (driver.IdemRecord, error) {
	var (
		sk, owner, fp, result []byte
		status                string
		created, expires      sql.NullTime
	)
	dest := []any{&sk, &status, &owner, &fp, &result, &created, &expires}
	if len(code) > 0 {
		dest = append([]any{code[0]}, dest...)
	}
	if err := r.Scan(dest...); err != nil {
		return driver.IdemRecord{}, err
	}
	st := driver.IdemStatus(status)
	if st != driver.IdemPending {
		st = driver.IdemCompleted
		result = nonNil(result)
	} else {
		result = nil
	}
	return driver.IdemRecord{
		Key: strings.TrimPrefix(string(sk), i.s.prefix), Status: st, Owner: string(owner), Fingerprint: string(fp),
		Result: result, CreatedAt: utc(created), ExpiresAt: utc(expires),
	}, nil
}

// Claim implements driver.Idempotency in two round trips on one
// connection: one upsert that decides on the old row and leaves the
// outcome in @warden_out, then a read of it and of the row.
func (i idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := i.s
	sk := s.prefix + key
	var code int64
	var rec driver.IdemRecord
	err := s.outcome(ctx, nil, s.q.idemClaim, []any{s.prefix, sk, owner, []byte(fingerprint), usec(lease)}, func(q querier) (err error) {
		rec, err = i.scan(q.QueryRowContext(ctx, s.q.idemClaimRow, s.prefix, sk), &code)
		if err != nil {
			return fmt.Errorf("mysql: reading the claim: %w", err)
		}
		return nil
	})
	if err != nil {
		return driver.IdemRecord{}, 0, ctxErr(ctx, err)
	}
	var out driver.ClaimOutcome
	switch code {
	case 1, 5:
		out = driver.Claimed
	case 2:
		out = driver.TakenOver
	case 3:
		out = driver.InProgress
	case 4:
		out = driver.Completed
	default:
		return driver.IdemRecord{}, 0, fmt.Errorf("mysql: unexpected claim outcome %d", code)
	}
	return rec, out, nil
}

// Extend implements driver.Idempotency.
func (i idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	var n int64
	err := retry(ctx, func() (err error) {
		n, err = i.s.marked(ctx, i.s.db, i.s.q.idemExtend, usec(lease), i.s.prefix, i.s.prefix+key, owner)
		return err
	})
	return n == 1, err
}

// Complete implements driver.Idempotency.
func (i idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	n, err := i.s.execCount(ctx, i.s.q.idemComplete, nonNil(result), usec(retain), i.s.prefix, i.s.prefix+key, owner)
	return n > 0, err
}

// Abandon implements driver.Idempotency.
func (i idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	n, err := i.s.execCount(ctx, i.s.q.idemAbandon, i.s.prefix, i.s.prefix+key, owner)
	return n > 0, err
}

// Get implements driver.Idempotency.
func (i idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	rec, err := i.scan(i.s.db.QueryRowContext(ctx, i.s.q.idemGet, i.s.prefix, i.s.prefix+key))
	if errors.Is(err, sql.ErrNoRows) {
		return driver.IdemRecord{}, false, nil
	}
	if err != nil {
		return driver.IdemRecord{}, false, ctxErr(ctx, err)
	}
	return rec, true, nil
}

// Set implements driver.Idempotency in one upsert.
func (i idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	_, err := i.s.exec(ctx, i.s.q.idemSet, i.s.prefix, i.s.prefix+key, nonNil(result), usec(ttl))
	return err
}

// Delete implements driver.Idempotency: it deletes the live record.
func (i idempotency) Delete(ctx context.Context, key string) (bool, error) {
	n, err := i.s.execCount(ctx, i.s.q.idemDelete, i.s.prefix, i.s.prefix+key)
	return n > 0, err
}

// List implements driver.Idempotency.
func (i idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	var out []driver.IdemRecord
	err := i.s.list(ctx, i.s.q.idemList, "`key`", i.s.prefix, pattern, func(rows *sql.Rows) error {
		rec, err := i.scan(rows)
		if err != nil {
			return err
		}
		if pattern.Match(rec.Key) {
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}
