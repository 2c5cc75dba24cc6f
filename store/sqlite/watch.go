package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden/driver"
)

// watchBuffer is the capacity of each watch channel. A watcher that lets it
// fill up loses events and gets an EventsLost marker once there is room.
const watchBuffer = 256

// evBatch is how many events the watcher reads per query.
const evBatch = 512

// errClosed is returned by Watch calls on a closed store.
var errClosed = errors.New("sqlite: store closed")

// hub owns the store's notification watcher: one goroutine, started by the
// first WatchLocks or WatchCircuits call and stopped when the last watch
// ends or the store closes. It polls PRAGMA data_version on a dedicated
// connection; when another connection or process has committed, it reads
// the new rows of the events table and fans them out.
type hub struct {
	s *store

	mu     sync.Mutex
	subs   map[*watchSub]struct{}
	run    *watchRun // the running watcher; nil when stopped
	closed bool
	wg     sync.WaitGroup // running watcher goroutines
}

type watchRun struct {
	cancel context.CancelFunc
}

// watchSub is one WatchLocks or WatchCircuits channel.
type watchSub struct {
	locks   chan driver.LockEvent     // set for lock watchers
	circs   chan driver.CircuitRecord // set for circuit watchers
	lost    bool                      // events were dropped; a marker is owed
	stopCtx func() bool               // unregisters the context.AfterFunc
}

func newHub(s *store) *hub {
	return &hub{s: s, subs: map[*watchSub]struct{}{}}
}

// WatchLocks implements driver.LockNotifier.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	sub := &watchSub{locks: make(chan driver.LockEvent, watchBuffer)}
	if err := s.hub.subscribe(ctx, sub); err != nil {
		return nil, err
	}
	return sub.locks, nil
}

// WatchCircuits implements driver.CircuitNotifier.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	sub := &watchSub{circs: make(chan driver.CircuitRecord, watchBuffer)}
	if err := s.hub.subscribe(ctx, sub); err != nil {
		return nil, err
	}
	return sub.circs, nil
}

// subscribe registers sub until ctx ends, starting the watcher if needed.
// Every event committed after subscribe returns is delivered to sub.
func (h *hub) subscribe(ctx context.Context, sub *watchSub) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if h.run == nil {
		if err := h.start(ctx); err != nil {
			return ctxErr(ctx, err)
		}
	}
	h.subs[sub] = struct{}{}
	sub.stopCtx = context.AfterFunc(ctx, func() { h.unsubscribe(sub) })
	return nil
}

// unsubscribe removes sub and closes its channel; the watcher stops with
// the last subscriber.
func (h *hub) unsubscribe(sub *watchSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[sub]; !ok {
		return
	}
	delete(h.subs, sub)
	sub.close()
	if len(h.subs) == 0 && h.run != nil {
		h.run.cancel()
		h.run = nil
	}
}

func (sub *watchSub) close() {
	if sub.locks != nil {
		close(sub.locks)
	} else {
		close(sub.circs)
	}
}

// close stops the watcher, closes every channel and waits for the watcher
// goroutine to end.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	for sub := range h.subs {
		sub.stopCtx()
		sub.close()
	}
	clear(h.subs)
	if h.run != nil {
		h.run.cancel()
		h.run = nil
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// start opens the watcher's connection, records where the event stream
// stands, and starts the goroutine. Called with h.mu held.
func (h *hub) start(ctx context.Context) error {
	s := h.s
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
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
		return err
	}
	rctx, cancel := context.WithCancel(context.Background())
	run := &watchRun{cancel: cancel}
	h.run = run
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer conn.Close()
		h.loop(rctx, run, conn, version, last)
	}()
	return nil
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

func (h *hub) loop(ctx context.Context, run *watchRun, conn *sql.Conn, version, last int64) {
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
			gap := len(evs) > 0 && evs[0].id > last+1
			if len(evs) > 0 {
				last = evs[len(evs)-1].id
			}
			if !h.deliver(run, evs, gap) {
				return
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

// deliver fans evs out to the subscribers of the namespace, without ever
// blocking. gap: events were pruned before this watcher read them, so
// every subscriber is owed an EventsLost marker. It reports false if run
// is no longer the current watcher.
func (h *hub) deliver(run *watchRun, evs []event, gap bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.run != run {
		return false
	}
	for sub := range h.subs {
		if gap {
			sub.lost = true
		}
		sub.flushLost()
	}
	for _, e := range evs {
		if le, ok := h.lockEvent(e); ok {
			for sub := range h.subs {
				if sub.locks != nil && sub.flushLost() {
					select {
					case sub.locks <- le:
					default:
						sub.lost = true
					}
				}
			}
			continue
		}
		if cr, ok := h.circuitEvent(e); ok {
			for sub := range h.subs {
				if sub.circs != nil && sub.flushLost() {
					select {
					case sub.circs <- cr:
					default:
						sub.lost = true
					}
				}
			}
		}
	}
	return true
}

// flushLost sends an owed EventsLost marker if there is room; it reports
// whether nothing is owed any more.
func (sub *watchSub) flushLost() bool {
	if !sub.lost {
		return true
	}
	if sub.locks != nil {
		select {
		case sub.locks <- driver.LockEvent{Kind: driver.EventsLost}:
			sub.lost = false
		default:
		}
	} else {
		select {
		case sub.circs <- driver.CircuitRecord{}:
			sub.lost = false
		default:
		}
	}
	return !sub.lost
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
	}, true
}

// Purge implements driver.Purger: in the namespace, expired cache entries,
// lapsed idempotency records, lock records idle for at least
// lockRetention and the fence rows of tasks without checkpoints unchanged
// for lockRetention; and events older than the event retention. Each is
// one DELETE statement.
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
	if _, err := s.execCount(ctx, s.q.purgeEvents, func(now int64) []any {
		return []any{now - eventRetentionMs}
	}); err != nil {
		return total, err
	}
	return total, nil
}
