package postgres

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The store runs the same statements on a *pgxpool.Pool and on a *sql.DB
// of the pgx stdlib driver, through this small interface. Scans use the
// database/sql null types, which both understand.

// rowScanner is one result row.
type rowScanner interface{ Scan(dest ...any) error }

// rowsIter is a result set.
type rowsIter interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// querier runs statements.
type querier interface {
	exec(ctx context.Context, query string, args ...any) (int64, error)
	queryRow(ctx context.Context, query string, args ...any) rowScanner
	query(ctx context.Context, query string, args ...any) (rowsIter, error)
}

// database is a querier that can also begin transactions and be pinged.
type database interface {
	querier
	begin(ctx context.Context) (txn, error)
	ping(ctx context.Context) error
	// connConfig returns a copy of the connection settings, for the
	// store's dedicated LISTEN connection.
	connConfig(ctx context.Context) (*pgx.ConnConfig, error)
	close()
}

// txn is a transaction.
type txn interface {
	querier
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// isNoRows reports the error of a rowScanner that found no row.
func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) }

// ---------------------------------------------------------------------------
// pgxpool

type poolDB struct {
	p   *pgxpool.Pool
	own bool
}

func (d poolDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := d.p.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (d poolDB) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	return d.p.QueryRow(ctx, q, args...)
}

func (d poolDB) query(ctx context.Context, q string, args ...any) (rowsIter, error) {
	rows, err := d.p.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (d poolDB) begin(ctx context.Context) (txn, error) {
	tx, err := d.p.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{tx}, nil
}

func (d poolDB) ping(ctx context.Context) error { return d.p.Ping(ctx) }

func (d poolDB) connConfig(context.Context) (*pgx.ConnConfig, error) {
	return d.p.Config().ConnConfig.Copy(), nil
}

func (d poolDB) close() {
	if d.own {
		d.p.Close()
	}
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := t.tx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (t pgxTx) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	return t.tx.QueryRow(ctx, q, args...)
}

func (t pgxTx) query(ctx context.Context, q string, args ...any) (rowsIter, error) {
	rows, err := t.tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (t pgxTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// ---------------------------------------------------------------------------
// database/sql

type sqlDB struct {
	db     *sql.DB
	config func(ctx context.Context) (*pgx.ConnConfig, error)
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func sqlExec(ctx context.Context, e interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, q string, args ...any) (int64, error) {
	res, err := e.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return sqlExec(ctx, d.db, q, args...)
}

func (d sqlDB) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	return d.db.QueryRowContext(ctx, q, args...)
}

func (d sqlDB) query(ctx context.Context, q string, args ...any) (rowsIter, error) {
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (d sqlDB) begin(ctx context.Context) (txn, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx{tx}, nil
}

func (d sqlDB) ping(ctx context.Context) error { return d.db.PingContext(ctx) }

func (d sqlDB) connConfig(ctx context.Context) (*pgx.ConnConfig, error) { return d.config(ctx) }

func (d sqlDB) close() {}

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return sqlExec(ctx, t.tx, q, args...)
}

func (t sqlTx) queryRow(ctx context.Context, q string, args ...any) rowScanner {
	return t.tx.QueryRowContext(ctx, q, args...)
}

func (t sqlTx) query(ctx context.Context, q string, args ...any) (rowsIter, error) {
	rows, err := t.tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (t sqlTx) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.tx.Rollback() }

// retryable reports errors after which PostgreSQL rolled the statement
// back and it may be repeated: serialization failures (40001, under a
// session default of SERIALIZABLE or REPEATABLE READ) and deadlocks
// (40P01).
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}
