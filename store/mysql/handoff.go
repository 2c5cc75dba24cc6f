package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Lock hand-off through named locks.
//
// MySQL has no notifications, but it queues the sessions waiting in
// GET_LOCK(name, timeout) for a named lock, grants it in the order they
// asked, and frees a session's named locks the moment the session ends.
// The store uses one named lock per lock key (lockName) as an admission
// queue and wake-up signal beside the lock row; the row alone decides who
// holds the lock, as before (TTL, fencing tokens, `lock ls`, a holder
// surviving a dropped connection):
//
//   - An acquire takes the key's named lock in the same statement as the
//     row (GET_LOCK(name, 0) in the upsert), on a connection it then keeps
//     for the holding (the holding's connection). It fails without waiting
//     when the named lock is busy.
//   - A release ends the holding and releases the named lock in one
//     statement on that connection. The server grants the named lock to
//     the first queued waiter at once, and the release records that
//     waiter's session in the row's handoff column: for handoffGrace at
//     most, the row is reserved for it — an acquire from any other session
//     (the releaser asking again included) is refused, so a hand-off goes
//     to the waiters in the order they queued, across processes. A woken
//     waiter that gives its turn up passes the reservation on (passOn).
//   - A waiter (WaitLock, used by the lock package between attempts)
//     blocks in GET_LOCK(name, timeout) on a connection of its own. Granted,
//     it tries the acquire at once on that connection, which becomes the
//     holding's; if the row shows a holder outside the queue (one whose
//     process died — its session, and so the named lock, ended with it —,
//     one without a connection of its own, another program), it keeps its
//     turn and polls as before, until that holding ends or expires.
//
// Connections out for holdings and waiters are bounded per store
// (Options.HandoffConns); beyond the bound an acquire takes the row
// without the named lock (its waiters then poll) and WaitLock declines
// (the waiter polls). A holding whose store sees no successful refresh
// until its expiry gives its connection up. Nothing of this decides
// exclusion: a named lock lost (a killed session) or held too long (a
// hung process) only costs the wake-up, never a second holder.

// handoffGrace bounds how long a released lock stays reserved for the
// waiter its release woke: long enough for a waiter on a busy machine to
// be scheduled and send its acquire, short enough that a waiter that hung
// right after being woken delays the others by no more.
const handoffGrace = 2 * time.Second

// defaultHandoffConns is the default bound of the connections a store
// keeps out for holdings and waiters (Options.HandoffConns).
const defaultHandoffConns = 8

// killTimeout bounds the KILL QUERY that interrupts a wait whose context
// ended, and the one Close sends for each wait in flight.
const killTimeout = 5 * time.Second

// handoff is a store's named-lock state.
type handoff struct {
	s     *store
	limit int    // connections out at most; 0: hand-off off
	frac  bool   // GET_LOCK takes fractional seconds (MariaDB)
	space string // the database and locks table, hashed into lock names

	ctx    context.Context // cancelled by close: ends the waits in flight
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	out    int                 // connections out: holdings', turns', waits'
	turns  map[turnKey]*turn   // named locks held, by stored key and owner
	waits  map[*sql.Conn]int64 // waits in flight and their sessions
	wg     sync.WaitGroup      // expiry callbacks running
}

type turnKey struct{ key, owner string }

// turn is a named lock one owner of this store holds on a connection of
// its own: a waiter's turn, or (token ≠ 0) a holding's.
type turn struct {
	k    turnKey
	name string
	conn *sql.Conn
	// use serializes the statements on conn. Fields below are guarded by
	// handoff.mu.
	use   sync.Mutex
	token int64       // the holding's token; 0: a turn not yet a holding
	until time.Time   // the holding's expiry by the local clock
	timer *time.Timer // gives the connection up past until
	dead  bool
}

