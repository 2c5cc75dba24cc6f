package sqlite_test

// Adversarial tests of record locks on SQLite: hostile Claim filters,
// another program rewriting the lock columns, bad input.
//
// Tests that call advBreak demonstrate real breaks: they fail on the
// current code and are skipped unless WARDEN_ADVERSARIAL_BREAKS=1. The
// others are regression tests: of guarantees that held, and of breaks
// found here and fixed since (marked FIXED).

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/sqlite"
)

func advBreak(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("WARDEN_ADVERSARIAL_BREAKS") != "1" {
		t.Skip("BREAK: " + reason)
	}
}

func advCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func advLocker(t *testing.T, rt *sqlite.RecordTable, opts *recordlock.Options) *recordlock.Locker[recordlock.SQL] {
	t.Helper()
	l, err := recordlock.New(rt, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// lockedRows returns the ids of rows with a holder.
func (f *recordFixture) lockedRows(t *testing.T) []string {
	t.Helper()
	rows, err := f.db.Query(`SELECT id FROM jobs WHERE locked_by IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

// FIXED (claim: "a Where fragment that uses more placeholders than Args
// must error clearly, never bind internal parameters"). SQLite's Claim
// checked nothing: the filter's extra ? (or ?NNN) placeholders took the
// driver's own parameters (:owner, :now, :until are bound by position
// too), so "status = ? OR rank < ?" with one Arg compared rank with the
// owner text and the clock — true for every row — and claimed rows that
// do not match. Claim now reads Where as SQLite's tokenizer does and
// refuses any count of ? other than len(Args), ?NNN, named parameters,
// and placeholders in OrderBy; ? inside literals, quoted names and
// comments are not counted.
func TestAdversarialRecordsWhereMorePlaceholdersThanArgs(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 3, false)
	f.exec(t, `UPDATE jobs SET status = 'done'`)
	l := advLocker(t, f.rt, nil)
	for _, filter := range []recordlock.SQL{
		{Where: "status = ? OR rank < ?", Args: []any{"todo"}},
		{Where: "rank < ?"},
		{Where: "status = ?1 OR rank < ?3", Args: []any{"todo"}},
		{Where: "status = ? OR rank < ?2", Args: []any{"todo"}},
		{Where: "status = ? OR rank < :now", Args: []any{"todo"}},
		{Where: "status = ? OR rank < @until OR $owner <> ''", Args: []any{"todo"}},
		// A ? the guard would miss if it misread a literal or a name.
		{Where: "status = ? OR note <> 'it''s' OR rank < ?", Args: []any{"todo"}},
		{Where: "status = ? OR \"note\"\"x\" IS NULL OR rank < ?", Args: []any{"todo"}},
		{Where: "status = ? OR [note] <> '' OR rank < ?", Args: []any{"todo"}},
		{Where: "status = ? /* ' */ OR rank < ?", Args: []any{"todo"}},
		{Where: "status = ? -- '\nOR rank < ?", Args: []any{"todo"}},
		// Placeholders in OrderBy would take Args meant for Where or the
		// driver's own.
		{Where: "status = ?", Args: []any{"todo"}, OrderBy: "rank < ?"},
		// Extra Args with no placeholder would shift into the driver's.
		{Args: []any{"todo"}},
	} {
		k, err := l.Claim(ctx, filter, time.Minute)
		if err == nil {
			t.Errorf("Claim(%q, %d Args) claimed %v, a row whose status is done: the extra placeholders bound the driver's parameters", filter.Where, len(filter.Args), k.ID())
			_ = k.Release(ctx)
			continue
		}
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim(%q, %d Args): %v; want an error wrapping ErrInvalidArgument", filter.Where, len(filter.Args), err)
		}
	}
}

// FIXED (exclusion; claim). A named Arg whose name is one of the
// driver's own parameters (:now, :until, :owner — names a program may
// well use) replaced the driver's value: sql.Named("until", …) set the
// holding's expiry, so the record was free in the store at once while its
// holder's context was live; sql.Named("now", a later time) made live
// holdings look lapsed, so Claim took a record another holder had. Claim
// now refuses sql.NamedArg values (and named parameters in Where).
func TestAdversarialRecordsNamedArgsReplaceDriversOwn(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 1, false)
	a := advLocker(t, f.rt, &recordlock.Options{NoAutoExtend: true})
	b := advLocker(t, f.rt, &recordlock.Options{NoAutoExtend: true})

	// :now — "rows due before the horizon", the program's own parameter.
	ka, err := a.Lock(ctx, "rec-000001", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	horizon := time.Now().Add(time.Hour).UnixMilli()
	kb, err := b.Claim(ctx, recordlock.SQL{Where: "rank <= :now", Args: []any{sql.Named("now", horizon)}}, time.Minute)
	if err == nil {
		if ka.Err() == nil {
			t.Errorf("Claim with sql.Named(\"now\", …) took %v (token %d) while A holds it live (token %d)", kb.ID(), kb.Token(), ka.Token())
		}
		_ = kb.Release(ctx)
	} else if !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Claim with sql.Named(\"now\", …): %v; want ErrInvalidArgument", err)
	}
	for _, name := range []string{"owner", "until", "now", "id", "idtype", "token", "x"} {
		for _, arg := range []any{sql.Named(name, 1), &sql.NamedArg{Name: name, Value: 1}} {
			if kb, err := b.Claim(ctx, recordlock.SQL{Where: "rank <= ?", Args: []any{arg}}, time.Minute); !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("Claim with a %T named %q: %v; want ErrInvalidArgument", arg, name, err)
				if err == nil {
					_ = kb.Release(ctx)
				}
			}
		}
	}
	_ = ka.Release(ctx)

	// :until — the program's own bound.
	kb, err = b.Claim(ctx, recordlock.SQL{Where: "rank < :until", Args: []any{sql.Named("until", 100)}}, time.Minute)
	if err != nil {
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Claim with sql.Named(\"until\", …): %v", err)
		}
		return
	}
	defer kb.Release(ctx)
	if ka2, err := a.Lock(ctx, "rec-000001", time.Minute); err == nil {
		if kb.Err() == nil {
			t.Errorf("A locked %v while B's claim (token %d) is live: B's claim wrote the program's :until as the expiry", ka2.ID(), kb.Token())
		}
		_ = ka2.Release(ctx)
	}
}

// FIXED (minor; claim: "none skipped while unlocked and matching"). A
// row whose holder column another program cleared (an operator's
// "UPDATE … SET locked_by = NULL") but whose expiry is still ahead is
// unlocked — Locked says so, Lock takes it — yet Claim passed it over
// until the stale expiry passed: its candidates were "expiry IS NULL" and
// "expiry <= now". Claim now has a third candidate, found through
// Migration's partial index of exactly those rows (so it reads no live
// holding), taken in the filter's order with the others.
func TestAdversarialRecordsClaimSkipsRowWithClearedHolder(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 3, false)
	l := advLocker(t, f.rt, nil)
	for _, clear := range []string{`locked_by = NULL`, `locked_by = ''`} {
		var held []*recordlock.Lock
		for _, id := range []string{"rec-000001", "rec-000002", "rec-000003"} {
			k, err := l.Lock(ctx, id, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, k)
		}
		f.exec(t, `UPDATE jobs SET `+clear+` WHERE id = 'rec-000002'`)
		st, err := l.Locked(ctx, "rec-000002")
		if err != nil || st.Locked {
			t.Fatalf("after %s: Locked %+v, %v; want not locked", clear, st, err)
		}
		// With a filter and Args (bound once per candidate search), in
		// the filter's order.
		kc, err := l.Claim(ctx, recordlock.SQL{Where: "status = ? AND rank >= ?", Args: []any{"todo", 1}, OrderBy: "rank DESC"}, time.Minute)
		if err != nil {
			t.Errorf("after %s: Claim: %v; rec-000002 is unlocked and matches", clear, err)
		} else {
			if kc.ID() != "rec-000002" {
				t.Errorf("after %s: Claim took %v; want rec-000002", clear, kc.ID())
			}
			_ = kc.Release(ctx)
		}
		for _, k := range held {
			_ = k.Release(ctx)
		}
	}
	// A table migrated before the partial index existed: Claim passes such
	// a row over until its expiry passes (docs/backends.md), without
	// reading the holdings; Migrate adds the index.
	f.exec(t, `DROP INDEX jobs_locked_by_cleared_idx`)
	rt, err := sqlite.Records(f.db, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	old := advLocker(t, rt, nil)
	if _, err := old.Lock(ctx, "rec-000001", time.Hour); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rt.ClaimStatement(recordlock.SQL{}), "warden_cleared") {
		t.Errorf("without the partial index, Claim's statement still has the third search:\n%s", rt.ClaimStatement(recordlock.SQL{}))
	}
	f.exec(t, `UPDATE jobs SET locked_by = NULL WHERE id = 'rec-000001'`)
	f.exec(t, `UPDATE jobs SET locked_by = 'x', locked_until = 1e15 WHERE id <> 'rec-000001'`)
	if k, err := old.Claim(ctx, recordlock.SQL{}, time.Minute); !errors.Is(err, recordlock.ErrNothingToClaim) {
		t.Errorf("without the partial index: Claim %v, %v; want ErrNothingToClaim (documented)", k, err)
	}
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k, err := old.Claim(ctx, recordlock.SQL{}, time.Minute)
	if err != nil || k.ID() != "rec-000001" {
		t.Fatalf("after Migrate: Claim %v, %v; want rec-000001", k, err)
	}
	_ = k.Release(ctx)
}

// FIXED (minor; "nothing written" on error, fencing). At the token
// column's limit (9223372036854775807, written by another program or
// reached after 2^63 holdings) Lock's UPDATE computed lock_token + 1,
// which SQLite turns into a REAL: the row was written — holder set, token
// now 9.223372036854776e18 — and only then did scanning the RETURNING row
// fail, leaving the record locked by a holder nobody had and the row
// unreadable. Lock's and Claim's statements now fail before writing, with
// an error naming the record and the token column; so does a token that
// is not an integer (only another program writes one).
func TestAdversarialRecordsTokenLimitWritesThenFails(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 2, false)
	l := advLocker(t, f.rt, nil)
	for _, tok := range []string{`9223372036854775807`, `9.5e18`, `'x'`, `1.5`} {
		f.exec(t, `UPDATE jobs SET lock_token = `+tok+` WHERE id = 'rec-000001'`)
		f.exec(t, `UPDATE jobs SET locked_by = 'x', locked_until = 1e15 WHERE id <> 'rec-000001'`)
		var before string
		if err := f.db.QueryRow(`SELECT typeof(lock_token) || ' ' || lock_token FROM jobs WHERE id = 'rec-000001'`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		for _, op := range []string{"Lock", "Claim"} {
			var k *recordlock.Lock
			var err error
			if op == "Lock" {
				k, err = l.Lock(ctx, "rec-000001", time.Minute)
			} else {
				k, err = l.Claim(ctx, recordlock.SQL{}, time.Minute)
			}
			if err == nil {
				t.Errorf("lock_token %s: %s took %v with token %d", tok, op, k.ID(), k.Token())
				_ = k.Release(ctx)
				continue
			}
			if !strings.Contains(err.Error(), `record rec-000001: its token column "lock_token"`) || errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("lock_token %s: %s: %v; want the token-limit error naming the record", tok, op, err)
			}
			var after string
			var by sql.NullString
			if err := f.db.QueryRow(`SELECT typeof(lock_token) || ' ' || lock_token, locked_by FROM jobs WHERE id = 'rec-000001'`).Scan(&after, &by); err != nil {
				t.Fatal(err)
			}
			if by.Valid || after != before {
				t.Errorf("lock_token %s: %s failed (%v) but wrote the row: locked_by %q, lock_token %s (was %s)", tok, op, err, by.String, after, before)
			}
			if st, err := l.Locked(ctx, "rec-000001"); err != nil && tok == `9223372036854775807` || st.Locked {
				t.Errorf("lock_token %s: after %s, Locked: %+v, %v", tok, op, st, err)
			}
		}
	}
	// Below the limit, the last token is issued.
	f.exec(t, `UPDATE jobs SET lock_token = 9223372036854775806 WHERE id = 'rec-000001'`)
	k, err := l.Lock(ctx, "rec-000001", time.Minute)
	if err != nil || k.Token() != math.MaxInt64 {
		t.Fatalf("Lock at MaxInt64 − 1: %v, %v; want token MaxInt64", k, err)
	}
	_ = k.Release(ctx)
}

// BREAK (exclusion, deadline rule) — the store-independent break of
// recordlock's TestAdversarialExtendShorterDurationKeepsLongerDeadline,
// on SQLite: Extend to a shorter duration moves locked_until earlier
// (now + d) while the holder's deadline stays where it was.
func TestAdversarialRecordsExtendShorterKeepsLongerDeadline(t *testing.T) {
	// Fixed: a shorter Extend is refused, and the store's Extend never
	// moves locked_until earlier (MAX), so the holder's deadline stays
	// before the store's expiry.
	ctx := advCtx(t)
	f := newRecordFixture(t, 1, false)
	a := advLocker(t, f.rt, &recordlock.Options{NoAutoExtend: true})
	ka, err := a.Lock(ctx, "rec-000001", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := ka.Extend(ctx, recordlock.MinDuration); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Fatalf("shorter Extend: %v, want ErrInvalidArgument", err)
	}
	before, _, err := f.rt.Get(ctx, "rec-000001")
	if err != nil {
		t.Fatal(err)
	}
	// The driver itself, asked for less than is left, keeps the expiry.
	if _, _, ok, err := f.rt.Extend(ctx, "rec-000001", ka.Owner(), ka.Token(), recordlock.MinDuration); err != nil || !ok {
		t.Fatalf("driver Extend by less than is left: %v %v", ok, err)
	}
	after, _, err := f.rt.Get(ctx, "rec-000001")
	if err != nil || after.Until.Before(before.Until) || !ka.Deadline().Before(after.Until) {
		t.Errorf("locked_until %v → %v (%v); holder's deadline %v", before.Until, after.Until, err, ka.Deadline())
	}
}

// Held: hostile values in Args cannot widen the match, through the public
// API; nothing is locked or written.
func TestAdversarialRecordsHostileFilterValues(t *testing.T) {
	ctx := advCtx(t)
	for _, intIDs := range []bool{false, true} {
		f := newRecordFixture(t, 4, intIDs)
		before := f.userRows(t)
		l := advLocker(t, f.rt, nil)
		for _, v := range []any{"x' OR 1=1 --", "x' OR '1'='1", "%", "_", "todo%", "todo\x00", "\x00", "todo' --", "?", ":now", "?1", "todo); DELETE FROM jobs; --",
			"TODO", " todo", []byte("todo"), 0, 1.0, true} {
			// (LIKE is left out: its wildcards and case folding are the
			// program's choice of operator, not a widening by the driver.)
			for _, w := range []string{"status = ?", "status IN (?)", "? = status", "status = :v", "?1 = status"} {
				args := []any{v}
				if strings.Contains(w, ":v") {
					args = []any{sql.Named("v", v)}
				}
				// Numbered and named parameters are refused (FIXED
				// above); the values bound to ? match nothing.
				want := recordlock.ErrNothingToClaim
				if strings.Contains(w, ":v") || strings.Contains(w, "?1") {
					want = warden.ErrInvalidArgument
				}
				k, err := l.Claim(ctx, recordlock.SQL{Where: w, Args: args}, time.Minute)
				if err == nil {
					t.Errorf("Claim(%s, %#v) claimed %v", w, v, k.ID())
					_ = k.Release(ctx)
				} else if !errors.Is(err, want) {
					t.Errorf("Claim(%s, %#v): %v; want %v", w, v, err, want)
				}
			}
		}
		if got := f.lockedRows(t); len(got) != 0 {
			t.Errorf("rows locked by hostile values: %v", got)
		}
		if after := f.userRows(t); strings.Join(after, "\n") != strings.Join(before, "\n") {
			t.Errorf("user rows changed:\n%v\nwas\n%v", after, before)
		}
	}
}

// Held: another program rewriting the lock columns under a holder (expiry
// NULL or in the past, holder empty or NULL, token 0, the row deleted and
// re-inserted): another Locker can then lock the row (nothing can prevent
// that), and the old holder is refused at its next extension — its
// context ends with ErrLeaseLost — and its Release leaves the new holding
// alone.
func TestAdversarialRecordsColumnsRewrittenUnderHolder(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 1, false)
	a := advLocker(t, f.rt, &recordlock.Options{NoAutoExtend: true})
	b := advLocker(t, f.rt, &recordlock.Options{NoAutoExtend: true})
	for _, tamper := range []string{
		`UPDATE jobs SET locked_until = NULL`,
		`UPDATE jobs SET locked_until = 0`,
		`UPDATE jobs SET locked_by = ''`,
		`UPDATE jobs SET locked_by = NULL, locked_until = NULL, lock_token = 0`,
		`UPDATE jobs SET locked_until = 0, lock_token = NULL`,
		`DELETE FROM jobs; INSERT INTO jobs (id, status, rank, note) VALUES ('rec-000001', 'todo', 1, 'x')`,
	} {
		ka, err := a.Lock(ctx, "rec-000001", time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", tamper, err)
		}
		f.exec(t, tamper)
		kb, err := b.Lock(ctx, "rec-000001", time.Minute)
		if err != nil {
			t.Fatalf("after %s: B: %v", tamper, err)
		}
		if err := ka.Extend(ctx, time.Minute); !errors.Is(err, recordlock.ErrLeaseLost) || !errors.Is(ka.Err(), recordlock.ErrLeaseLost) {
			t.Errorf("after %s: A's Extend %v, Err %v; want ErrLeaseLost", tamper, err, ka.Err())
		}
		_ = ka.Release(ctx)
		if st, err := b.Locked(ctx, "rec-000001"); err != nil || !st.Locked || st.Owner != kb.Owner() || st.Token != kb.Token() || kb.Err() != nil {
			t.Errorf("after %s: B's holding %+v (%v), Err %v", tamper, st, err, kb.Err())
		}
		if err := kb.Release(ctx); err != nil {
			t.Errorf("after %s: B's Release: %v", tamper, err)
		}
	}
}

// Held: bad input is refused clearly — identifiers, ids, durations — and
// the longest duration works without overflow.
func TestAdversarialRecordsBadInput(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 2, false)
	for _, name := range []string{"", "jobs; DROP TABLE jobs", `jobs"`, "sqlite_master", "SQLITE_x", "1jobs", "jobs\x00", "jobs--", "jöbs", "j" + strings.Repeat("\"", 5000)} {
		if _, err := sqlite.Records(f.db, name, nil); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(table %.40q): %v", name, err)
		} else if len(err.Error()) > 300 {
			t.Errorf("Records(table of %d bytes): message of %d bytes", len(name), len(err.Error()))
		}
	}
	for _, o := range []sqlite.RecordOptions{
		{IDColumn: `id" OR 1=1 --`}, {UntilColumn: "locked_until; DROP TABLE jobs"}, {OwnerColumn: "a b"}, {TokenColumn: "tok\x00"},
		{OwnerColumn: "locked_until"}, {IDColumn: "LOCKED_BY"}, {BusyTimeout: -1},
	} {
		if _, err := sqlite.Records(f.db, "jobs", &o); !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Records(%+v): %v", o, err)
		}
	}
	if _, err := sqlite.Records(nil, "jobs", nil); !errors.Is(err, warden.ErrInvalidArgument) {
		t.Errorf("Records(nil db): %v", err)
	}
	l := advLocker(t, f.rt, nil)
	for _, id := range []any{nil, "", strings.Repeat("r", sqlite.MaxRecordIDBytes+1), "\xff", uint64(math.MaxUint64), 1.5, []byte("rec-000001"), struct{}{}, int64(1)} {
		_, err := l.Lock(ctx, id, time.Minute)
		if !errors.Is(err, warden.ErrInvalidArgument) {
			t.Errorf("Lock(%T %.20v): %v, want ErrInvalidArgument", id, id, err)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("Lock(%T): message of %d bytes", id, len(err.Error()))
		}
	}
	k, err := l.Lock(ctx, "rec-000001", math.MaxInt64)
	if err != nil {
		t.Fatalf("Lock for MaxInt64: %v", err)
	}
	if err := k.Extend(ctx, math.MaxInt64); err != nil {
		t.Errorf("Extend by MaxInt64: %v", err)
	}
	st, err := l.Locked(ctx, "rec-000001")
	if err != nil || !st.Locked || st.Until.Before(time.Now().Add(200*365*24*time.Hour)) {
		t.Errorf("after MaxInt64: %+v, %v", st, err)
	}
	if err := k.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if got := f.lockedRows(t); len(got) != 0 {
		t.Errorf("rows still locked: %v", got)
	}
}

