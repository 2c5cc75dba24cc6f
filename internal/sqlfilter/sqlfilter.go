// Package sqlfilter checks a record-lock Claim filter (recordlock.SQL) on
// the SQL stores whose placeholders are ? (MySQL/MariaDB and SQLite):
// each store reads the SQL its own way, and this package applies the
// rules they share to what that reading counts.
package sqlfilter

import (
	"database/sql"
	"fmt"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/recordlock"
)

// Store describes how one store reads a filter.
type Store struct {
	// Name prefixes every message ("mysql", "sqlite").
	Name string
	// Count counts the ? placeholders of an SQL fragment as the store's
	// server reads it, or refuses the fragment; lineComment tells whether
	// the fragment may end in a line comment (Where stands on lines of its
	// own in the statement, OrderBy does not).
	Count func(s string, lineComment bool) (int, error)
	// OrderByWhy and NamedWhy say, for the store, why OrderBy takes no
	// placeholder and why a sql.NamedArg is refused.
	OrderByWhy, NamedWhy string
	// CountWhy says why Where's placeholders must be as many as Args.
	CountWhy string
}

// Check refuses, with an error wrapping warden.ErrInvalidArgument, a
// filter whose Where or OrderBy the store's reading refuses, whose
// OrderBy has placeholders, whose Where has another number of
// placeholders than Args, or one of whose Args is a sql.NamedArg.
func (s Store) Check(f recordlock.SQL) error {
	n, err := s.Count(f.Where, true)
	if err != nil {
		return fmt.Errorf("%s: Claim's filter: Where: %v: %w", s.Name, err, warden.ErrInvalidArgument)
	}
	m, err := s.Count(f.OrderBy, false)
	if err != nil {
		return fmt.Errorf("%s: Claim's filter: OrderBy: %v: %w", s.Name, err, warden.ErrInvalidArgument)
	}
	if m > 0 {
		return fmt.Errorf("%s: Claim's filter: OrderBy has %d ? placeholders: OrderBy takes none (%s): %w", s.Name, m, s.OrderByWhy, warden.ErrInvalidArgument)
	}
	if n != len(f.Args) {
		return fmt.Errorf("%s: Claim's filter: Where has %d ? placeholders and there are %d Args: they must be as many (%s): %w", s.Name, n, len(f.Args), s.CountWhy, warden.ErrInvalidArgument)
	}
	for i, a := range f.Args {
		switch a.(type) {
		case sql.NamedArg, *sql.NamedArg:
			return fmt.Errorf("%s: Claim's filter: Args[%d] is a sql.NamedArg: %s; use ?: %w", s.Name, i, s.NamedWhy, warden.ErrInvalidArgument)
		}
	}
	return nil
}
