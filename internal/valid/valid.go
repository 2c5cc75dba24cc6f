// Package valid holds the argument checks that every portable package
// (lock, breaker, cache, idempotency, checkpoint) makes alike, so that one
// rule holds for all of them.
package valid

import (
	"fmt"
	"time"

	"github.com/warden-go/warden"
)

// D names a duration to check.
type D struct {
	Name string
	V    time.Duration
}

// Durations checks durations given as options or arguments: each is 0 (the
// default) or at least one millisecond. A negative duration and one under
// a millisecond (stores keep whole milliseconds, and such a value is
// almost always a unit mistake, like 30 for 30 s) are refused with an
// error matching warden.ErrInvalidArgument, prefixed by prefix ("lock",
// `breaker "api"`).
func Durations(prefix string, ds ...D) error {
	for _, d := range ds {
		switch {
		case d.V < 0:
			return fmt.Errorf("%s: %w: %s %v is negative", prefix, warden.ErrInvalidArgument, d.Name, d.V)
		case d.V > 0 && d.V < time.Millisecond:
			return fmt.Errorf("%s: %w: %s %v is under one millisecond", prefix, warden.ErrInvalidArgument, d.Name, d.V)
		}
	}
	return nil
}

// Nil returns an error matching warden.ErrInvalidArgument saying that what
// (a store, a function) is nil.
func Nil(prefix, what string) error {
	return fmt.Errorf("%s: %w: nil %s", prefix, warden.ErrInvalidArgument, what)
}
