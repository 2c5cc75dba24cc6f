package mysql_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/drivertest"
	"github.com/warden-go/warden/store/mysql"
)

// countingConnector counts the round trips the store's calls make: every
// statement, START TRANSACTION (plus SET TRANSACTION when an isolation
// level is asked for), COMMIT and ROLLBACK.
type countingConnector struct {
	inner sqldriver.Connector
	n     *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, n: c.n}, nil
}

func (c countingConnector) Driver() sqldriver.Driver { return c.inner.Driver() }

type countingConn struct {
	sqldriver.Conn
	n *atomic.Int64
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.n.Add(1)
	return c.Conn.(sqldriver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	c.n.Add(1)
	return c.Conn.(sqldriver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	c.n.Add(1)
	return c.Conn.(sqldriver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *countingConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	c.n.Add(1)
	if opts.Isolation != 0 {
		c.n.Add(1)
	}
	tx, err := c.Conn.(sqldriver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{tx, c.n}, nil
}

func (c *countingConn) Ping(ctx context.Context) error {
	c.n.Add(1)
	return c.Conn.(sqldriver.Pinger).Ping(ctx)
}

func (c *countingConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	return c.Conn.(sqldriver.NamedValueChecker).CheckNamedValue(nv)
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.Conn.(sqldriver.SessionResetter).ResetSession(ctx)
}

func (c *countingConn) IsValid() bool { return c.Conn.(sqldriver.Validator).IsValid() }

type countingTx struct {
	sqldriver.Tx
	n *atomic.Int64
}

func (t countingTx) Commit() error   { t.n.Add(1); return t.Tx.Commit() }
func (t countingTx) Rollback() error { t.n.Add(1); return t.Tx.Rollback() }

// newCountingStore opens a store with New on a *sql.DB whose connector
// counts round trips. The DSN is the plain go-sql-driver one (no
// clientFoundRows, no time_zone), as a user's own handle may be.
func newCountingStore(t testing.TB, prefix string, interpolate bool) (*warden.Store, *atomic.Int64) {
	u, err := url.Parse(drivertest.ServerURL(t, "mysql", "WARDEN_TEST_MYSQL_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, u.Path[1:]
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.ParseTime = true
	cfg.InterpolateParams = interpolate
	inner, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := new(atomic.Int64)
	db := sql.OpenDB(countingConnector{inner, n})
	t.Cleanup(func() { db.Close() })
	st, err := mysql.New(db, &mysql.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Close()
		if err := db.Ping(); err != nil {
			t.Errorf("the handle given to New was closed with the store: %v", err)
		}
	})
	return st, n
}

// TestRoundTrips documents and checks how many round trips each operation
// makes (with interpolateParams=true; without it each statement with
// arguments adds a prepare).
func TestRoundTrips(t *testing.T) {
	st, n := newCountingStore(t, "roundtrips:", true)
	ctx := context.Background()
	tag := time.Now().Format("150405.000000")
	count := func(name string, want int64, f func() error) {
		t.Helper()
		before := n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := n.Load() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", name, got, want)
		} else {
			t.Logf("%s: %d round trips", name, got)
		}
	}
	lk, cb, ca, id, cp := st.Locks(), st.Circuits(), st.Cache(), st.Idempotency(), st.Checkpoints()
	key := "k" + tag
	var token int64
	count("Locks.Acquire (new key)", 2, func() error {
		l, ok, err := lk.Acquire(ctx, key, "a", time.Minute)
		if err == nil && !ok {
			t.Error("not acquired")
		}
		token = l.Token
		return err
	})
	count("Locks.Acquire (held by another)", 2, func() error {
		_, ok, err := lk.Acquire(ctx, key, "b", time.Minute)
		if ok {
			t.Error("acquired a held lock")
		}
		return err
	})
	count("Locks.Refresh", 2, func() error {
		_, ok, err := lk.Refresh(ctx, key, "a", token, time.Minute)
		if err == nil && !ok {
			t.Error("refresh refused")
		}
		return err
	})
	count("Locks.Release", 1, func() error {
		ok, err := lk.Release(ctx, key, "a", token)
		if err == nil && !ok {
			t.Error("release refused")
		}
		return err
	})
	count("Circuits.RecordFailure", 4, func() error {
		r, err := cb.RecordFailure(ctx, key, 1)
		if err == nil && r.State != "open" {
			t.Errorf("state %s", r.State)
		}
		return err
	})
	var gen, version, epoch int64
	count("Circuits.TryProbe", 4, func() error {
		r, _, err := cb.TryProbe(ctx, key, "p", 0, time.Second)
		gen = r.Generation()
		return err
	})
	// The gobreaker-style operations (issue 13) are one atomic change
	// like the others, whatever they decide: START TRANSACTION, the
	// change, the read of the row it left, COMMIT.
	count("Circuits.TryProbes (a second of 2 slots)", 4, func() error {
		r, ok, err := cb.TryProbes(ctx, key, "p2", 0, time.Second, 2)
		if err == nil && !ok {
			t.Error("the second of 2 probe slots refused")
		}
		epoch = r.ProbeEpoch
		return err
	})
	count("Circuits.RecordOutcome (a probe slot no longer granted: ignored)", 4, func() error {
		r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch + 1})
		if err == nil && r.State != driver.HalfOpen {
			t.Errorf("the outcome of a probe slot no longer granted left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (older generation: ignored)", 4, func() error {
		r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeFailure, Gen: gen - 1, Threshold: 1})
		if err == nil && r.State != driver.HalfOpen {
			t.Errorf("an outcome of an older generation left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (success, generation matches, closing)", 4, func() error {
		r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeSuccess, Gen: gen, ProbeEpoch: epoch, CloseAfter: 1})
		if err == nil && r.State != driver.Closed {
			t.Errorf("a probe's success left the circuit %s", r.State)
		}
		return err
	})
	count("Circuits.RecordOutcome (failure counted, threshold 0)", 4, func() error {
		r, err := cb.RecordOutcome(ctx, key, driver.Outcome{Kind: driver.OutcomeFailure, Successes: 2, Interval: time.Hour})
		version = r.Version
		return err
	})
	count("Circuits.Trip (at the version counted)", 4, func() error {
		_, ok, err := cb.Trip(ctx, key, version)
		if err == nil && !ok {
			t.Error("Trip at the current version refused")
		}
		return err
	})
	count("Circuits.Trip (stale version)", 4, func() error {
		_, ok, err := cb.Trip(ctx, key, version)
		if err == nil && ok {
			t.Error("Trip at a stale version applied")
		}
		return err
	})
	count("Cache.Set", 1, func() error { return ca.Set(ctx, key, []byte("v"), time.Minute) })
	// The outcome is read from @warden_out on the same connection (not from
	// LAST_INSERT_ID, which an AUTO_INCREMENT column overrides).
	count("Cache.SetIfAbsent", 2, func() error {
		ok, err := ca.SetIfAbsent(ctx, key, []byte("w"), time.Minute)
		if ok {
			t.Error("SetIfAbsent replaced a live entry")
		}
		return err
	})
	count("Cache.Get", 1, func() error { _, _, err := ca.Get(ctx, key); return err })
	count("Idempotency.Claim", 2, func() error {
		_, o, err := id.Claim(ctx, key, "a", time.Minute, "fp")
		if err == nil && o.String() != "claimed" {
			t.Errorf("outcome %v", o)
		}
		return err
	})
	count("Idempotency.Extend", 1, func() error { _, err := id.Extend(ctx, key, "a", time.Minute); return err })
	count("Idempotency.Complete", 1, func() error { _, err := id.Complete(ctx, key, "a", []byte("r"), time.Minute); return err })
	count("Checkpoints.Fence", 5, func() error { _, err := cp.Fence(ctx, key, 5); return err })
	count("Checkpoints.Save", 6, func() error {
		_, ok, err := cp.Save(ctx, driver.CheckpointInput{TaskID: key, Progress: 50, Data: []byte("d"), Token: 5})
		if err == nil && !ok {
			t.Error("save refused")
		}
		return err
	})
	count("Checkpoints.Latest", 1, func() error { _, _, err := cp.Latest(ctx, key); return err })
	// Fenced: the transaction locks the fence row to compare its token.
	count("Checkpoints.Cleanup (fenced)", 6, func() error {
		_, ok, err := cp.CleanupFenced(ctx, key, 0, 5)
		if err == nil && !ok {
			t.Error("cleanup refused")
		}
		return err
	})
	count("Checkpoints.DeleteAll (fenced)", 5, func() error {
		_, ok, err := cp.DeleteAllFenced(ctx, key, 5)
		if err == nil && !ok {
			t.Error("delete refused")
		}
		return err
	})
}
