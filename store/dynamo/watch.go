package dynamo

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// errClosed is returned by Watch calls on a closed store.
var errClosed = errors.New("dynamo: store closed")

// hub is the store's notification watcher: one goroutine (run by the
// eventhub, started by the first WatchLocks or WatchCircuits call and
// stopped when the last watch ends or the store closes). Every EventPoll
// it queries the events index for the items of the namespace written in
// the last EventLookback, and turns the changes it has not seen yet into
// events.
type hub struct {
	*eventhub.Hub
	s *store
}

func newHub(s *store) *hub {
	h := &hub{s: s}
	h.Hub = eventhub.New(func(context.Context) (func(context.Context, *eventhub.Run), error) {
		return h.loop, nil
	}, errClosed)
	return h
}

// WatchLocks implements driver.LockNotifier.
func (s notifyStore) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return s.hub.WatchLocks(ctx)
}

// WatchCircuits implements driver.CircuitNotifier.
func (s notifyStore) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return s.hub.WatchCircuits(ctx)
}

// lockSeen is the last state of a lock item the watcher saw.
type lockSeen struct {
	owner    string
	token    int64
	released bool
	exp      int64
	gsk      string
}

// circSeen is the last state of a circuit item the watcher saw.
type circSeen struct {
	version int64
	gsk     string
}

// watchState is the watcher's memory of what it delivered.
type watchState struct {
	start int64 // ms when the watcher started
	locks map[string]*lockSeen
	circs map[string]*circSeen
}

func (h *hub) loop(ctx context.Context, run *eventhub.Run) {
	s := h.s
	st := &watchState{start: nowMs(), locks: map[string]*lockSeen{}, circs: map[string]*circSeen{}}
	t := time.NewTicker(s.poll)
	defer t.Stop()
	failed := false
	for {
		wantLocks, wantCircs := h.Wants()
		since := nowMs() - s.lookback.Milliseconds()
		var levs []driver.LockEvent
		var crecs []driver.CircuitRecord
		gap := false
		var err error
		if wantLocks {
			var its []item
			if its, err = h.read(ctx, s.lockEvt, since); err == nil {
				s.noteSeen(its)
				levs, gap = st.lockEvents(s, its)
			}
		}
		if wantCircs && err == nil {
			var its []item
			var g bool
			if its, err = h.read(ctx, s.circEvt, since); err == nil {
				crecs, g = st.circEvents(s, its)
				gap = gap || g
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failed = true // tell the subscribers once the index answers again
		default:
			if !h.Deliver(run, levs, crecs, gap || failed) {
				return
			}
			failed = false
			st.prune(since, nowMs())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// read queries the events index for the items of gpk written after since.
func (h *hub) read(ctx context.Context, gpk string, since int64) ([]item, error) {
	s := h.s
	cond := "#gpk = :g AND #gsk > :since"
	names, values := exprArgs(item{":g": vS(gpk), ":since": vS(gskOf(since, ""))}, cond)
	in := &dynamodb.QueryInput{
		TableName:                 &s.table,
		IndexName:                 aws.String(EventsIndex),
		KeyConditionExpression:    &cond,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}
	var out []item
	for {
		page, err := s.c.Query(ctx, in)
		if err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
		if len(page.LastEvaluatedKey) == 0 {
			return out, nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
}

// gskMs is the write time in a gsk.
func gskMs(gsk string) int64 {
	i := strings.IndexByte(gsk, '#')
	if i < 0 {
		return 0
	}
	n, _ := strconv.ParseInt(gsk[:i], 10, 64)
	return n
}

// lockEvents turns lock items into the events since the state the watcher
// saw last. A holding that began and ended between two polls is reported
// as acquired then released; holdings skipped entirely (the token jumped
// by more than one) make gap true.
func (st *watchState) lockEvents(s *store, its []item) (evs []driver.LockEvent, gap bool) {
	for _, it := range its {
		pk := gS(it, aPk)
		key, ok := cutPrefix(pk, s.lockPfx)
		if !ok {
			continue
		}
		cur := &lockSeen{owner: gS(it, aOwner), token: gN(it, aVersion), released: has(it, aRel), exp: gN(it, aExp), gsk: gS(it, aGsk)}
		acq := gN(it, aAcq)
		acquired := driver.LockEvent{Kind: driver.LockAcquired, Key: key, Owner: cur.owner, Token: cur.token, At: msTime(acq)}
		released := driver.LockEvent{Kind: driver.LockReleased, Key: key, Owner: cur.owner, Token: cur.token, At: msTime(gN(it, aRel))}
		prev := st.locks[pk]
		switch {
		case prev == nil:
			if acq >= st.start-s.lookback.Milliseconds() {
				evs = append(evs, acquired)
			}
			if cur.released {
				evs = append(evs, released)
			}
		case cur.token > prev.token:
			if !prev.released {
				kind := driver.LockReleased
				at := msTime(acq)
				if prev.exp <= acq {
					kind, at = driver.LockExpired, msTime(prev.exp)
				}
				evs = append(evs, driver.LockEvent{Kind: kind, Key: key, Owner: prev.owner, Token: prev.token, At: at})
			}
			if cur.token > prev.token+1 {
				gap = true
			}
			evs = append(evs, acquired)
			if cur.released {
				evs = append(evs, released)
			}
		case cur.token == prev.token:
			if !prev.released && cur.released {
				evs = append(evs, released)
			}
		default:
			continue // an older state, read late from the index
		}
		st.locks[pk] = cur
	}
	return evs, gap
}

// circEvents turns circuit items into the records not delivered yet.
// Versions skipped between two polls make gap true.
func (st *watchState) circEvents(s *store, its []item) (recs []driver.CircuitRecord, gap bool) {
	for _, it := range its {
		pk := gS(it, aPk)
		name, ok := cutPrefix(pk, s.circPfx)
		if !ok {
			continue
		}
		cur := &circSeen{version: gN(it, aVersion), gsk: gS(it, aGsk)}
		prev := st.circs[pk]
		if prev != nil {
			if cur.gsk == prev.gsk || gskMs(cur.gsk) < gskMs(prev.gsk) {
				continue
			}
			if cur.version > prev.version+1 {
				gap = true
			}
		}
		st.circs[pk] = cur
		recs = append(recs, circRec(name, it))
	}
	return recs, gap
}

// prune forgets items that later polls no longer read: circuits written
// before since, and locks released or expired and written before since.
// Live holdings are kept, so that their end is reported.
func (st *watchState) prune(since, now int64) {
	for pk, c := range st.circs {
		if gskMs(c.gsk) <= since {
			delete(st.circs, pk)
		}
	}
	for pk, l := range st.locks {
		if gskMs(l.gsk) <= since && (l.released || l.exp <= now) {
			delete(st.locks, pk)
		}
	}
}