// newHandoff sets up the named-lock state of s; limit < 0 turns hand-off
// off, 0 is the default.
func newHandoff(ctx context.Context, s *store, limit int) (*handoff, error) {
	h := &handoff{s: s, turns: map[turnKey]*turn{}, waits: map[*sql.Conn]int64{}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	switch {
	case limit < 0:
		limit = 0
	case limit == 0:
		limit = defaultHandoffConns
		// Leave most of a bounded pool to the other statements.
		if n := s.db.Stats().MaxOpenConnections; n > 0 {
			limit = min(limit, n/4)
		}
	}
	h.limit = limit
	var version, dbName sql.NullString
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION(), DATABASE()").Scan(&version, &dbName); err != nil {
		return nil, ctxErr(ctx, err)
	}
	h.frac = strings.Contains(strings.ToLower(version.String), "mariadb")
	h.space = dbName.String + "\x00" + s.t.Locks + "\x00"
	return h, nil
}

// lockName is the named lock of a stored lock key: named locks are
// server-wide, so the name covers the database and the table; MySQL
// takes names of at most 64 characters, so the key is hashed.
func (h *handoff) lockName(sk string) string {
	sum := sha256.Sum256([]byte(h.space + sk))
	return "warden:" + hex.EncodeToString(sum[:20])
}

// conn takes a connection for a holding or a wait, within the limit; nil
// when none may be taken (limit reached, hand-off off, store closed).
func (h *handoff) conn(ctx context.Context) (*sql.Conn, error) {
	h.mu.Lock()
	if h.closed || h.out >= h.limit {
		h.mu.Unlock()
		return nil, nil
	}
	h.out++
	h.mu.Unlock()
	c, err := h.s.db.Conn(ctx)
	if err != nil {
		h.put(nil, false)
		return nil, err
	}
	return c, nil
}

// put gives a connection back: to the pool, or closed when bad says it
// may still hold a named lock or is broken (its session then ends, and
// with it the named lock).
func (h *handoff) put(c *sql.Conn, bad bool) {
	if c != nil {
		if bad {
			_ = c.Raw(func(any) error { return sqldriver.ErrBadConn })
		}
		_ = c.Close()
	}
	h.mu.Lock()
	h.out--
	h.mu.Unlock()
}

// take returns owner's named lock of sk, its use lock held, or nil. The
// caller ends with done or drop.
func (h *handoff) take(sk, owner string) *turn {
	h.mu.Lock()
	t := h.turns[turnKey{sk, owner}]
	h.mu.Unlock()
	if t == nil {
		return nil
	}
	t.use.Lock()
	h.mu.Lock()
	dead := t.dead
	h.mu.Unlock()
	if dead {
		h.done(t)
		return nil
	}
	return t
}

// done ends a use of t. If t was dropped meanwhile (Close, a newer turn),
// its connection goes now, closed.
func (h *handoff) done(t *turn) {
	h.mu.Lock()
	c := t.conn
	if t.dead {
		t.conn = nil
	}
	h.mu.Unlock()
	if t.dead && c != nil {
		h.put(c, true)
	}
	t.use.Unlock()
}

// drop forgets t, whose use lock the caller holds, gives its connection
// back (bad: closed, as it may hold the named lock) and ends the use.
func (h *handoff) drop(t *turn, bad bool) {
	h.mu.Lock()
	c := t.conn
	t.conn = nil
	h.forget(t)
	h.mu.Unlock()
	if c != nil {
		h.put(c, bad)
	}
	t.use.Unlock()
}

// forget marks t dead and removes it; h.mu must be held. Its connection
// goes with the next done or drop, or at once if nobody uses it.
func (h *handoff) forget(t *turn) {
	t.dead = true
	if h.turns[t.k] == t {
		delete(h.turns, t.k)
	}
	if t.timer != nil {
		t.timer.Stop()
	}
}

