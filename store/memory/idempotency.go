package memory

import (
	"context"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// idemLive reports whether an idempotency record counts: a pending claim
// within its lease, a completed result within its retention.
func idemLive(r *driver.IdemRecord, now time.Time) bool {
	if r.Status == driver.IdemCompleted && r.ExpiresAt.IsZero() {
		return true
	}
	return r.ExpiresAt.After(now)
}

// idemCopy returns a copy of r that shares no memory with the store.
func idemCopy(r *driver.IdemRecord) driver.IdemRecord {
	c := *r
	c.Result = clone(r.Result)
	return c
}

// idempotency is the store's idempotency driver.
type idempotency store

func (i *idempotency) s() *store { return (*store)(i) }

// Claim claims key for owner; see driver.Idempotency.
func (i *idempotency) Claim(ctx context.Context, key, owner string, lease time.Duration, fingerprint string) (driver.IdemRecord, driver.ClaimOutcome, error) {
	s := i.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.IdemRecord{}, 0, err
	}
	defer s.end()
	outcome := driver.Claimed
	if r := sp.idem[key]; r != nil {
		live := idemLive(r, now)
		switch {
		case r.Status == driver.IdemCompleted && live:
			return idemCopy(r), driver.Completed, nil
		case r.Status == driver.IdemPending && !live:
			outcome = driver.TakenOver
		case r.Status == driver.IdemPending && r.Owner == owner:
			r.ExpiresAt = after(now, lease)
			return idemCopy(r), driver.Claimed, nil
		case r.Status == driver.IdemPending:
			return idemCopy(r), driver.InProgress, nil
		}
	}
	r := &driver.IdemRecord{
		Key:         key,
		Status:      driver.IdemPending,
		Owner:       owner,
		Fingerprint: fingerprint,
		CreatedAt:   now,
		ExpiresAt:   after(now, lease),
	}
	sp.idem[key] = r
	return idemCopy(r), outcome, nil
}

// claimant returns key's pending record if owner claims it (lease lapsed
// or not, as long as nobody took it over); db.mu is held.
func claimant(sp *space, key, owner string) *driver.IdemRecord {
	r := sp.idem[key]
	if r == nil || r.Status != driver.IdemPending || r.Owner != owner {
		return nil
	}
	return r
}

// Extend renews owner's pending claim to now+lease.
func (i *idempotency) Extend(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	s := i.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := claimant(sp, key, owner)
	if r == nil {
		return false, nil
	}
	r.ExpiresAt = after(now, lease)
	return true, nil
}

// Complete stores owner's result, kept for retain (0: until deleted).
func (i *idempotency) Complete(ctx context.Context, key, owner string, result []byte, retain time.Duration) (bool, error) {
	s := i.s()
	if err := s.checkValue(result); err != nil {
		return false, err
	}
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := claimant(sp, key, owner)
	if r == nil {
		return false, nil
	}
	r.Status = driver.IdemCompleted
	r.Result = clone(result)
	r.ExpiresAt = expiry(now, retain)
	return true, nil
}

// Abandon deletes owner's pending claim.
func (i *idempotency) Abandon(ctx context.Context, key, owner string) (bool, error) {
	s := i.s()
	sp, _, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	if claimant(sp, key, owner) == nil {
		return false, nil
	}
	delete(sp.idem, key)
	return true, nil
}

// Get returns key's live record.
func (i *idempotency) Get(ctx context.Context, key string) (driver.IdemRecord, bool, error) {
	s := i.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.IdemRecord{}, false, err
	}
	defer s.end()
	r := sp.idem[key]
	if r == nil || !idemLive(r, now) {
		return driver.IdemRecord{}, false, nil
	}
	return idemCopy(r), true, nil
}

// Set stores a completed record, replacing any record.
func (i *idempotency) Set(ctx context.Context, key string, result []byte, ttl time.Duration) error {
	s := i.s()
	if err := s.checkValue(result); err != nil {
		return err
	}
	sp, now, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer s.end()
	sp.idem[key] = &driver.IdemRecord{
		Key:       key,
		Status:    driver.IdemCompleted,
		Result:    clone(result),
		CreatedAt: now,
		ExpiresAt: expiry(now, ttl),
	}
	return nil
}

// Delete removes key's record; ok=false if it had no live record.
func (i *idempotency) Delete(ctx context.Context, key string) (bool, error) {
	s := i.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := sp.idem[key]
	if r == nil {
		return false, nil
	}
	delete(sp.idem, key)
	return idemLive(r, now), nil
}

// List returns the live records whose keys match pattern, sorted by key.
func (i *idempotency) List(ctx context.Context, pattern driver.Pattern) ([]driver.IdemRecord, error) {
	s := i.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	recs := []driver.IdemRecord{}
	for key, r := range sp.idem {
		if idemLive(r, now) && pattern.Match(key) {
			recs = append(recs, idemCopy(r))
		}
	}
	sort.Slice(recs, func(a, b int) bool { return recs[a].Key < recs[b].Key })
	return recs, nil
}
