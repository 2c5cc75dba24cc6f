package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
)

// idempotency is the idempotency-key driver.
type idempotency struct{ s *store }

// idemRow holds the scan targets of one idempotency row.
type idemRow struct {
	sk, status       string
	owner            sql.NullString
	fp, result       []byte
	created, expires sql.NullTime
}

func (r *idemRow) dest() []any {
	return []any{&r.sk, &r.status, &r.owner, &r.fp, &r.result, &r.created, &r.expires}
}

func (i idempotency) record(r *idemRow) driver.IdemRecord {
	st := driver.IdemStatus(r.status)
	result := r.result
	if st != driver.IdemPending {
		st = driver.IdemCompleted
		result = nonNil(result)
	} else {
		result = nil
	}
	return driver.IdemRecord{
		Key: strings.TrimPrefix(r.sk, i.s.prefix), Status: st, Owner: r.owner.String, Fingerprint: string(r.fp),
		Result: result, CreatedAt: utc(r.created), ExpiresAt: utc(r.expires),
	}
}

// Claim implements driver.Idempotency in one statement: the current row
// is locked, then upserted only when the key is free (absent or lapsed)
// or owner's own pending claim; the statement returns the outcome, decided
// on the locked row, and the record.
func (i idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := i.s
	for range raceAttempts {
		var code int64
		var r idemRow
		found, err := s.row(ctx, s.q.idemClaim, []any{s.prefix, s.prefix + key, owner, []byte(fingerprint), driver.Millis(lease)},
			append([]any{&code}, r.dest()...)...)
		if err != nil {
			return driver.IdemRecord{}, 0, err
		}
		if !found {
			continue
		}
		var out driver.ClaimOutcome
		switch code {
		case 1:
			out = driver.Claimed
		case 2:
			out = driver.TakenOver
		case 3:
			out = driver.InProgress
		case 4:
			out = driver.Completed
		default:
			return driver.IdemRecord{}, 0, fmt.Errorf("postgres: unexpected claim outcome %d", code)
		}
		return i.record(&r), out, nil
	}
	return driver.IdemRecord{}, 0, errRace
}

// Extend implements driver.Idempotency.
func (i idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	n, err := i.s.exec(ctx, i.s.q.idemExtend, i.s.prefix, i.s.prefix+key, owner, driver.Millis(lease))
	return n == 1, err
}

// Complete implements driver.Idempotency.
func (i idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	n, err := i.s.exec(ctx, i.s.q.idemComplete, i.s.prefix, i.s.prefix+key, owner, nonNil(result), millis(retain))
	return n > 0, err
}

// Abandon implements driver.Idempotency.
func (i idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	n, err := i.s.exec(ctx, i.s.q.idemAbandon, i.s.prefix, i.s.prefix+key, owner)
	return n > 0, err
}

// Get implements driver.Idempotency.
func (i idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	var r idemRow
	found, err := i.s.row(ctx, i.s.q.idemGet, []any{i.s.prefix, i.s.prefix + key}, r.dest()...)
	if err != nil || !found {
		return driver.IdemRecord{}, false, err
	}
	return i.record(&r), true, nil
}

// Set implements driver.Idempotency in one upsert.
func (i idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	_, err := i.s.exec(ctx, i.s.q.idemSet, i.s.prefix, i.s.prefix+key, nonNil(result), millis(ttl))
	return err
}

// Delete implements driver.Idempotency: it deletes the live record.
func (i idempotency) Delete(ctx context.Context, key string) (bool, error) {
	n, err := i.s.exec(ctx, i.s.q.idemDelete, i.s.prefix, i.s.prefix+key)
	return n > 0, err
}

// List implements driver.Idempotency.
func (i idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	var out []driver.IdemRecord
	err := i.s.list(ctx, i.s.q.idemList, i.s.prefix, pattern, func(rows rowsIter) (string, error) {
		var r idemRow
		if err := rows.Scan(r.dest()...); err != nil {
			return "", err
		}
		if rec := i.record(&r); strings.HasPrefix(r.sk, i.s.prefix) && pattern.Match(rec.Key) {
			out = append(out, rec)
		}
		return r.sk, nil
	})
	return out, err
}
