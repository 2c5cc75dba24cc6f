// Package recordlock locks records of the program's own data — a
// document in its MongoDB collection, a row in its PostgreSQL, MySQL or
// SQLite table, an item in its DynamoDB table — so that one process at a
// time handles each, and turns a table into a work queue that many
// workers drain without two taking the same record. It is
// mongoose-lock-release for Go, fenced and millisecond-precise.
//
// The lock lives in three fields of the record itself (by default
// lockedUntil, lockedBy and lockToken; locked_until, locked_by and
// lock_token in SQL): the holding's expiry, its holder and the last
// fencing token issued for the record. recordlock never creates a record
// — locking an id no record has gives ErrNotFound — and never writes any
// other field. Each store's record driver adds the fields and the index
// Claim needs (Migrate), or prints the migration for those who run
// their own (Migration).
//
//	rt, err := sqlite.Records(db, "invoices", nil) // or postgres.Records, mysql.Records, mongo.Records, dynamo.Records
//	locker, err := recordlock.New(rt, nil)
//	defer locker.Close()
//
//	// Lock one record; skip it if another process has it.
//	k, err := locker.Lock(ctx, invoiceID, time.Minute)
//	if errors.Is(err, recordlock.ErrLocked) {
//		return nil // someone else is on it
//	}
//	if err != nil {
//		return err
//	}
//	defer k.Release(context.WithoutCancel(ctx))
//	return send(k.Context(), invoiceID, k.Token()) // ctx ends if the lock is lost
//
//	// Claim-next worker loop.
//	for {
//		k, err := locker.Claim(ctx, recordlock.SQL{Where: "status = ?", Args: []any{"pending"}, OrderBy: "created_at"}, time.Minute)
//		if errors.Is(err, recordlock.ErrNothingToClaim) {
//			… wait a little, or for a signal, then try again
//		}
//		… handle k.ID(), mark it done in your own table, then k.Release(ctx)
//	}
//
// # Holdings
//
// Lock and Claim never wait: a record locked elsewhere gives a
// *LockedError (ErrLocked) naming the holder and until when; Claim with
// nothing to take gives ErrNothingToClaim. A Lock follows the deadline
// rule of package lock: its Context is done — with ErrLeaseLost — at the
// local send time of the last successful lock or extension plus the
// duration minus a safety margin, before the store can let anyone else
// in; its Err consults the clock. By default it extends itself every
// third of its duration until Release; an extension that is refused (the
// record was force-released, or the holding lapsed and someone else took
// it) ends it at once, and one whose outcome is unknown is settled by
// reading the record back. Release clears the holder and expiry; the
// token stays, so the next holder's token is greater. Check Err (or pass
// Token to the resource) before each write that relies on the lock.
//
// # Filters
//
// Claim's filter is the store's own: a [SQL] condition with bound
// arguments on the SQL stores, a BSON filter and sort on MongoDB, a Query
// on a table or index on DynamoDB. Values are always bound, never
// concatenated, so a hostile value cannot widen the match; a claim picks
// the first unlocked record in the filter's order, using the index
// Migrate creates, without scanning the collection.
//
// # Clocks
//
// The expiry is decided by the database's clock where the database has
// one inside the statement (PostgreSQL, MySQL/MariaDB) and by the
// client's otherwise (SQLite, MongoDB, DynamoDB); docs/backends.md says
// which, per store.
package recordlock
