package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
	sqlite3 "modernc.org/sqlite/lib"
)

// evBatch is how many events the watcher reads per query.
const evBatch = 512

// errClosed is returned by Watch calls on a closed store.
var errClosed = errors.New("sqlite: store closed")

// errImmutableWatch is returned by Watch calls on a read-only store that
// SQLite opened immutable (see openStore): it never sees another
// process's commits, and cannot register as a watcher.
var errImmutableWatch = fmt.Errorf("%w: the SQLite file was opened read-only and immutable (its directory cannot be written): it sees no changes to watch", errors.ErrUnsupported)

// rwMode is the mode a read-only store opens its registration pool in:
// read-write, never creating the file (tests set a read-only mode to play
// a file this process cannot write).
var rwMode = "&mode=rw"

// watcherTTL is how long a watcher registration lives unless renewed; the
// watcher goroutine renews each registration once watcherTTL/3 has passed
// since it was written. A process that dies stops costing event writes
// at most watcherTTL later.
const watcherTTL = 30 * time.Second

// The kinds of watcher registrations (the watchers table's kind column):
// the lock triggers write only while the namespace has a live 'lock'
// registration, the circuit triggers a live 'circuit' one.
const (
	kindLock    = "lock"
	kindCircuit = "circuit"
)

// hub is the store's notification watcher: one goroutine (run by the
// eventhub, started by the first WatchLocks or WatchCircuits call and
// stopped when the last watch ends or the store closes) polls PRAGMA
// data_version on a dedicated connection; when another connection or
// process has committed, it reads the new rows of the events table and
// fans them out.
//
// Events are written only while the namespace has a live registration in
// the watchers table, so the hub registers the store (id) for a kind of
// events before the first watch of that kind subscribes, keeps the
// registration while watches of the kind remain (the goroutine renews
// it) and deletes it after the last one ended.
type hub struct {
	*eventhub.Hub
	s  *store
	id string // this store's watcher id

	regMu sync.Mutex           // serialises registrations, subscriptions of new watches and sync
	reg   map[string]time.Time // registered kinds → when the row was last written (sent)
	// rw is the pool a read-only store writes its registrations through
	// (regDB), opened on the first registration; nil until then and for
	// a read-write store; rwDone once closeRW ran. Guarded by regMu.
	rw     *sql.DB
	rwDone bool

	// afterRegister, if set (tests), runs after a registration committed
	// and before the watch subscribes.
	afterRegister func()
}

func newHub(s *store) *hub {
	h := &hub{s: s, id: fmt.Sprintf("%d-%016x", os.Getpid(), rand.Uint64()), reg: map[string]time.Time{}}
	h.Hub = eventhub.New(h.start, errClosed)
	return h
}

// WatchLocks implements driver.LockNotifier.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return watch(s.hub, ctx, kindLock, s.hub.Hub.WatchLocks)
}

// WatchCircuits implements driver.CircuitNotifier.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return watch(s.hub, ctx, kindCircuit, s.hub.Hub.WatchCircuits)
}

// watch registers the store as a watcher of kind, if it is not, and then
// subscribes. The registration is committed before subscribe reads where
// the event stream stands, and so before the caller reads any state after
// the watch returns: a change committed after that read is committed
// after the registration, and its trigger writes the event. Every
// subscription to the store's events goes through here, read-only stores'
// too (they register through a pool of their own, see regDB): without a
// registration, no event would ever be written for the watch to see.
func watch[C any](h *hub, ctx context.Context, kind string, subscribe func(context.Context) (C, error)) (C, error) {
	var none C
	if h.s.immutable {
		return none, errImmutableWatch
	}
	if h.s.closed.Load() {
		return none, errClosed
	}
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if _, ok := h.reg[kind]; !ok {
		sent := time.Now()
		if err := h.register(ctx, kind); err != nil {
			return none, ctxErr(ctx, err)
		}
		h.reg[kind] = sent
		if h.afterRegister != nil {
			h.afterRegister()
		}
	}
	ch, err := subscribe(ctx)
	if err != nil && !h.Running() {
		// No watcher goroutine will delete the registration.
		h.syncLocked(context.WithoutCancel(ctx), nil)
	}
	return ch, err
}

// regDB is the pool that registrations are written through: the store's
// own, or for a read-only store (whose connections cannot write) a pool
// of one connection opened read-write on the same file on its first
// registration — mode=rw creates nothing, and the registration is all it
// ever writes. regMu must be held.
func (h *hub) regDB() (*sql.DB, error) {
	if !h.s.cfg.readOnly {
		return h.s.db, nil
	}
	if h.rwDone {
		return nil, errClosed
	}
	if h.rw == nil {
		db, err := sql.Open(sqlDriver, dsn(h.s.path, h.s.cfg.busy, rwMode))
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		h.rw = db
	}
	return h.rw, nil
}

