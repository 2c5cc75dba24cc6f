package postgres

import (
	"errors"
	"fmt"

	"github.com/warden-go/warden/driver"
)

// RecordTable implements driver.RecordTables: the record locks of table
// (in the store's schema, if it has one) through the store's pool (warden
// record …). A store made by NewDB on a *sql.DB has no pool to give and
// returns an error matching errors.ErrUnsupported.
func (s *store) RecordTable(table string, f driver.RecordFields) (driver.RecordAdmin, error) {
	p, ok := s.db.(poolDB)
	if !ok {
		return nil, fmt.Errorf("postgres: record locks need a pgx pool; this store runs on a *sql.DB: %w", errors.ErrUnsupported)
	}
	return Records(p.p, table, &RecordOptions{Schema: s.schema, IDColumn: f.ID, UntilColumn: f.Until, OwnerColumn: f.Owner, TokenColumn: f.Token})
}

var _ driver.RecordTables = (*store)(nil)
