package driver

import (
	"context"
	"time"
)

// Records is the driver of package recordlock: locks kept in the fields of
// the user's own records (documents, rows, items) in the user's own
// collection or table. F is the store's native filter type for Claim (a
// BSON filter, an SQL WHERE fragment with arguments, a DynamoDB query).
//
// A record's lock lives in three fields the driver's options name
// (defaults lockedUntil / lockedBy / lockToken, locked_until / locked_by /
// lock_token in SQL): the expiry, the holder and the last fencing token
// issued for the record. A record is locked while its holder field is set
// and its expiry is after the store's clock. Every method is one atomic
// conditional operation on the record (one round trip where the database
// allows it), decided by the database's clock where the database has one
// inside the statement. A driver never creates a record, never deletes
// one and never writes a field other than the three lock fields.
//
// ids are the user's own record ids, of the types the driver documents;
// CheckID refuses the others before any I/O. An id is always compared as
// a value (a bound parameter, a $eq), never interpreted as a query.
type Records[F any] interface {
	RecordAdmin
	// Lock locks record id for owner for d if the record exists and is
	// not locked (no holder, or an expiry at or before now): holder =
	// owner, expiry = now + d, token = previous token + 1 (1 for a record
	// never locked). found is false if no record has that id (nothing is
	// written); acquired is false if the record is locked, and rec then
	// describes its holding.
	Lock(ctx context.Context, id any, owner string, d time.Duration) (rec RecordLock, found, acquired bool, err error)
	// Extend sets the expiry of a live holding (holder owner, token, not
	// expired) to the later of its expiry and now + d — never earlier, so
	// that an extension reaching the server after a later, longer one
	// cannot shorten the holding — and reports ok true. ok false: no such
	// live holding; rec is the record's lock state then (found false if
	// the record is gone).
	Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (rec RecordLock, found, ok bool, err error)
	// Release clears the holder and expiry of the holding (holder owner,
	// token), expired or not; the token stays. ok false: no such holding.
	Release(ctx context.Context, id any, owner string, token int64) (ok bool, err error)
	// Claim locks, as Lock does, one record that matches filter and is
	// not locked — the first in the filter's order (or the id's) — so
	// that concurrent claims never take the same record. claimed false:
	// no such record.
	Claim(ctx context.Context, filter F, owner string, d time.Duration) (rec RecordLock, claimed bool, err error)
}

// RecordAdmin is the part of a records driver that needs no filter: what
// operators use to inspect and clear record locks (warden record …).
type RecordAdmin interface {
	// Backend is the store's short name: "sqlite", "mongodb", …
	Backend() string
	// Table names the collection or table, for messages.
	Table() string
	// CheckID reports an id the driver cannot use (wrong type, empty,
	// too long) with an error wrapping warden.ErrInvalidArgument.
	CheckID(id any) error
	// ForceRelease clears the holder and expiry whoever holds the record,
	// for operators. It returns the state it cleared.
	ForceRelease(ctx context.Context, id any) (rec RecordLock, found bool, err error)
	// Get returns the record's lock state.
	Get(ctx context.Context, id any) (rec RecordLock, found bool, err error)
	// List returns the records whose lock is live, at most limit (> 0), in
	// id order, for operators.
	List(ctx context.Context, limit int) ([]RecordLock, error)
}

// RecordLock is the lock state of one record.
type RecordLock struct {
	// ID is the record's id as the store holds it.
	ID any
	// Owner is the holder ("" if the record is not locked or was
	// released).
	Owner string
	// Until is the holding's expiry on the store's clock (zero if never
	// locked or released).
	Until time.Time
	// Token is the last fencing token issued for the record (0: never
	// locked).
	Token int64
	// Now is the store's clock when the state was read, so that the
	// portable layer decides "live" by the clock that decides expiry.
	Now time.Time
}

// Live reports whether the holding was live when read: a holder and an
// expiry after the store's clock.
func (r RecordLock) Live() bool { return r.Owner != "" && r.Until.After(r.Now) }

// RecordTables is the optional capability of stores that can reach the
// user's own tables through their connection, so that operators' tools
// (warden record …) can inspect and clear record locks given only the
// store's URL. It is discovered by type assertion on [Store].
type RecordTables interface {
	// RecordTable returns the record-lock driver's admin part over table
	// (a table or collection of the store's database) with fields naming
	// its id and lock fields. It does no I/O.
	RecordTable(table string, fields RecordFields) (RecordAdmin, error)
}

// RecordFields names a table's id and lock fields; "" gives the store's
// defaults.
type RecordFields struct {
	ID, Until, Owner, Token string
}
