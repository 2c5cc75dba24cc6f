// Package sqlite is warden's embedded default store: locks, circuit
// breakers, caches, idempotency keys and checkpoints in one SQLite file,
// shared safely by every goroutine and every process that opens it.
//
// It uses the pure-Go SQLite driver modernc.org/sqlite (no cgo). Import it
// for its side effect to make the "sqlite" scheme available to warden.Open:
//
//	import _ "github.com/warden-go/warden/store/sqlite"
//
//	st, err := warden.Open(ctx, "sqlite://warden.db?prefix=app:")
//
// or call [Open] with [Options].
//
// # URLs
//
// sqlite:///abs/path/file.db names an absolute path; sqlite://dir/file.db
// and sqlite://file.db name a path relative to the working directory
// (host and path are joined). The file is created if missing, but not its
// directory: opening sqlite:///var/lib/app/warden.db where /var/lib/app does
// not exist fails with an error that names the directory and matches
// [ErrNoDirectory] (and fs.ErrNotExist). Percent-escapes are decoded. Query
// parameters: prefix (the namespace), busy_timeout (a Go duration such as
// 5s), max_value_bytes (an integer), poll_interval (a Go duration) and
// mode=ro (Options.ReadOnly: an existing file, read only, nothing created).
// Any other parameter is an error.
//
// # Several processes
//
// The database runs in WAL mode with synchronous=NORMAL. Every write is
// either one statement or one transaction begun with BEGIN IMMEDIATE, so a
// writer takes SQLite's write lock before it reads anything: contention
// makes it wait, and it fails with "database is locked" only if the lock
// stays taken by others for longer than [Options.BusyTimeout]. Writers of
// one process queue in the process (first come, first served, per database
// file) before asking SQLite for the lock; between processes the store
// retries a busy lock every millisecond or so rather than with SQLite's
// growing sleeps, so that no writer starves. Expiry is decided by the clock of the process that writes, in
// milliseconds, UTC; processes sharing a file are assumed to share a clock
// (they run on one machine).
//
// # Namespaces
//
// A prefix is empty or a name followed by its only ':' ("billing:").
// Stored keys carry the prefix and a kind tag as in the go-go-scope layout
// (prefix + "lock:" + key, …; prefix + key for idempotency keys and task
// ids), and every table also has a namespace column holding the prefix, so
// that stores of different namespaces never see each other's records, even
// where the stored key alone is ambiguous (the unprefixed store's
// idempotency key "a:k" and namespace "a:"'s key "k").
//
// # Notifications
//
// The store implements driver.LockNotifier and driver.CircuitNotifier
// across processes: triggers append lock and circuit changes to an events
// table in the same statement that makes them — only while some store
// watches the namespace (a registration in a watchers table, written
// before its first Watch returns and renewed while it watches), so a file
// nobody watches pays nothing for notifications — and one watcher
// goroutine per store polls PRAGMA data_version every
// [Options.PollInterval] and fans new events out to the watchers of its
// namespace. A read-only store watches too: it writes its registration,
// and nothing else, through a connection of its own opened read-write on
// the file (never creating it); on a file this process cannot write, or
// one opened immutable, Watch fails with an error matching
// errors.ErrUnsupported. See docs/backends.md in the repository for the
// tables, columns, indexes and triggers.
package sqlite
