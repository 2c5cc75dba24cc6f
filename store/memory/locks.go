package memory

import (
	"context"
	"sort"
	"time"

	"github.com/warden-go/warden/driver"
)

// lockRec is one lock record. It is kept after release (held=false) so
// that the next holding's token continues from it.
type lockRec struct {
	owner      string
	token      int64
	acquiredAt time.Time
	expiresAt  time.Time
	held       bool      // false once released or force-released
	releasedAt time.Time // when released; zero while held
}

func (r *lockRec) live(now time.Time) bool { return r.held && r.expiresAt.After(now) }

// idleSince is when the record stopped being held (released or expired).
func (r *lockRec) idleSince() time.Time {
	if r.held {
		return r.expiresAt
	}
	return r.releasedAt
}

func (r *lockRec) record(key string) driver.LockRecord {
	return driver.LockRecord{Key: key, Owner: r.owner, Token: r.token, AcquiredAt: r.acquiredAt, ExpiresAt: r.expiresAt}
}

// locks is the store's lock driver.
type locks store

func (l *locks) s() *store { return (*store)(l) }

// Acquire takes key for owner unless someone else holds it live.
func (l *locks) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	defer s.end()
	r := sp.locks[key]
	switch {
	case r == nil:
		r = &lockRec{token: max(driver.TokenBase(now), sp.lastToken+1)}
		sp.locks[key] = r
	case r.live(now) && r.owner == owner:
		r.expiresAt = after(now, ttl)
		return r.record(key), true, nil
	case r.live(now):
		return r.record(key), false, nil
	default:
		r.token++
	}
	r.owner, r.held, r.releasedAt = owner, true, time.Time{}
	r.acquiredAt, r.expiresAt = now, after(now, ttl)
	sp.lastToken = max(sp.lastToken, r.token)
	rec := r.record(key)
	s.notifyLock(driver.LockEvent{Kind: driver.LockAcquired, Key: key, Owner: owner, Token: r.token, At: now})
	return rec, true, nil
}

// Refresh renews owner's live holding with token.
func (l *locks) Refresh(ctx context.Context, key, owner string, token int64, ttl time.Duration) (driver.LockRecord, bool, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	defer s.end()
	r := sp.locks[key]
	if r == nil || !r.live(now) {
		return driver.LockRecord{}, false, nil
	}
	if r.owner != owner || r.token != token {
		return r.record(key), false, nil
	}
	r.expiresAt = after(now, ttl)
	return r.record(key), true, nil
}

// Release ends owner's holding with token, expired or not, unless someone
// took it over.
func (l *locks) Release(ctx context.Context, key, owner string, token int64) (bool, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := sp.locks[key]
	if r == nil || !r.held || r.owner != owner || r.token != token {
		return false, nil
	}
	l.release(key, r, now)
	return true, nil
}

// ForceRelease ends any live holding of key.
func (l *locks) ForceRelease(ctx context.Context, key string) (bool, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer s.end()
	r := sp.locks[key]
	if r == nil || !r.live(now) {
		return false, nil
	}
	l.release(key, r, now)
	return true, nil
}

// release marks r released and tells the watchers; db.mu is held.
func (l *locks) release(key string, r *lockRec, now time.Time) {
	r.held, r.releasedAt = false, now
	l.s().notifyLock(driver.LockEvent{Kind: driver.LockReleased, Key: key, Owner: r.owner, Token: r.token, At: now})
}

// Get returns the live holding of key.
func (l *locks) Get(ctx context.Context, key string) (driver.LockRecord, bool, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return driver.LockRecord{}, false, err
	}
	defer s.end()
	r := sp.locks[key]
	if r == nil || !r.live(now) {
		return driver.LockRecord{}, false, nil
	}
	return r.record(key), true, nil
}

// List returns the live holdings whose keys match pattern, sorted by key.
func (l *locks) List(ctx context.Context, pattern driver.Pattern) ([]driver.LockRecord, error) {
	s := l.s()
	sp, now, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer s.end()
	recs := []driver.LockRecord{}
	for key, r := range sp.locks {
		if r.live(now) && pattern.Match(key) {
			recs = append(recs, r.record(key))
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Key < recs[j].Key })
	return recs, nil
}