// add records a named lock now held on c; token ≠ 0 for a holding that
// expires at until (local clock).
func (h *handoff) add(sk, owner, name string, c *sql.Conn, token int64, until time.Time) {
	t := &turn{k: turnKey{sk, owner}, name: name, conn: c}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.put(c, true)
		return
	}
	old := h.turns[t.k]
	oldIdle := false
	if old != nil {
		// Cannot happen while the lock package keeps one attempt per key
		// and owner in flight; end the older one all the same.
		h.forget(old)
		oldIdle = old.use.TryLock()
	}
	h.turns[t.k] = t
	if token != 0 {
		h.hold(t, token, until)
	}
	h.mu.Unlock()
	if oldIdle {
		h.done(old)
	}
}

// hold makes t a holding's, expiring at until; h.mu must be held.
func (h *handoff) hold(t *turn, token int64, until time.Time) {
	t.token, t.until = token, until
	d := time.Until(until) + 100*time.Millisecond
	if t.timer == nil {
		t.timer = time.AfterFunc(d, func() { h.expire(t) })
	} else {
		t.timer.Reset(d)
	}
}

// expire gives up the connection of a holding that saw no successful
// refresh until its expiry: the lease is lost, and keeping the named lock
// would only keep the next waiters from being woken.
func (h *handoff) expire(t *turn) {
	h.mu.Lock()
	if h.closed || t.dead {
		h.mu.Unlock()
		return
	}
	if d := time.Until(t.until); d > 0 {
		t.timer.Reset(d + 100*time.Millisecond)
		h.mu.Unlock()
		return
	}
	if !t.use.TryLock() {
		// A statement of its own runs on it (a late release): look
		// again later.
		t.timer.Reset(time.Second)
		h.mu.Unlock()
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	defer h.wg.Done()
	h.drop(t, true)
}

// refreshed extends owner's holding of sk (token) to until after a
// successful refresh, or gives its named lock up when ok is false (the
// holding is no longer owner's).
func (h *handoff) refreshed(sk, owner string, token int64, ok bool, until time.Time) {
	h.mu.Lock()
	t := h.turns[turnKey{sk, owner}]
	if t == nil || t.dead || t.token != token {
		h.mu.Unlock()
		return
	}
	if ok {
		h.hold(t, token, until)
		h.mu.Unlock()
		return
	}
	h.forget(t)
	locked := t.use.TryLock()
	h.mu.Unlock()
	if locked {
		h.done(t)
	}
}

// WaitLock implements driver.LockWaiter: GET_LOCK on a connection of its
// own, for at most max (and never past ctx's deadline). Granted, the
// connection stays with the owner's turn for the acquire that follows.
func (s *store) WaitLock(ctx context.Context, key, owner string, max time.Duration) (bool, error) {
	h := s.ho
	sk := s.lockPfx + key
	h.mu.Lock()
	closed := h.closed
	_, has := h.turns[turnKey{sk, owner}]
	h.mu.Unlock()
	if closed {
		return false, warden.ErrClosed
	}
	if has {
		// Owner's turn came already, and its attempt still found the key
		// held: by a holder outside the queue. Poll.
		return false, nil
	}
	if dl, ok := ctx.Deadline(); ok {
		max = min(max, time.Until(dl))
	}
	if max <= 0 {
		return ctx.Err() == nil, ctx.Err()
	}
	c, _ := h.conn(ctx)
	if c == nil {
		// No connection to wait on (limit reached, or the pool failed):
		// poll.
		return false, ctx.Err()
	}
	var id int64
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		h.put(c, true)
		if cerr := ctx.Err(); cerr != nil {
			return false, cerr
		}
		return false, nil
	}
	secs := max.Seconds()
	if h.frac {
		secs = math.Ceil(secs*1000) / 1000
	} else {
		secs = math.Ceil(secs) // MySQL waits whole seconds
	}
	name := h.lockName(sk)
	got, werr := h.wait(ctx, c, id, name, secs)
	switch {
	case werr != nil:
		// Interrupted (ctx, Close) or failed: the session may still be
		// queued or hold the named lock; closing it ends both.
		h.put(c, true)
		if cerr := ctx.Err(); cerr != nil {
			return false, cerr
		}
		if h.ctx.Err() != nil {
			return false, warden.ErrClosed
		}
		return false, nil
	case got && ctx.Err() != nil:
		// Granted as the caller gave up: pass the turn on.
		lctx, cancel := context.WithTimeout(h.ctx, killTimeout)
		rerr := h.passOn(lctx, c, sk, name)
		cancel()
		h.put(c, rerr != nil)
		return false, ctx.Err()
	case got:
		h.add(sk, owner, name, c, 0, time.Time{})
		return true, nil
	}
	h.put(c, false)
	if cerr := ctx.Err(); cerr != nil {
		return false, cerr
	}
	return true, nil // max passed: look again
}