// closeRW closes the registration pool of a read-only store, once the
// watcher goroutine has ended (the store is closing).
func (h *hub) closeRW() {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	h.rwDone = true
	if h.rw != nil {
		h.rw.Close()
		h.rw = nil
	}
}

// regExec runs one registration statement, not prepared: they are rare,
// and the one that ends a registration runs while the store closes.
// regMu must be held.
func (h *hub) regExec(ctx context.Context, query, kind string, now int64) (int64, error) {
	db, err := h.regDB()
	if err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, query, sql.Named("ns", h.s.cfg.prefix), sql.Named("kind", kind),
		sql.Named("id", h.id), sql.Named("now", now), sql.Named("exp", now+driver.Millis(watcherTTL)))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// register writes the store's registration of kind, deleting lapsed
// registrations (of processes that died) on the way. A read-only store on
// a file this process cannot write cannot register: its error matches
// errors.ErrUnsupported.
func (h *hub) register(ctx context.Context, kind string) error {
	err := h.s.write(ctx, func() error {
		now := nowMs()
		if _, err := h.regExec(ctx, h.s.q.watchPrune, kind, now); err != nil {
			return err
		}
		_, err := h.regExec(ctx, h.s.q.watchSet, kind, now)
		return err
	})
	if h.s.cfg.readOnly && unwritable(err) {
		return fmt.Errorf("%w: a read-only SQLite store watches by registering as a watcher in the file (events are written only while a process watches), and this process cannot write %q: %w",
			errors.ErrUnsupported, h.s.path, err)
	}
	return err
}

// unwritable reports whether err is SQLite's answer to a write on a file
// (or into a directory) this process may not write.
func unwritable(err error) bool {
	switch sqliteCode(err) {
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return true
	}
	return false
}

// renew pushes the registration of kind forward. If it had lapsed (this
// process stalled for watcherTTL) or was deleted, it is written again and
// renew reports lapsed: events may have been missed meanwhile.
func (h *hub) renew(ctx context.Context, kind string) (lapsed bool, err error) {
	err = h.s.write(ctx, func() error {
		now := nowMs()
		n, err := h.regExec(ctx, h.s.q.watchRenew, kind, now)
		if err != nil || n > 0 {
			return err
		}
		lapsed = true
		_, err = h.regExec(ctx, h.s.q.watchSet, kind, now)
		return err
	})
	return lapsed, err
}

// sync brings the registrations in line with the subscriptions: it
// deletes those of kinds nobody watches any more and renews the others
// when due. A registration found lapsed is reported to the subscribers of
// run (if not nil) as lost events, so that they read the state again.
func (h *hub) sync(ctx context.Context, run *eventhub.Run) {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	h.syncLocked(ctx, run)
}

func (h *hub) syncLocked(ctx context.Context, run *eventhub.Run) {
	wantLocks, wantCircs := h.Wants()
	lapsed := false
	for kind, at := range h.reg {
		if kind == kindLock && !wantLocks || kind == kindCircuit && !wantCircs {
			// Not under ctx's cancellation: the last watch ending is
			// what cancels a watcher's ctx, often while it is here.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.s.cfg.busy)
			err := h.s.write(dctx, func() error {
				_, err := h.regExec(dctx, h.s.q.watchDelete, kind, nowMs())
				return err
			})
			cancel()
			if err == nil {
				delete(h.reg, kind)
			} // else again at the next tick, or by Close

			continue
		}
		if time.Since(at) < watcherTTL/3 {
			continue
		}
		sent := time.Now()
		l, err := h.renew(ctx, kind)
		if err != nil {
			continue // again at the next tick
		}
		h.reg[kind] = sent
		lapsed = lapsed || l
	}
	if lapsed && run != nil {
		h.deliver(run, nil, true)
	}
}

// start opens the watcher's connection and records where the event stream
// stands, so that every event committed after the first Watch call
// returns is delivered.
func (h *hub) start(ctx context.Context) (func(context.Context, *eventhub.Run), error) {
	s := h.s
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	var version, last int64
	err = s.retry(ctx, func() error {
		if err := conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&version); err != nil {
			return err
		}
		return conn.QueryRowContext(ctx, s.q.evSeq).Scan(&last)
	})
	if err != nil {
		conn.Close()
		return nil, ctxErr(ctx, err)
	}
	return func(ctx context.Context, run *eventhub.Run) {
		defer func() {
			// Delete the registrations nobody watches any more (all of
			// them unless a new watch has started meanwhile).
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.busy)
			defer cancel()
			h.sync(ctx, nil)
		}()
		defer conn.Close()
		h.loop(ctx, run, conn, version, last)
	}, nil
}

