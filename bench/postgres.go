package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/warden-go/warden/store/postgres" // registers postgres://
)

// postgresEnv names the PostgreSQL server of the benchmarks, as in the
// tests; without it the postgres cases are left out.
const postgresEnv = "WARDEN_TEST_POSTGRES_URL"

// PostgreSQL groups, shaped as the Redis ones (the measurements are the
// same functions): the uncontended cycle, 8 workers taking turns on one
// key holding it 1 ms, and the hand-off from a holder to a waiter on
// another connection. cirello.io/pglock, the Go peer, is not in the
// table: the module proxy this project builds from refuses it.
const (
	postgresCycleGroup   = "postgres lock cycle (uncontended acquire + release)"
	postgresContendGroup = "postgres 8-way contention on one key, hold 1 ms (µs per acquisition)"
	postgresHandoffGroup = "postgres lock hand-off (p50 µs, release → waiter on another connection)"
	postgresGetGroup     = "postgres cache get"
)

// postgresCases returns the PostgreSQL groups, measured on the server at
// base (a postgres:// URL): warden against the raw INSERT … ON CONFLICT …
// DO UPDATE … WHERE + DELETE pair.
func postgresCases(base string) []Case {
	type peer struct {
		name string
		mk   func(b *testing.B, ns string) peerLocker
	}
	peers := []peer{
		{"raw INSERT … ON CONFLICT + DELETE (pgx; waiters poll every 1 ms)", func(b *testing.B, _ string) peerLocker { return newRawPostgres(b, base) }},
		{"warden lock.Locker (waiters: LISTEN/NOTIFY)", newWardenPeer},
	}
	var cases []Case
	for i, p := range peers {
		cases = append(cases, Case{Group: postgresCycleGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) { peerCycle(b, p.mk(b, postgresURL(base))) }})
	}
	cases = append(cases, Case{Group: postgresCycleGroup, Name: "warden primitives Acquire + Release (no lease)",
		Run: func(b *testing.B) { primitiveCycle(b, postgresURL(base)) }})
	for i, p := range peers {
		cases = append(cases, Case{Group: postgresContendGroup, Name: p.name, Baseline: i == 0,
			Run: func(b *testing.B) {
				ns := postgresURL(base)
				peerContend(b, func() peerLocker { return p.mk(b, ns) })
			}})
	}
	for _, p := range peers {
		cases = append(cases, Case{Group: postgresHandoffGroup, Name: p.name, Metric: HandoffMetric,
			Run: func(b *testing.B) {
				ns := postgresURL(base)
				peerHandoff(b, p.mk(b, ns), p.mk(b, ns))
			}})
	}
	cases = append(cases,
		Case{Group: postgresGetGroup, Name: "raw SELECT (pgx)", Baseline: true, Run: func(b *testing.B) { rawPostgresGet(b, base) }},
		Case{Group: postgresGetGroup, Name: "warden Cache().Get", Run: func(b *testing.B) { mysqlCacheGet(b, postgresURL(base)) }},
	)
	return cases
}

var postgresRuns atomic.Int64

// postgresURL is base with a namespace of the run's own.
func postgresURL(base string) string {
	sep := "?"
	if u, err := url.Parse(base); err == nil && u.RawQuery != "" {
		sep = "&"
	}
	return fmt.Sprintf("%s%sprefix=bench%d%d%d:", base, sep, os.Getpid(), time.Now().UnixNano(), postgresRuns.Add(1))
}

// rawPostgresPool opens a pool on base and creates the baselines' tables.
func rawPostgresPool(b *testing.B, base string) *pgxpool.Pool {
	b.Helper()
	pool, err := pgxpool.New(context.Background(), base)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS bench_raw_pg_locks (k text COLLATE "C" PRIMARY KEY, owner text NOT NULL, expires_at timestamptz(3) NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS bench_raw_pg_cache (k text COLLATE "C" PRIMARY KEY, value bytea NOT NULL, expires_at timestamptz(3))`,
	} {
		if _, err := pool.Exec(context.Background(), stmt); err != nil && !isDuplicateTable(err) {
			b.Fatal(err)
		}
	}
	return pool
}

// isDuplicateTable reports the error of two CREATE TABLE IF NOT EXISTS
// racing (the catalog's unique index, not the IF NOT EXISTS check).
func isDuplicateTable(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && (pe.SQLState() == "23505" || pe.SQLState() == "42P07")
}

// rawPostgres is the least a PostgreSQL lock can do: a conditional upsert
// that takes a free or expired key (expiry by the database clock), then
// an owner-checked delete; waiters poll every millisecond.
type rawPostgres struct {
	pool  *pgxpool.Pool
	owner string
}

var rawPGOwners atomic.Int64

func newRawPostgres(b *testing.B, base string) peerLocker {
	return rawPostgres{rawPostgresPool(b, base), fmt.Sprintf("raw-%d-%d", os.Getpid(), rawPGOwners.Add(1))}
}

const (
	rawPGAcquire = `INSERT INTO bench_raw_pg_locks AS l (k, owner, expires_at) VALUES ($1, $2, clock_timestamp() + interval '1 minute')
		ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
		WHERE l.expires_at <= clock_timestamp() RETURNING 1`
	rawPGRelease = `DELETE FROM bench_raw_pg_locks WHERE k = $1 AND owner = $2`
)

func (r rawPostgres) try(ctx context.Context, key string) (func() error, bool, error) {
	var one int
	err := r.pool.QueryRow(ctx, rawPGAcquire, key, r.owner).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return func() error {
		tag, err := r.pool.Exec(ctx, rawPGRelease, key, r.owner)
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("raw release: not held")
		}
		return err
	}, true, nil
}

func (r rawPostgres) acquire(ctx context.Context, key string) (func() error, error) {
	for {
		rel, ok, err := r.try(ctx, key)
		if err != nil || ok {
			return rel, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// rawPostgresGet: a primary-key read with an expiry check by the database
// clock.
func rawPostgresGet(b *testing.B, base string) {
	ctx := context.Background()
	pool := rawPostgresPool(b, base)
	key := fmt.Sprintf("cache:bench-%d-%d", os.Getpid(), postgresRuns.Add(1))
	if _, err := pool.Exec(ctx, `INSERT INTO bench_raw_pg_cache VALUES ($1, $2, NULL) ON CONFLICT (k) DO UPDATE SET value = EXCLUDED.value`, key, []byte("value")); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Exec(context.Background(), `DELETE FROM bench_raw_pg_cache WHERE k = $1`, key) })
	for b.Loop() {
		var v []byte
		if err := pool.QueryRow(ctx, `SELECT value FROM bench_raw_pg_cache WHERE k = $1 AND (expires_at IS NULL OR expires_at > clock_timestamp())`, key).Scan(&v); err != nil {
			b.Fatal(err)
		}
	}
}