// Held: a missing id locks nothing and creates nothing, through the
// public API, also for ids that look like SQL.
func TestAdversarialRecordsMissingIDCreatesNothing(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 2, false)
	before := f.userRows(t)
	l := advLocker(t, f.rt, nil)
	for _, id := range []string{"rec-000003", "rec-000001' OR '1'='1", "rec-00000%", "REC-000001", "rec-000001 ", "rec-000001\x00"} {
		if _, err := l.Lock(ctx, id, time.Minute); !errors.Is(err, recordlock.ErrNotFound) {
			t.Errorf("Lock(%q): %v, want ErrNotFound", id, err)
		}
	}
	if after := f.userRows(t); strings.Join(after, "|") != strings.Join(before, "|") {
		t.Errorf("rows changed: %v, was %v", after, before)
	}
	if got := f.lockedRows(t); len(got) != 0 {
		t.Errorf("rows locked: %v", got)
	}
}

// Held: exclusion between two handles on one file (as two processes
// would have) with the shortest duration and auto-extension: at the
// instant a Lock returns, no other holder is live.
func TestAdversarialRecordsExclusionTwoHandles(t *testing.T) {
	ctx := advCtx(t)
	f := newRecordFixture(t, 1, true)
	db2 := openRecordDB(t, recordDSN(filepath.Clean(f.path)))
	rt2, err := sqlite.Records(db2, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		live = map[*recordlock.Lock]bool{}
		last int64
	)
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for i, rt := range []*sqlite.RecordTable{f.rt, rt2, f.rt, rt2} {
		l := advLocker(t, rt, &recordlock.Options{NoAutoExtend: i >= 2})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				k, err := l.Lock(ctx, int64(1), recordlock.MinDuration)
				if errors.Is(err, recordlock.ErrLocked) || errors.Is(err, warden.ErrStoreTooSlow) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for o := range live {
					if o.Err() == nil {
						t.Errorf("token %d acquired while token %d is live", k.Token(), o.Token())
					}
				}
				if k.Token() <= last {
					t.Errorf("token %d after %d", k.Token(), last)
				}
				last = k.Token()
				live[k] = true
				mu.Unlock()
				time.Sleep(time.Duration(k.Token()%7) * 20 * time.Millisecond) // work
				mu.Lock()
				delete(live, k)
				mu.Unlock()
				_ = k.Release(ctx)
			}
		}()
	}
	wg.Wait()
}
