package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/sqlite"
)

// Exit codes. `lock run` otherwise exits with its command's code.
const (
	exitOK          = 0   // success
	exitFailed      = 1   // any other error
	exitUsage       = 2   // bad command line: unknown command or flag, missing argument, bad key, pattern or store URL
	exitHeld        = 3   // lock not acquired (held elsewhere), or circuit not closed
	exitNotFound    = 4   // the lock, circuit, cache entry, idempotency key or checkpoint does not exist
	exitUnreachable = 5   // the store could not be reached or used, or did not answer within --timeout
	exitLeaseLost   = 6   // lock run: the lock was lost while the command ran
	exitInterrupted = 130 // interrupted by SIGINT, SIGTERM or SIGHUP
)

// exitCodes documents the exit codes in help output and the README.
var exitCodes = []struct {
	code int
	text string
}{
	{exitOK, "ok"},
	{exitFailed, "error"},
	{exitUsage, "usage: unknown command or flag, missing argument, invalid key, pattern or store URL"},
	{exitHeld, "lock not acquired (held elsewhere), or circuit open (breaker show)"},
	{exitNotFound, "not found: no such lock, circuit, cache entry, idempotency key or checkpoint"},
	{exitUnreachable, "store unreachable or unusable: no answer within --timeout, network error, login or database refused (access denied, unknown database), SQLite file missing (for read commands), unreadable or read-only (for writes)"},
	{exitLeaseLost, "lock run: the lock was lost while the command ran (the command was stopped)"},
	{exitCannotExec, "lock run: the command was found but is not executable"},
	{exitNoCommand, "lock run: the command was not found"},
	{exitInterrupted, "interrupted (SIGINT, SIGTERM or SIGHUP)"},
}

// exitError carries an exit code and the message to print (none if both
// msg and err are empty).
type exitError struct {
	code int
	msg  string
	err  error // wrapped, if any
}

func (e *exitError) Error() string {
	switch {
	case e.msg != "" && e.err != nil:
		return e.msg + ": " + e.err.Error()
	case e.err != nil:
		return e.err.Error()
	}
	return e.msg
}

func (e *exitError) Unwrap() error { return e.err }

// exitf returns an error that exits with code and prints the message.
func exitf(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// notFoundf returns an error for a missing record (exit 4).
func notFoundf(format string, args ...any) error {
	return exitf(exitNotFound, format, args...)
}

// usageError is a bad command line (exit 2).
type usageError struct {
	path string // the command's words, "lock run"; "": the top level
	msg  string
}

func (e *usageError) Error() string {
	if e.path == "" {
		if strings.Contains(e.msg, "(see '") {
			return e.msg
		}
		return e.msg + " (see 'warden --help')"
	}
	return fmt.Sprintf("%s: %s (see 'warden %s --help')", e.path, e.msg, e.path)
}

// usagef returns a usage error about cmd (nil: the top level).
func usagef(cmd *command, format string, args ...any) error {
	e := &usageError{msg: fmt.Sprintf(format, args...)}
	if cmd != nil {
		e.path = cmd.path
	}
	return e
}

// timeoutError: the store did not answer within --timeout.
type timeoutError struct {
	d      time.Duration
	scheme string
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("store unreachable: no answer from the %s store within %v (--timeout)", e.scheme, e.d)
}

// errInterrupted: a signal (or the cancellation of run's context) ended
// the command.
var errInterrupted = errors.New("interrupted")

// exitCode classifies an error.
//
// Store unreachable (5) is: a --timeout that expired; a network error
// (net.Error, connection refused, reset or aborted, host or network
// unreachable); a MySQL login or database the server refuses (1044, 1045,
// 1049, 1698), a PostgreSQL one (SQLSTATE 28000, 28P01, 3D000) or a Redis
// one (WRONGPASS, NOAUTH, NOPERM, a DB index out of range); and, for SQLite, a database file that cannot be opened
// (SQLITE_CANTOPEN: a directory that does not exist, a path that is a
// directory), is not a database (SQLITE_NOTADB), cannot be read
// (SQLITE_IOERR), is missing (a command that only reads opens it
// read-only) or may not be written (SQLITE_READONLY). A store that answers
// with an error, a busy SQLite file included, is an error (1).
func exitCode(err error) int {
	var ee *exitError
	var ue *usageError
	var te *timeoutError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &te):
		return exitUnreachable
	case errors.Is(err, errInterrupted), errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.Is(err, lock.ErrLocked):
		return exitHeld
	case errors.Is(err, lock.ErrLeaseLost):
		return exitLeaseLost
	case errors.Is(err, warden.ErrInvalidKey), errors.Is(err, warden.ErrInvalidPattern),
		errors.Is(err, warden.ErrInvalidArgument), errors.Is(err, warden.ErrUnknownScheme),
		errors.Is(err, driver.ErrBadURL), errors.Is(err, driver.ErrBadPrefix):
		return exitUsage
	case unreachable(err):
		return exitUnreachable
	}
	return exitFailed
}

