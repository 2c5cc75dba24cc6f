package redis

import (
	"context"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/eventhub"
)

// Events: the scripts PUBLISH every lock acquisition and release and every
// circuit change on the namespace's channel. A store has one subscription,
// opened with its first watcher and closed with its last. go-redis
// reconnects a broken subscription and subscribes again; events published
// in between are lost, so every reconnection is reported to the watchers
// as EventsLost (an empty-named record to circuit watchers).

// WatchLocks implements driver.LockNotifier.
func (s *store) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	return s.hub.WatchLocks(ctx)
}

// WatchCircuits implements driver.CircuitNotifier.
func (s *store) WatchCircuits(ctx context.Context) (<-chan driver.CircuitRecord, error) {
	return s.hub.WatchCircuits(ctx)
}

// startWatcher subscribes to the channel, waiting for the server's
// confirmation so that every event published after Watch returns is
// delivered, and returns the loop reading it.
func (s *store) startWatcher(ctx context.Context) (func(context.Context, *eventhub.Run), error) {
	ps := s.client.Subscribe(ctx, s.channel)
	if _, err := ps.ReceiveTimeout(ctx, time.Minute); err != nil {
		ps.Close()
		return nil, s.fail(ctx, err)
	}
	return func(ctx context.Context, run *eventhub.Run) {
		defer ps.Close()
		stop := context.AfterFunc(ctx, func() { ps.Close() })
		defer stop()
		failing := false
		for {
			msg, err := ps.Receive(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				// The connection broke: go-redis reconnects and
				// resubscribes on the next Receive (whose confirmation is
				// an EventsLost too). The watchers are told once per run
				// of failures, not once per attempt: each EventsLost wakes
				// every waiting Acquire of their processes and has Watch
				// list the locks again, all in vain while the server is
				// down. Wait a little between attempts so that it is not
				// hammered either.
				if !failing {
					failing = true
					if !s.hub.Deliver(run, nil, nil, true) {
						return
					}
					continue
				}
				t := time.NewTimer(100 * time.Millisecond)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				continue
			}
			failing = false
			switch m := msg.(type) {
			case *goredis.Subscription:
				// A subscription confirmed after a reconnection: events
				// may have been published in between.
				if !s.hub.Deliver(run, nil, nil, true) {
					return
				}
			case *goredis.Message:
				var locks []driver.LockEvent
				var circs []driver.CircuitRecord
				if ev, ok := decodeLockEvent(m.Payload); ok {
					locks = append(locks, ev)
				} else if rec, ok := decodeCircuitEvent(m.Payload); ok {
					circs = append(circs, rec)
				} else {
					continue
				}
				if !s.hub.Deliver(run, locks, circs, false) {
					return
				}
			}
		}
	}, nil
}

// cutN splits the first n colon-terminated fields off p.
func cutN(p string, n int) ([]string, string, bool) {
	out := make([]string, n)
	for i := range out {
		j := strings.IndexByte(p, ':')
		if j < 0 {
			return nil, "", false
		}
		out[i], p = p[:j], p[j+1:]
	}
	return out, p, true
}

func atoi(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// decodeLockEvent parses "L<kind>:<token>:<at>:<len(owner)>:<owner><key>".
func decodeLockEvent(p string) (driver.LockEvent, bool) {
	rest, ok := strings.CutPrefix(p, "L")
	if !ok {
		return driver.LockEvent{}, false
	}
	f, rest, ok := cutN(rest, 4)
	if !ok {
		return driver.LockEvent{}, false
	}
	kind, ok1 := atoi(f[0])
	tok, ok2 := atoi(f[1])
	at, ok3 := atoi(f[2])
	n, ok4 := atoi(f[3])
	if !ok1 || !ok2 || !ok3 || !ok4 || n < 0 || int(n) > len(rest) {
		return driver.LockEvent{}, false
	}
	return driver.LockEvent{
		Kind: driver.LockEventKind(kind), Token: tok, At: ms(at), Owner: rest[:n], Key: rest[n:],
	}, true
}
