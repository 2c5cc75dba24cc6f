package lock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/internal/testkit"
)

// lossyAcquires is a store whose lock stream replaces every Acquired event
// by EventsLost, as a receiver that fell behind would see it.
type lossyAcquires struct{ driver.Store }

func (s lossyAcquires) WatchLocks(ctx context.Context) (<-chan driver.LockEvent, error) {
	src, err := s.Store.(driver.LockNotifier).WatchLocks(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan driver.LockEvent)
	go func() { // ends when src does, with ctx
		defer close(out)
		for ev := range src {
			if ev.Kind == driver.LockAcquired {
				ev = driver.LockEvent{Kind: driver.EventsLost, At: ev.At}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestWatchTracksAfterEventsLost: a holding whose Acquired event was lost is
// found by the listing Watch makes after the EventsLost, and its lapse is
// reported.
func TestWatchTracksAfterEventsLost(t *testing.T) {
	db := testkit.DBName(t)
	w := openEnv(t, db, func(d driver.Store) driver.Store { return lossyAcquires{d} }).locker(t, &Options{PollInterval: 10 * time.Millisecond})
	a := openEnv(t, db, nil).locker(t, &Options{TTL: 100 * time.Millisecond, DisableAutoRefresh: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := w.Watch(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	s, err := a.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, ch); ev.Kind != EventsLost {
		t.Fatalf("first event %+v, want EventsLost", ev)
	}
	if ev := expectEvent(t, ch, Expired, "job", a.Owner()); ev.Token != s.Token() {
		t.Fatalf("expired %+v, want token %d", ev, s.Token())
	}
}
