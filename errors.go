package warden

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/warden-go/warden/driver"
)

// Sentinel errors, matched with errors.Is. Every error a Store returns is
// one of these, a context error (returned unchanged), or an *Error wrapping
// the driver's error.
var (
	// ErrInvalidKey: a key, name, task id, owner or checkpoint id is empty,
	// longer than 512 bytes, not valid UTF-8, or contains NUL.
	ErrInvalidKey = errors.New("warden: invalid key")
	// ErrInvalidPattern: a glob is not valid UTF-8 or ends in a lone '\'.
	ErrInvalidPattern = errors.New("warden: invalid pattern")
	// ErrInvalidArgument: a duration, threshold, count or state is out of
	// range (for example a lock TTL under one millisecond).
	ErrInvalidArgument = errors.New("warden: invalid argument")
	// ErrValueTooLarge: a value exceeds the store's limit; nothing was
	// written.
	ErrValueTooLarge = errors.New("warden: value too large")
	// ErrClosed: the store, or the Locker or Cache in use, was closed.
	// lock.ErrClosed and cache.ErrClosed are this error.
	ErrClosed = errors.New("warden: closed")
	// ErrLeaseLost: a holding — a lock lease, an idempotency claim — could
	// no longer be proven held (refused by the store, or not renewed
	// before its deadline): another holder may have it now. It is the
	// cause of the holding's context. lock.ErrLeaseLost and
	// idempotency.ErrLeaseLost are this error; errors of the packages
	// that carry more detail match it with errors.Is.
	ErrLeaseLost = errors.New("warden: lease lost")
	// ErrStoreTooSlow: the store granted a holding — a lock, an
	// idempotency claim — but its answers kept arriving after the
	// holding's deadline (the round trip is longer than the TTL or lease
	// less its safety margin), so the holding was given back instead of
	// used. lock.ErrStoreTooSlow and idempotency.ErrStoreTooSlow are this
	// error.
	ErrStoreTooSlow = errors.New("warden: store answers arrive after the holding's deadline")
	// ErrStoreTimeout: a portable package gave up on a store operation
	// after its own budget (a breaker's StoreTimeout, a cache's
	// StoreTimeout, a polling watch's listing), so that a store that stops
	// answering does not hold the caller; the store counts as failing. It
	// is not context.DeadlineExceeded, which would read as the caller's
	// own deadline. breaker.ErrStoreTimeout is this error.
	ErrStoreTimeout = errors.New("warden: the store did not answer within the budget")
	// ErrUnknownScheme: Open was given a URL whose scheme no imported store
	// registered.
	ErrUnknownScheme = errors.New("warden: unknown store scheme")
)

// Error is a store operation's failure: the backend's error wrapped once
// with the operation and the key. Unwrap gives the backend's error.
type Error struct {
	Store string // the backend: "sqlite", "postgres", …
	Op    string // the operation: "lock.acquire", "cache.get", …
	Key   string // the key, name or task id, if the operation has one
	Err   error
}

func (e *Error) Error() string {
	s := "warden: " + e.Store + " " + e.Op
	if e.Key != "" {
		s += " " + quoteArg(e.Key)
	}
	return s + ": " + strings.TrimPrefix(e.Err.Error(), "warden: ")
}

func (e *Error) Unwrap() error { return e.Err }

// ValidateKey checks a key (or circuit name, task id, owner, idempotency
// key): non-empty UTF-8 of at most 512 bytes, without NUL. The error wraps
// ErrInvalidKey. NUL is the one character refused, because PostgreSQL text
// and several client libraries cannot hold it.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > driver.MaxKeyBytes:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), driver.MaxKeyBytes)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: contains NUL at byte %d", ErrInvalidKey, i)
		}
	}
	return nil
}

// ParsePattern parses a glob ('*' any run, '?' one character, '\' escapes;
// empty matches everything). The error wraps ErrInvalidPattern.
func ParsePattern(s string) (driver.Pattern, error) {
	p, err := driver.ParsePattern(s)
	if err != nil {
		return p, fmt.Errorf("%w: %s (a '\\' must be followed by the character it escapes)", ErrInvalidPattern, quoteArg(s))
	}
	return p, nil
}

// maxQuoted is how many bytes of an over-long key or pattern a message
// shows.
const maxQuoted = 64

// quoteArg quotes a key or pattern for a message. One longer than any valid
// key (driver.MaxKeyBytes) shows as its first 64 bytes, cut on a character
// boundary, and its length — "abc"…(10240 bytes), as the CLI writes it —
// so that a huge argument gives a short message.
func quoteArg(s string) string {
	if len(s) <= driver.MaxKeyBytes {
		return strconv.Quote(s)
	}
	n := maxQuoted
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strconv.Quote(s[:n]) + fmt.Sprintf("…(%d bytes)", len(s))
}

// contextErr returns ctx's error if err was caused by ctx ending.
func contextErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, cerr)) {
		return cerr
	}
	return nil
}
