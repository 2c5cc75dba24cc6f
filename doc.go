// Package warden gives Go services the coordination state they share across
// processes — distributed locks, circuit-breaker state, caches, idempotency
// keys and task checkpoints — on the database they already run: PostgreSQL,
// MySQL/MariaDB, MongoDB, DynamoDB, Redis, SQLite (the embedded default)
// and memory (for tests).
//
// A [Store] is a connection to one database in one namespace. Open one from
// a URL; the store packages register their schemes when imported:
//
//	import _ "github.com/warden-go/warden/store/sqlite"
//
//	st, err := warden.Open(ctx, "sqlite://warden.db?prefix=billing:")
//
// (warden.db in the working directory; the store creates the file, but a
// path such as sqlite:///var/lib/app/warden.db needs /var/lib/app to
// exist: a missing directory is an error that names it.)
//
// The capabilities live in their own packages, written once over the
// driver primitives of package driver: lock, breaker, cache, idempotency,
// checkpoint. Each store package (store/memory, store/sqlite, …) implements
// those primitives atomically on its database and passes the conformance
// suite in package drivertest against a real server.
//
// Errors are sentinels matched with errors.Is ([ErrInvalidKey],
// [ErrValueTooLarge], [ErrClosed], …) or an [*Error] wrapping the backend's
// failure with the operation and key. Context errors are returned
// unchanged.
package warden