// errWaitKilled: a wait ended by KILL QUERY (MariaDB returns NULL).
var errWaitKilled = errors.New("mysql: named-lock wait interrupted")

// wait runs GET_LOCK(name, secs) on c (session id). If ctx ends first,
// the wait is interrupted with KILL QUERY from another connection, and
// wait returns once the statement has ended — never leaving a kill in
// flight that could hit a later statement on c. A kill that misses (sent
// before the statement began, or the server unreachable) is followed by
// closing the connection. Close interrupts the wait too.
func (h *handoff) wait(ctx context.Context, c *sql.Conn, id int64, name string, secs float64) (bool, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return false, warden.ErrClosed
	}
	h.waits[c] = id
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.waits, c)
		h.mu.Unlock()
	}()
	// The statement's own bound: the server answers 0 after secs; the
	// slack covers a server that cannot answer (a cut network).
	qctx, cancel := context.WithTimeout(h.ctx, time.Duration(secs*float64(time.Second))+10*time.Second)
	defer cancel()
	done := make(chan struct{})
	killed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(killed)
		h.kill(id)
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			cancel()
		}
	})
	var r sql.NullInt64
	err := c.QueryRowContext(qctx, "SELECT GET_LOCK(?, ?)", name, secs).Scan(&r)
	close(done)
	if !stop() {
		<-killed
	}
	switch {
	case err != nil:
		return false, err
	case !r.Valid:
		return false, errWaitKilled
	}
	return r.Int64 == 1, nil
}

// kill interrupts the statement running on session id.
func (h *handoff) kill(id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	_, _ = h.s.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatInt(id, 10))
}

// LeaveLock implements driver.LockWaiter: owner gives its turn for key
// up, unless it became a holding.
func (s *store) LeaveLock(key, owner string) {
	h := s.ho
	t := h.take(s.lockPfx+key, owner)
	if t == nil {
		return
	}
	h.mu.Lock()
	holding := t.token != 0
	h.mu.Unlock()
	if holding {
		h.done(t)
		return
	}
	ctx, cancel := context.WithTimeout(h.ctx, killTimeout)
	defer cancel()
	h.drop(t, h.passOn(ctx, t.conn, t.k.key, t.name) != nil)
}

// passOn gives up the named lock held on c, and with it a reservation
// of the key's row made for c's session: the row is reserved for the
// next waiter instead (the one the server grants the named lock to).
func (h *handoff) passOn(ctx context.Context, c *sql.Conn, sk, name string) error {
	s := h.s
	res, err := c.ExecContext(ctx, s.q.lockLeaveN, name, name, s.prefix, sk)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 0 {
		_, err = c.ExecContext(ctx, "DO RELEASE_LOCK(?)", name)
	}
	return err
}

// close ends the store's named-lock work: waits in flight are interrupted
// and end, every connection kept for a holding or a turn is closed (its
// session, and its named lock, end) — at once, or when the statement
// running on it ends — and no expiry callback runs after.
func (h *handoff) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	var idle []*turn
	for _, t := range h.turns {
		h.forget(t)
		if t.use.TryLock() {
			idle = append(idle, t)
		}
	}
	var ids []int64
	for _, id := range h.waits {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, t := range idle {
		h.done(t)
	}
	var kills sync.WaitGroup
	for _, id := range ids {
		kills.Go(func() { h.kill(id) })
	}
	kills.Wait()
	h.cancel()
	h.wg.Wait()
}

var _ driver.LockWaiter = (*store)(nil)
