package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/internal/testkit"
)

// observer collects what Do reports to Options.Observe.
type observer struct {
	mu  sync.Mutex
	obs []idempotency.Observation
}

func (o *observer) observe(_ context.Context, ob idempotency.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.obs = append(o.obs, ob)
}

func (o *observer) take() []idempotency.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.obs
	o.obs = nil
	return c
}

// Each claim outcome is observed once per Do, with Do's error; a
// duplicate's wait is observed with the claimant it waited for.
func TestObserveOutcomesAndWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	claims := make(chan struct{}, 256)
	st := openStore(t, testkit.DBName(t), warden.HookFunc(func(_ context.Context, op warden.OpInfo) {
		if op.Op == "idempotency.claim" && op.Key == "waited" {
			select {
			case claims <- struct{}{}:
			default:
			}
		}
	}))
	o := &observer{}
	opts := fast(idemOpts{Observe: o.observe})
	one := func(context.Context) (int, error) { return 1, nil }

	if v, err := idempotency.Do(ctx, st, "k", opts, one); v != 1 || err != nil {
		t.Fatalf("Do = %v, %v", v, err)
	}
	if v, err := idempotency.Do(ctx, st, "k", opts, one); v != 1 || err != nil {
		t.Fatalf("duplicate Do = %v, %v", v, err)
	}
	if _, out, err := st.Idempotency().Claim(ctx, "busy", "other-worker", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("claim: %v %v", out, err)
	}
	noWait := fast(idemOpts{Observe: o.observe, NoWait: true})
	if _, err := idempotency.Do(ctx, st, "busy", noWait, one); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("NoWait Do of a claimed key: %v", err)
	}
	got := o.take()
	want := []idempotency.Outcome{idempotency.OutcomeClaimed, idempotency.OutcomeCompleted, idempotency.OutcomeInProgress}
	if len(got) != len(want) {
		t.Fatalf("observed %+v, want outcomes %v", got, want)
	}
	for i, w := range want {
		if g := got[i]; g.Kind != idempotency.ObservedOutcome || g.Outcome != w || (i < 2) != (g.Err == nil) {
			t.Errorf("observation %d: %+v, want outcome %s", i, g, w)
		}
	}
	if got[0].Key != "k" || got[2].Key != "busy" {
		t.Errorf("keys observed: %+v", got)
	}

	// A duplicate that waits until the claimant completes.
	if _, out, err := st.Idempotency().Claim(ctx, "waited", "other-worker", time.Minute, ""); err != nil || out != driver.Claimed {
		t.Fatalf("claim: %v %v", out, err)
	}
	<-claims // ours, above
	done := make(chan error, 1)
	go func() {
		v, err := idempotency.Do(ctx, st, "waited", opts, one)
		if err == nil && v != 5 {
			err = errors.New("the duplicate did not get the claimant's result")
		}
		done <- err
	}()
	<-claims // the duplicate's: it found the key in progress
	if ok, err := st.Idempotency().Complete(ctx, "waited", "other-worker", []byte("5"), 0); !ok || err != nil {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got = o.take()
	if len(got) != 2 {
		t.Fatalf("the waiting duplicate observed %+v, want a wait and an outcome", got)
	}
	if w := got[0]; w.Kind != idempotency.ObservedWait || w.Key != "waited" || w.Holder != "other-worker" || w.Err != nil || w.Waited <= 0 || w.Start.IsZero() {
		t.Errorf("wait observed as %+v", w)
	}
	if out := got[1]; out.Kind != idempotency.ObservedOutcome || out.Outcome != idempotency.OutcomeCompleted || out.Err != nil {
		t.Errorf("outcome observed as %+v", out)
	}

	// A duplicate whose claimant died takes the key over after waiting.
	if _, out, err := st.Idempotency().Claim(ctx, "dead", "dead-worker", 150*time.Millisecond, ""); err != nil || out != driver.Claimed {
		t.Fatalf("claim: %v %v", out, err)
	}
	if v, err := idempotency.Do(ctx, st, "dead", opts, one); v != 1 || err != nil {
		t.Fatalf("takeover Do = %v, %v", v, err)
	}
	got = o.take()
	if len(got) != 2 || got[0].Kind != idempotency.ObservedWait || got[0].Holder != "dead-worker" || got[0].Err != nil ||
		got[1].Outcome != idempotency.OutcomeTakenOver || got[1].Err != nil {
		t.Fatalf("a takeover observed as %+v, want a wait and taken-over", got)
	}
}
