package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// Notifications: every statement that changes a lock holding or a
// circuit calls pg_notify on the store's channel (one per set of tables)
// in a CTE of its own, so PostgreSQL delivers the notification when, and
// only when, the change commits. The payload is a small JSON object with
// the namespace; each store filters its own.
//
// A store that is watched keeps one dedicated connection (outside any
// pool, with the pool's settings) that LISTENs. When that connection
// drops, or stops answering the keep-alive ping, the store reconnects
// with back-off; once LISTEN is in effect again every watcher gets
// EventsLost (for circuit watchers, a record with an empty name), since
// changes made while disconnected were not delivered.

var errClosed = errors.New("postgres: store closed")

// Back-off bounds of the LISTEN connection's reconnection, and how long it
// may stay silent before the store pings it.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 5 * time.Second
	pingIdle   = 15 * time.Second
	pingWait   = 5 * time.Second
	listenWait = 10 * time.Second // bound of one reconnection attempt
)

// hub is the store's event watcher: one goroutine (run by the eventhub,
// started by the first watch and stopped with the last or when the store
// closes) listens on the store's channel and fans the namespace's events
// out to the subscribers.
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

// listen opens the dedicated connection and LISTENs on the channel.
func (h *hub) listen(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := h.s.db.connConfig(ctx)
	if err != nil {
		return nil, err
	}
	// The settings of a connection that exists carry that connection's
	// notification handler; this one buffers its own.
	cfg.OnNotification = nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{h.s.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// start LISTENs before the first Watch returns, so that every change
// committed afterwards is delivered.
func (h *hub) start(ctx context.Context) (func(context.Context, *eventhub.Run), error) {
	conn, err := h.listen(ctx)
	if err != nil {
		return nil, h.s.wrap(ctx, err)
	}
	return func(ctx context.Context, run *eventhub.Run) { h.loop(ctx, run, conn) }, nil
}

// loop reads notifications until ctx ends, reconnecting when the
// connection fails.
func (h *hub) loop(ctx context.Context, run *eventhub.Run, conn *pgx.Conn) {
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	backoff := minBackoff
	for ctx.Err() == nil {
		if conn == nil {
			lctx, cancel := context.WithTimeout(ctx, listenWait)
			c, err := h.listen(lctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				h.s.log.Debug("warden: reconnecting the PostgreSQL LISTEN connection failed", "error", err.Error())
				if !sleep(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, maxBackoff)
				continue
			}
			conn, backoff = c, minBackoff
			// Changes made while the connection was down were missed.
			if !h.Deliver(run, nil, nil, true) {
				return
			}
		}
		err := h.wait(ctx, run, conn)
		if ctx.Err() != nil || errors.Is(err, errStopped) {
			return
		}
		h.s.log.Warn("warden: the PostgreSQL LISTEN connection dropped; reconnecting (watchers get EventsLost)",
			"error", err.Error())
		closeConn(conn)
		conn = nil
	}
}

// errStopped says the run is no longer the hub's current watcher.
var errStopped = errors.New("watcher stopped")

// wait delivers notifications from conn until it fails, pinging it after
// pingIdle of silence.
func (h *hub) wait(ctx context.Context, run *eventhub.Run, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, pingIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) || conn.IsClosed() {
				return err
			}
			pctx, cancel := context.WithTimeout(ctx, pingWait)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
			continue
		}
		if n != nil && !h.handle(run, n.Payload) {
			return errStopped
		}
	}
}

// payload is a notification's JSON.
type payload struct {
	E  string `json:"e"` // a acquired, r released, c circuit changed, d circuit deleted
	N  string `json:"n"` // namespace
	K  string `json:"k"` // stored key
	O  string `json:"o"` // lock owner
	T  int64  `json:"t"` // lock token
	At int64  `json:"at"`

	S  string  `json:"s"`
	F  int64   `json:"f"`
	LF *int64  `json:"lf"`
	LS *int64  `json:"ls"`
	OA *int64  `json:"oa"`
	PO *string `json:"po"`
	PU *int64  `json:"pu"`
	V  int64   `json:"v"`
	U  *int64  `json:"u"`
	SC int64   `json:"sc"`
	TF int64   `json:"tf"`
	CS int64   `json:"cs"`
	IS *int64  `json:"is"`
	PR int64   `json:"pr"`
	PE int64   `json:"pe"`
}

func msTime(p *int64) time.Time {
	if p == nil {
		return time.Time{}
	}
	return time.UnixMilli(*p).UTC()
}

// handle delivers one notification if it is of the store's namespace. It
// reports false if run is no longer the current watcher.
func (h *hub) handle(run *eventhub.Run, raw string) bool {
	var p payload
	if err := json.Unmarshal([]byte(raw), &p); err != nil || p.N != h.s.prefix {
		return true
	}
	switch p.E {
	case "a", "r":
		key, ok := strings.CutPrefix(p.K, h.s.lockPfx)
		if !ok {
			return true
		}
		kind := driver.LockAcquired
		if p.E == "r" {
			kind = driver.LockReleased
		}
		return h.Deliver(run, []driver.LockEvent{{Kind: kind, Key: key, Owner: p.O, Token: p.T, At: time.UnixMilli(p.At).UTC()}}, nil, false)
	case "c", "d":
		name, ok := strings.CutPrefix(p.K, h.s.circPfx)
		if !ok || name == "" {
			return true
		}
		rec := driver.CircuitRecord{Name: name, State: driver.Closed, UpdatedAt: msTime(p.U)}
		if p.E == "c" {
			st := driver.CircuitState(p.S)
			if !st.Valid() {
				st = driver.Closed
			}
			rec.State, rec.Failures, rec.Version = st, p.F, p.V
			rec.LastFailure, rec.LastSuccess, rec.OpenedAt = msTime(p.LF), msTime(p.LS), msTime(p.OA)
			rec.ProbeUntil = msTime(p.PU)
			rec.Successes, rec.TotalFailures, rec.ConsecutiveSuccesses = p.SC, p.TF, p.CS
			rec.IntervalStart, rec.Probes, rec.ProbeEpoch = msTime(p.IS), p.PR, p.PE
			if p.PO != nil {
				rec.ProbeOwner = *p.PO
			}
		}
		return h.Deliver(run, nil, []driver.CircuitRecord{rec}, false)
	}
	return true
}

// sleep waits d or until ctx ends; it reports whether it slept the whole
// time.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