// SQLite result codes (the low byte of an extended code) that mean the
// database file cannot be used at all.
const (
	sqliteReadOnly = 8 // a write to a file this process may only read
	sqliteIOErr    = 10
	sqliteCantOpen = 14
	sqliteNotADB   = 26
)

// MySQL and MariaDB server errors that mean the store cannot be used
// with this URL at all.
const (
	mysqlDBAccessDenied         = 1044 // ER_DBACCESS_DENIED_ERROR: no rights on the database
	mysqlAccessDenied           = 1045 // ER_ACCESS_DENIED_ERROR: bad user or password
	mysqlBadDB                  = 1049 // ER_BAD_DB_ERROR: unknown database
	mysqlAccessDeniedNoPassword = 1698 // ER_ACCESS_DENIED_NO_PASSWORD_ERROR
)

// unreachable reports whether err says the store could not be reached or
// used: a network error, a login or database the server refuses, an
// SQLite file that cannot be opened, read or written.
func unreachable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT} {
		if errors.Is(err, errno) {
			return true
		}
	}
	// MySQL refused the login or does not have the database: the store
	// cannot be used, as if it could not be reached.
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case mysqlDBAccessDenied, mysqlAccessDenied, mysqlBadDB, mysqlAccessDeniedNoPassword:
			return true
		}
	}
	// PostgreSQL refused the login (28000, 28P01) or does not have the
	// database (3D000).
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		switch pe.SQLState() {
		case "28000", "28P01", "3D000":
			return true
		}
	}
	// Redis refused the login or does not have the database number.
	var re goredis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR DB index is out of range", "ERR invalid DB index", "ERR invalid password", "ERR AUTH"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	// SQLite's errors (modernc.org/sqlite) carry their result code; other
	// stores' errors are not asked, since their codes mean other things.
	var we *warden.Error
	var oe *sqliteOpenError
	isSQLite := errors.As(err, &we) && we.Store == "sqlite" || errors.As(err, &oe)
	var coded interface{ Code() int }
	if isSQLite && errors.As(err, &coded) {
		switch coded.Code() & 0xFF {
		case sqliteIOErr, sqliteCantOpen, sqliteNotADB, sqliteReadOnly:
			return true
		}
	}
	if errors.As(err, &oe) && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
		return true // a database file that is missing or cannot be read
	}
	return false
}

// sqliteOpenError marks an error from opening a sqlite:// store, so that
// unreachable may read its SQLite result code.
type sqliteOpenError struct {
	err      error
	readOnly bool // opened read-only for a command that only reads
}

func (e *sqliteOpenError) Error() string {
	if e.readOnly && errors.Is(e.err, fs.ErrNotExist) && !errors.Is(e.err, sqlite.ErrNoDirectory) {
		return e.err.Error() + " (commands that only read, delete or modify records never create a database: check the path, or create it with 'warden migrate')"
	}
	return e.err.Error()
}

func (e *sqliteOpenError) Unwrap() error { return e.err }