// event is one row of the events table.
type event struct {
	id    int64
	kind  string
	ns    string
	key   string
	owner sql.NullString
	token sql.NullInt64
	at    int64
	data  sql.NullString
}

func (h *hub) loop(ctx context.Context, run *eventhub.Run, conn *sql.Conn, version, last int64) {
	t := time.NewTicker(h.s.cfg.poll)
	defer t.Stop()
	var poll, read *sql.Stmt // prepared once on the watcher's connection
	defer func() {
		for _, st := range []*sql.Stmt{poll, read} {
			if st != nil {
				st.Close()
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.sync(ctx, run)
		var err error
		if poll == nil {
			if poll, err = conn.PrepareContext(ctx, "PRAGMA data_version"); err != nil {
				poll = nil
				continue
			}
		}
		if read == nil {
			if read, err = conn.PrepareContext(ctx, h.s.q.evRead); err != nil {
				read = nil
				continue
			}
		}
		var v int64
		if err := poll.QueryRowContext(ctx).Scan(&v); err != nil {
			continue // transient (or ctx ended): try again next tick
		}
		if v == version {
			h.deliver(run, nil, false)
			continue
		}
		for {
			evs, err := h.read(ctx, read, last)
			if err != nil {
				break // version not advanced: read again at the next tick
			}
			if !h.deliverRuns(run, evs, last) {
				return
			}
			if len(evs) > 0 {
				last = evs[len(evs)-1].id
			}
			if len(evs) < evBatch {
				version = v
				break
			}
		}
	}
}

func (h *hub) read(ctx context.Context, stmt *sql.Stmt, after int64) ([]event, error) {
	rows, err := stmt.QueryContext(ctx, after, evBatch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var evs []event
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.id, &e.kind, &e.ns, &e.key, &e.owner, &e.token, &e.at, &e.data); err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// deliverRuns delivers evs, read after event id last, in runs of
// consecutive ids, each run preceded by an EventsLost marker when ids are
// missing before it. Committed event ids have no holes of their own
// (AUTOINCREMENT ids of rolled-back inserts are given again), so a missing
// id is an event pruned, or deleted by Purge, before this watcher read it:
// before the batch's first event or between two events of the batch. With
// no events it sends owed markers. It reports false if run is no longer
// the current watcher.
func (h *hub) deliverRuns(run *eventhub.Run, evs []event, last int64) bool {
	if len(evs) == 0 {
		return h.deliver(run, nil, false)
	}
	start := 0
	gap := evs[0].id > last+1
	for i := 1; i <= len(evs); i++ {
		if i < len(evs) && evs[i].id == evs[i-1].id+1 {
			continue
		}
		if !h.deliver(run, evs[start:i], gap) {
			return false
		}
		start, gap = i, true
	}
	return true
}

// deliver fans the namespace's events among evs out to the subscribers
// (eventhub.Hub.Deliver). gap: events were pruned before this watcher read
// them. It reports false if run is no longer the current watcher.
func (h *hub) deliver(run *eventhub.Run, evs []event, gap bool) bool {
	var locks []driver.LockEvent
	var circs []driver.CircuitRecord
	for _, e := range evs {
		if le, ok := h.lockEvent(e); ok {
			locks = append(locks, le)
		} else if cr, ok := h.circuitEvent(e); ok {
			circs = append(circs, cr)
		}
	}
	return h.Deliver(run, locks, circs, gap)
}

// lockEvent converts a lock event of this namespace.
func (h *hub) lockEvent(e event) (driver.LockEvent, bool) {
	var kind driver.LockEventKind
	switch e.kind {
	case "acquired":
		kind = driver.LockAcquired
	case "released":
		kind = driver.LockReleased
	case "expired":
		kind = driver.LockExpired
	default:
		return driver.LockEvent{}, false
	}
	key, ok := strings.CutPrefix(e.key, h.s.lockPfx)
	if !ok || e.ns != h.s.cfg.prefix {
		return driver.LockEvent{}, false
	}
	return driver.LockEvent{Kind: kind, Key: key, Owner: e.owner.String, Token: e.token.Int64, At: msTime(e.at)}, true
}

// circuitSnapshot is the JSON the circuit triggers store with each event.
type circuitSnapshot struct {
	State       string `json:"state"`
	Failures    int64  `json:"failures"`
	LastFailure *int64 `json:"last_failure"`
	LastSuccess *int64 `json:"last_success"`
	OpenedAt    *int64 `json:"opened_at"`
	ProbeOwner  string `json:"probe_owner"`
	ProbeUntil  *int64 `json:"probe_until"`
	Version     int64  `json:"version"`
	UpdatedAt   *int64 `json:"updated_at"`
	// The counts (absent in events written before they existed: 0).
	Successes     int64  `json:"successes"`
	TotalFailures int64  `json:"total_failures"`
	ConsecOK      int64  `json:"consecutive_successes"`
	IntervalStart *int64 `json:"interval_start"`
	Probes        int64  `json:"probes"`
	ProbeEpoch    int64  `json:"probe_epoch"`
}

func optMs(p *int64) time.Time {
	if p == nil {
		return time.Time{}
	}
	return msTime(*p)
}

// circuitEvent converts a circuit event of this namespace into the new
// record (a deleted circuit reads as closed).
func (h *hub) circuitEvent(e event) (driver.CircuitRecord, bool) {
	if e.kind != "circuit" && e.kind != "circuit-deleted" {
		return driver.CircuitRecord{}, false
	}
	name, ok := strings.CutPrefix(e.key, h.s.circPfx)
	if !ok || name == "" || e.ns != h.s.cfg.prefix {
		return driver.CircuitRecord{}, false
	}
	if e.kind == "circuit-deleted" {
		return driver.CircuitRecord{Name: name, State: driver.Closed, UpdatedAt: msTime(e.at)}, true
	}
	var snap circuitSnapshot
	if err := json.Unmarshal([]byte(e.data.String), &snap); err != nil {
		return driver.CircuitRecord{}, false
	}
	st := driver.CircuitState(snap.State)
	if !st.Valid() {
		st = driver.Closed
	}
	return driver.CircuitRecord{
		Name:        name,
		State:       st,
		Failures:    snap.Failures,
		LastFailure: optMs(snap.LastFailure),
		LastSuccess: optMs(snap.LastSuccess),
		OpenedAt:    optMs(snap.OpenedAt),
		ProbeOwner:  snap.ProbeOwner,
		ProbeUntil:  optMs(snap.ProbeUntil),
		Version:     snap.Version,
		UpdatedAt:   optMs(snap.UpdatedAt),

		Successes:            snap.Successes,
		TotalFailures:        snap.TotalFailures,
		ConsecutiveSuccesses: snap.ConsecOK,
		IntervalStart:        optMs(snap.IntervalStart),
		Probes:               snap.Probes,
		ProbeEpoch:           snap.ProbeEpoch,
	}, true
}

// Purge implements driver.Purger: in the namespace, expired cache entries,
// lapsed idempotency records, lock records idle for at least
// lockRetention and the fence rows of tasks without checkpoints unchanged
// for lockRetention; the lapsed entries of the waiters' queues; and the
// events older than the eventWindow newest (pruning by id, as the trigger
// does). Each is one DELETE statement.
func (s *store) Purge(ctx context.Context, lockRetention time.Duration) (int64, error) {
	var total int64
	for _, p := range []struct {
		query, prefix string
		cutoff        func(now int64) int64
	}{
		{s.q.purgeCache, s.cachePfx, func(now int64) int64 { return now }},
		{s.q.purgeIdem, s.cfg.prefix, func(now int64) int64 { return now }},
		{s.q.purgeLocks, s.lockPfx, func(now int64) int64 { return now - driver.Millis(lockRetention) }},
	} {
		cond, args := s.nsRange("key", p.prefix)
		n, err := s.execCount(ctx, strings.Replace(p.query, "%s", cond, 1), func(now int64) []any {
			return append(args, p.cutoff(now))
		})
		if err != nil {
			return total, err
		}
		total += n
	}
	cond, args := s.nsRange("task_id", s.cfg.prefix)
	n, err := s.execCount(ctx, strings.Replace(s.q.purgeFences, "%s", cond, 1), func(now int64) []any {
		return append(args, now-driver.Millis(lockRetention))
	})
	if err != nil {
		return total, err
	}
	total += n
	// Lapsed entries of the waiters' queues (not counted: they are not
	// records).
	cond, args = s.nsRange("key", s.lockPfx)
	if _, err := s.execCount(ctx, strings.Replace(s.q.purgeTurns, "%s", cond, 1), func(now int64) []any {
		return append(args, now)
	}); err != nil {
		return total, err
	}
	if _, err := s.execCount(ctx, s.q.purgeEvents, func(int64) []any {
		return []any{eventWindow}
	}); err != nil {
		return total, err
	}
	return total, nil
}
