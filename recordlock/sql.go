package recordlock

// SQL is Claim's filter on the SQL stores (PostgreSQL, MySQL/MariaDB,
// SQLite): a condition over the table's own columns, with placeholders
// bound to Args — never concatenate a value into Where — and the order in
// which matching records are claimed.
//
// Placeholders are the database's own: ? on MySQL/MariaDB and SQLite,
// $1, $2, … on PostgreSQL (numbered from 1 over Args; the store numbers
// its own parameters after them, and refuses a $k beyond len(Args)). On
// SQLite the condition appears twice in the statement (Claim looks for a
// free record and a lapsed one at once) and Args are bound twice; use ?
// placeholders there — the names :id, :idtype, :owner, :now, :until and
// :token are the store's own. Where and OrderBy are SQL written by the
// program, not input: they are placed in the statement as they are.
type SQL struct {
	// Where is a boolean SQL condition; "" matches every record.
	Where string
	// Args are the values of Where's placeholders.
	Args []any
	// OrderBy is an ORDER BY list ("priority DESC, id"); "": the id
	// column, ascending.
	OrderBy string
}
