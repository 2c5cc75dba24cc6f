package sqlite

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"

	sqlitelib "modernc.org/sqlite"
)

// countingDriver wraps modernc.org/sqlite's driver and counts the
// statements the store runs: every Exec or Query (prepared or not),
// BEGIN, COMMIT and ROLLBACK. Preparing is not counted (the store
// prepares each statement once). SQLite has no round trips; a statement
// is the unit of work the store's primitives are measured in, as round
// trips are on the server stores (store/mysql/roundtrip_test.go).
type countingDriver struct{ n *atomic.Int64 }

var (
	statements     atomic.Int64
	registerCounts sync.Once
)

func (d countingDriver) Open(name string) (sqldriver.Conn, error) {
	c, err := (&sqlitelib.Driver{}).Open(name)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: d.n}, nil
}

type countingConn struct {
	sqldriver.Conn
	n *atomic.Int64
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	st, err := c.Conn.(sqldriver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, n: c.n}, nil
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.n.Add(1)
	return c.Conn.(sqldriver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	c.n.Add(1)
	return c.Conn.(sqldriver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *countingConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	c.n.Add(1)
	tx, err := c.Conn.(sqldriver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return countingTx{tx, c.n}, nil
}

func (c *countingConn) Ping(ctx context.Context) error { return c.Conn.(sqldriver.Pinger).Ping(ctx) }

func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.Conn.(sqldriver.SessionResetter).ResetSession(ctx)
}

func (c *countingConn) IsValid() bool { return c.Conn.(sqldriver.Validator).IsValid() }

type countingStmt struct {
	sqldriver.Stmt
	n *atomic.Int64
}

func (s *countingStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	s.n.Add(1)
	return s.Stmt.(sqldriver.StmtExecContext).ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	s.n.Add(1)
	return s.Stmt.(sqldriver.StmtQueryContext).QueryContext(ctx, args)
}

type countingTx struct {
	sqldriver.Tx
	n *atomic.Int64
}

func (t countingTx) Commit() error   { t.n.Add(1); return t.Tx.Commit() }
func (t countingTx) Rollback() error { t.n.Add(1); return t.Tx.Rollback() }

// openCounting opens a store on path whose connections count statements.
func openCounting(t *testing.T, path string) (*warden.Store, *atomic.Int64) {
	t.Helper()
	registerCounts.Do(func() { sql.Register("sqlite-counting", countingDriver{&statements}) })
	sqlDriver = "sqlite-counting"
	defer func() { sqlDriver = "sqlite" }()
	return openAt(t, path, nil), &statements
}

// TestStatementCounts documents and checks how many statements each
// primitive runs, without a watcher of the namespace and with one in
// another store on the file: the event triggers run inside the
// statements and add none. A primitive that grows fails here.
func TestStatementCounts(t *testing.T) {
	for _, watched := range []bool{false, true} {
		name := "unwatched"
		if watched {
			name = "watched by another store"
		}
		t.Run(name, func(t *testing.T) { statementCounts(t, watched) })
	}
}

func statementCounts(t *testing.T, watched bool) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "count.db")
	st, n := openCounting(t, path)
	if watched {
		w := openAt(t, path, nil)
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		if _, err := w.Locks().Watch(wctx); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Circuits().Watch(wctx); err != nil {
			t.Fatal(err)
		}
	}
	lk, cb, ca, id, cp := st.Locks(), st.Circuits(), st.Cache(), st.Idempotency(), st.Checkpoints()
	count := func(name string, want int64, f func() error) {
		t.Helper()
		before := n.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := n.Load() - before; got != want {
			t.Errorf("%s: %d statements, want %d", name, got, want)
		} else {
			t.Logf("%s: %d statements", name, got)
		}
	}
	var token int64
	count("Locks.Acquire (new key)", 1, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if err == nil && !ok {
			t.Error("not acquired")
		}
		token = l.Token
		return err
	})
	// Not applied: the holder is read without the write lock.
	count("Locks.Acquire (held by another)", 2, func() error {
		_, ok, err := lk.Acquire(ctx, "k", "b", time.Minute)
		if ok {
			t.Error("acquired a held lock")
		}
		return err
	})
	count("Locks.Refresh", 1, func() error {
		_, ok, err := lk.Refresh(ctx, "k", "a", token, time.Minute)
		if err == nil && !ok {
			t.Error("refresh refused")
		}
		return err
	})
	count("Locks.Release", 1, func() error {
		ok, err := lk.Release(ctx, "k", "a", token)
		if err == nil && !ok {
			t.Error("release refused")
		}
		return err
	})
	count("Locks.Acquire (released key)", 1, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if err == nil && !ok {
			t.Error("not acquired")
		}
		token = l.Token
		return err
	})
	count("Locks.Release", 1, func() error { _, err := lk.Release(ctx, "k", "a", token); return err })
	// Another key's queue changes nothing: the released key is taken
	// again in one statement, its release is one.
	other := openAt(t, path, nil).Driver().(*store)
	if err := other.keepTurn(ctx, other.lockPfx+"q", "w", true); err != nil {
		t.Fatal(err)
	}
	count("Locks.Acquire (released key, another key queued)", 1, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if err == nil && !ok {
			t.Error("not acquired")
		}
		token = l.Token
		return err
	})
	count("Locks.Release", 1, func() error { _, err := lk.Release(ctx, "k", "a", token); return err })
	count("Locks.Get", 1, func() error { _, _, err := lk.Get(ctx, "k"); return err })
	// Fair hand-off (turns.go): a waiter of another store queued for the
	// key just released. The releaser asking again is refused: the
	// upsert, the read of the live holder (none), then the IMMEDIATE
	// transaction's BEGIN, upsert, read of the row and COMMIT. The
	// queued waiter's acquire is one IMMEDIATE transaction: BEGIN, the
	// upsert, the deletion of its entry, COMMIT.
	if err := other.keepTurn(ctx, other.lockPfx+"k", "w", true); err != nil {
		t.Fatal(err)
	}
	count("Locks.Acquire (released key reserved for a queued waiter)", 6, func() error {
		_, ok, err := lk.Acquire(ctx, "k", "a", time.Minute)
		if ok {
			t.Error("the releaser took the key past the queued waiter")
		}
		return err
	})
	drv := st.Driver().(*store)
	if err := drv.keepTurn(ctx, drv.lockPfx+"k", "b", true); err != nil {
		t.Fatal(err)
	}
	if _, err := other.db.Exec(`DELETE FROM ` + quote(other.cfg.turns) + ` WHERE owner = 'w'`); err != nil {
		t.Fatal(err)
	}
	count("Locks.Acquire (queued owner, first in line)", 4, func() error {
		l, ok, err := lk.Acquire(ctx, "k", "b", time.Minute)
		if err == nil && !ok {
			t.Error("the first waiter was refused")
		}
		token = l.Token
		return err
	})
	count("Locks.Release", 1, func() error { _, err := lk.Release(ctx, "k", "b", token); return err })
	count("Circuits.RecordFailure", 1, func() error {
		r, err := cb.RecordFailure(ctx, "c", 1)
		if err == nil && r.State != driver.Open {
			t.Errorf("state %s", r.State)
		}
		return err
	})
	count("Circuits.Get", 1, func() error { _, _, err := cb.Get(ctx, "c"); return err })
	count("Cache.Set", 1, func() error { return ca.Set(ctx, "k", []byte("v"), time.Minute) })
	count("Cache.Get", 1, func() error { _, _, err := ca.Get(ctx, "k"); return err })
	// One IMMEDIATE transaction: BEGIN, the read, the claim, COMMIT.
	count("Idempotency.Claim", 4, func() error { _, _, err := id.Claim(ctx, "k", "a", time.Minute, "fp"); return err })
	count("Idempotency.Complete", 1, func() error { _, err := id.Complete(ctx, "k", "a", []byte("r"), time.Minute); return err })
	// One IMMEDIATE transaction: BEGIN, the fence upsert, the insert, COMMIT.
	count("Checkpoints.Save", 4, func() error {
		_, _, err := cp.Save(ctx, driver.CheckpointInput{TaskID: "t", Progress: 50, Data: []byte("d")})
		return err
	})
	count("Checkpoints.Latest", 1, func() error { _, _, err := cp.Latest(ctx, "t"); return err })
}
