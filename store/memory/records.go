package memory

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// RecordTable is an in-process table of records for package recordlock:
// the reference driver of driver.Records, for tests of code that locks its
// own records. Records have a string id and fields of any value; the lock
// is kept beside the fields (the fields given to Insert are never
// written by a lock). The clock is the process's, in milliseconds. Its
// methods are safe for concurrent use.
type RecordTable struct {
	name string
	mu   sync.Mutex
	rows map[string]*memRecord
}

type memRecord struct {
	fields map[string]any
	lock   driver.RecordLock
}

// RecordFilter is Claim's filter on a RecordTable: Match selects records
// by their fields (nil: all), Less orders them (nil: by id).
type RecordFilter struct {
	Match func(id string, fields map[string]any) bool
	Less  func(a, b map[string]any) bool
}

// NewRecordTable returns an empty table called name.
func NewRecordTable(name string) *RecordTable {
	return &RecordTable{name: name, rows: map[string]*memRecord{}}
}

// Insert adds or replaces record id with a copy of fields, keeping its
// lock state.
func (t *RecordTable) Insert(id string, fields map[string]any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.rows[id]; ok {
		r.fields = maps.Clone(fields)
		return
	}
	t.rows[id] = &memRecord{fields: maps.Clone(fields), lock: driver.RecordLock{ID: id}}
}

// Fields returns a copy of record id's fields.
func (t *RecordTable) Fields(id string) (map[string]any, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id]
	if !ok {
		return nil, false
	}
	return maps.Clone(r.fields), true
}

// Delete removes record id.
func (t *RecordTable) Delete(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.rows, id)
}

// Len returns the number of records.
func (t *RecordTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// Backend returns "memory".
func (t *RecordTable) Backend() string { return "memory" }

// Table returns the table's name.
func (t *RecordTable) Table() string { return t.name }

// CheckID accepts non-empty UTF-8 strings of at most driver.MaxKeyBytes.
func (t *RecordTable) CheckID(id any) error {
	s, ok := id.(string)
	switch {
	case !ok:
		return fmt.Errorf("memory: record id %T: ids are strings: %w", id, warden.ErrInvalidArgument)
	case s == "" || len(s) > driver.MaxKeyBytes || !utf8.ValidString(s):
		return fmt.Errorf("memory: record id %.40q: empty, over %d bytes or not UTF-8: %w", s, driver.MaxKeyBytes, warden.ErrInvalidArgument)
	}
	return nil
}

func (r *memRecord) state(now time.Time) driver.RecordLock {
	l := r.lock
	l.Now = now
	return l
}

func (r *memRecord) free(now time.Time) bool {
	return r.lock.Owner == "" || !r.lock.Until.After(now)
}

func (r *memRecord) take(owner string, d time.Duration, now time.Time) driver.RecordLock {
	r.lock.Owner, r.lock.Until = owner, now.Add(d)
	r.lock.Token++
	return r.state(now)
}

// Lock implements driver.Records.
func (t *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id.(string)]
	if !ok {
		return driver.RecordLock{}, false, false, nil
	}
	n := now()
	if !r.free(n) {
		return r.state(n), true, false, nil
	}
	return r.take(owner, d, n), true, true, nil
}

// Extend implements driver.Records.
func (t *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.RecordLock{}, false, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id.(string)]
	if !ok {
		return driver.RecordLock{}, false, false, nil
	}
	n := now()
	if r.lock.Owner != owner || r.lock.Token != token || !r.lock.Until.After(n) {
		return r.state(n), true, false, nil
	}
	if u := n.Add(d); u.After(r.lock.Until) {
		r.lock.Until = u // never earlier: see driver.Records.Extend
	}
	return r.state(n), true, true, nil
}

// Release implements driver.Records.
func (t *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id.(string)]
	if !ok || r.lock.Owner != owner || r.lock.Token != token {
		return false, nil
	}
	r.lock.Owner, r.lock.Until = "", time.Time{}
	return true, nil
}

// ForceRelease implements driver.Records.
func (t *RecordTable) ForceRelease(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.RecordLock{}, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id.(string)]
	if !ok {
		return driver.RecordLock{}, false, nil
	}
	was := r.state(now())
	r.lock.Owner, r.lock.Until = "", time.Time{}
	return was, true, nil
}

// Get implements driver.Records.
func (t *RecordTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.RecordLock{}, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[id.(string)]
	if !ok {
		return driver.RecordLock{}, false, nil
	}
	return r.state(now()), true, nil
}

// Claim implements driver.Records.
func (t *RecordTable) Claim(ctx context.Context, f RecordFilter, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	if err := ctx.Err(); err != nil {
		return driver.RecordLock{}, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	var best *memRecord
	var bestID string
	for id, r := range t.rows {
		if !r.free(n) || (f.Match != nil && !f.Match(id, r.fields)) {
			continue
		}
		if best == nil || t.before(f, id, r, bestID, best) {
			best, bestID = r, id
		}
	}
	if best == nil {
		return driver.RecordLock{}, false, nil
	}
	return best.take(owner, d, n), true, nil
}

func (t *RecordTable) before(f RecordFilter, aID string, a *memRecord, bID string, b *memRecord) bool {
	if f.Less != nil {
		if f.Less(a.fields, b.fields) {
			return true
		}
		if f.Less(b.fields, a.fields) {
			return false
		}
	}
	return aID < bID
}

// List implements driver.Records.
func (t *RecordTable) List(ctx context.Context, limit int) ([]driver.RecordLock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := now()
	var out []driver.RecordLock
	for _, r := range t.rows {
		if s := r.state(n); s.Live() {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b driver.RecordLock) int { return cmp.Compare(a.ID.(string), b.ID.(string)) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

var _ driver.Records[RecordFilter] = (*RecordTable)(nil)
