package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// evBatch is how many events the watcher reads per query.
const evBatch = 512

// errClosed is returned by Watch calls on a closed store.
var errClosed = errors.New("sqlite: store closed")

// hub is the store's notification watcher: one goroutine (run by the
// eventhub, started by the first WatchLocks or WatchCircuits call and
// stopped when the last watch ends or the store closes) polls PRAGMA
// data_version on a dedicated connection; when another connection or
// process has committed, it reads the new rows of the events table and
// fans them out.
type hub struct {
	*eventhub.Hub
	s *store
}

func newHub(s *store) *hub {
	h := &hub{s: s}
	h.Hub = eventhub.New(h.start, errClosed)
	return h
}

// WatchLocks implements driver.LockNotifier.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return s.hub.WatchLocks(ctx)
}

// WatchCircuits implements driver.CircuitNotifier.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return s.hub.WatchCircuits(ctx)
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
// for lockRetention; and the events older than the eventWindow newest
// (pruning by id, as the trigger does). Each is one DELETE statement.
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
	if _, err := s.execCount(ctx, s.q.purgeEvents, func(int64) []any {
		return []any{eventWindow}
	}); err != nil {
		return total, err
	}
	return total, nil
}
