package sqlite

import "github.com/warden-go/warden/driver"

// RecordTable implements driver.RecordTables: the record locks of table
// in the store's database file (warden record …).
func (s *store) RecordTable(table string, f driver.RecordFields) (driver.RecordAdmin, error) {
	return Records(s.db, table, &RecordOptions{IDColumn: f.ID, UntilColumn: f.Until, OwnerColumn: f.Owner, TokenColumn: f.Token})
}

var _ driver.RecordTables = (*store)(nil)
