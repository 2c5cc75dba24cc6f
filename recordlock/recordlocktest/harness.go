// Package recordlocktest is the conformance suite of recordlock's drivers
// (driver.Records): every store's record driver runs it against its real
// server. It checks exclusion across goroutines and processes, claims that
// hand every record to exactly one worker, that nothing is ever created
// in or written to the user's data beyond the three lock fields, that a
// hostile id or filter value cannot widen a match, and the fencing token
// order.
package recordlocktest

import (
	"context"
	"time"

	"github.com/warden-go/warden/driver"
)

// Row is a record of the suite's test tables. Besides the lock fields,
// each store's test table has: the id (ID formats it), status (text),
// rank (integer) and note (text) — the user's own fields.
type Row struct {
	N      int // the id's number; Harness.ID turns it into the store's id
	Status string
	Rank   int
	Note   string
}

// Harness tells the suite how to reach the store under test. Every
// function must also work in a child process of the multi-process checks
// (the test binary re-executed), so it may not depend on a *testing.T:
// build the Harness in TestMain or at package level, from the
// environment.
type Harness[F any] struct {
	// Name names the store in messages ("postgres", "mongodb", …).
	Name string
	// Create makes a new, empty table (collection) called table with the
	// store's lock fields (as the store's migration helper makes them,
	// with the index Claim needs) and inserts rows.
	Create func(ctx context.Context, table string, rows []Row) error
	// Drop removes table.
	Drop func(ctx context.Context, table string) error
	// Open returns a driver over table on a new connection (or one shared
	// by the process) and a func that releases what Open made.
	Open func(ctx context.Context, table string) (driver.Records[F], func(), error)
	// ID returns the id of row n as the driver takes it (for example
	// "rec-000042" or int64(42)).
	ID func(n int) any
	// Read returns the user's fields of row id as the database holds them
	// (status, rank, note) and whether it exists.
	Read func(ctx context.Context, table string, id any) (row Row, found bool, err error)
	// SetNote changes row id's note, as another program would, outside
	// recordlock.
	SetNote func(ctx context.Context, table string, id any, note string) error
	// Count returns how many records table holds.
	Count func(ctx context.Context, table string) (int, error)
	// ByStatus returns the store's native filter matching the records
	// whose status equals status, bound as a value (never concatenated),
	// ordered by rank then id.
	ByStatus func(status string) F
	// HostileIDs are ids of the driver's accepted types that a careless
	// driver could read as a query or pattern ("x' OR '1'='1", "%", a
	// document with operators …): none may lock an existing record.
	HostileIDs []any
	// SingleProcess: the store cannot be shared with another process (the
	// memory store); the multi-process checks are skipped.
	SingleProcess bool
	// Timeout bounds each check and each child process, and is how long
	// the multi-process checks' claims last. 0: two minutes. A test
	// server much slower than production (FerretDB reads a whole
	// collection per conditional update) sets more.
	Timeout time.Duration
}

func (h Harness[F]) timeout() time.Duration {
	if h.Timeout > 0 {
		return h.Timeout
	}
	return 2 * time.Minute
}
