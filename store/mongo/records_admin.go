package mongo

import "github.com/warden-go/warden/driver"

// RecordTable implements driver.RecordTables: the record locks of
// collection table in the store's database (warden record …).
func (s *store) RecordTable(table string, f driver.RecordFields) (driver.RecordAdmin, error) {
	return Records(s.db.Collection(table), &RecordOptions{IDField: f.ID, UntilField: f.Until, OwnerField: f.Owner, TokenField: f.Token})
}

var _ driver.RecordTables = (*store)(nil)
