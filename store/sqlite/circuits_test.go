package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warden-go/warden/driver"
)

func TestCircuitStateMachine(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	c := st.Circuits()

	if _, found, err := c.Get(ctx, "api"); err != nil || found {
		t.Fatalf("Get of a new circuit: %v %v", found, err)
	}
	r, err := c.RecordFailure(ctx, "api", 3)
	if err != nil || r.State != driver.Closed || r.Failures != 1 || r.LastFailure.IsZero() || r.Name != "api" {
		t.Fatalf("first failure: %+v %v", r, err)
	}
	r, err = c.RecordSuccess(ctx, "api")
	if err != nil || r.State != driver.Closed || r.Failures != 0 || r.LastSuccess.IsZero() {
		t.Fatalf("success resets: %+v %v", r, err)
	}
	var v int64 = r.Version
	for i := 1; i <= 3; i++ {
		r, err = c.RecordFailure(ctx, "api", 3)
		if err != nil {
			t.Fatal(err)
		}
		if r.Version <= v {
			t.Fatalf("version did not increase: %d after %d", r.Version, v)
		}
		v = r.Version
	}
	if r.State != driver.Open || r.Failures != 3 || r.OpenedAt.IsZero() {
		t.Fatalf("threshold reached: %+v", r)
	}
	opened := r.OpenedAt

	// Open: a success proves nothing; another failure keeps OpenedAt.
	r, err = c.RecordSuccess(ctx, "api")
	if err != nil || r.State != driver.Open || r.Failures != 3 {
		t.Fatalf("success while open: %+v %v", r, err)
	}
	r, err = c.RecordFailure(ctx, "api", 3)
	if err != nil || r.State != driver.Open || !r.OpenedAt.Equal(opened) || r.Failures != 4 {
		t.Fatalf("failure while open: %+v %v", r, err)
	}

	// Too early for a probe.
	r, granted, err := c.TryProbe(ctx, "api", "p1", time.Hour, time.Second)
	if err != nil || granted || r.State != driver.Open {
		t.Fatalf("early probe: %+v %v %v", r, granted, err)
	}
	// Open duration 0: a probe is due at once; exactly one prober.
	r, granted, err = c.TryProbe(ctx, "api", "p1", 0, time.Minute)
	if err != nil || !granted || r.State != driver.HalfOpen || r.ProbeOwner != "p1" || r.ProbeUntil.IsZero() {
		t.Fatalf("probe: %+v %v %v", r, granted, err)
	}
	r, granted, err = c.TryProbe(ctx, "api", "p2", 0, time.Minute)
	if err != nil || granted || r.ProbeOwner != "p1" || r.State != driver.HalfOpen {
		t.Fatalf("second prober: %+v %v %v", r, granted, err)
	}
	r, granted, err = c.TryProbe(ctx, "api", "p1", 0, time.Minute)
	if err != nil || !granted {
		t.Fatalf("same prober again: %+v %v %v", r, granted, err)
	}
	// Half-open failure re-opens with a new OpenedAt and no probe slot.
	r, err = c.RecordFailure(ctx, "api", 3)
	if err != nil || r.State != driver.Open || r.ProbeOwner != "" || !r.ProbeUntil.IsZero() || r.OpenedAt.Before(opened) {
		t.Fatalf("half-open failure: %+v %v", r, err)
	}
	// Half-open success closes.
	if _, granted, err = c.TryProbe(ctx, "api", "p3", 0, time.Minute); err != nil || !granted {
		t.Fatal(granted, err)
	}
	r, err = c.RecordSuccess(ctx, "api")
	if err != nil || r.State != driver.Closed || r.Failures != 0 || r.ProbeOwner != "" {
		t.Fatalf("half-open success: %+v %v", r, err)
	}
	// Closed: just call.
	r, granted, err = c.TryProbe(ctx, "api", "p1", 0, time.Minute)
	if err != nil || granted || r.State != driver.Closed {
		t.Fatalf("probe on closed: %+v %v %v", r, granted, err)
	}
	r, granted, err = c.TryProbe(ctx, "absent", "p1", 0, time.Minute)
	if err != nil || granted || r.State != driver.Closed || r.Name != "absent" {
		t.Fatalf("probe on absent: %+v %v %v", r, granted, err)
	}
	if _, found, _ := c.Get(ctx, "absent"); found {
		t.Fatal("TryProbe created a record")
	}
}

func TestCircuitThresholdOne(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	r, err := st.Circuits().RecordFailure(ctx, "one", 1)
	if err != nil || r.State != driver.Open || r.OpenedAt.IsZero() {
		t.Fatalf("threshold 1: %+v %v", r, err)
	}
}

func TestCircuitProbeLeaseLapses(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	c := st.Circuits()
	if _, err := c.Set(ctx, "x", driver.Open); err != nil {
		t.Fatal(err)
	}
	r, granted, err := c.TryProbe(ctx, "x", "dead", 0, 200*time.Millisecond)
	if err != nil || !granted {
		t.Fatal(granted, err)
	}
	if _, granted, _ := c.TryProbe(ctx, "x", "next", 0, time.Minute); granted && time.Now().Before(r.ProbeUntil) {
		t.Fatal("probe slot granted while leased")
	}
	time.Sleep(time.Until(r.ProbeUntil) + 5*time.Millisecond) // the lease must lapse
	r, granted, err = c.TryProbe(ctx, "x", "next", 0, time.Minute)
	if err != nil || !granted || r.ProbeOwner != "next" {
		t.Fatalf("after lapse: %+v %v %v", r, granted, err)
	}
}

func TestCircuitSetDeleteList(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, &Options{Prefix: "n1:"})
	other := openAt(t, path, &Options{Prefix: "n2:"})
	c := st.Circuits()
	r, err := c.Set(ctx, "b", driver.Open)
	if err != nil || r.State != driver.Open || r.OpenedAt.IsZero() {
		t.Fatalf("Set open: %+v %v", r, err)
	}
	if _, _, err := c.TryProbe(ctx, "b", "p", 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	r, err = c.Set(ctx, "b", driver.HalfOpen)
	if err != nil || r.State != driver.HalfOpen || r.ProbeOwner != "" {
		t.Fatalf("Set half-open clears the probe: %+v %v", r, err)
	}
	for i := 0; i < 2; i++ {
		if _, err := c.RecordFailure(ctx, "a", 5); err != nil {
			t.Fatal(err)
		}
	}
	r, err = c.Set(ctx, "a", driver.Closed)
	if err != nil || r.State != driver.Closed || r.Failures != 0 {
		t.Fatalf("Set closed: %+v %v", r, err)
	}
	if _, err := c.RecordFailure(ctx, "A", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Circuits().RecordFailure(ctx, "a", 5); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx, "*")
	if err != nil || len(list) != 3 || list[0].Name != "A" || list[1].Name != "a" || list[2].Name != "b" {
		t.Fatalf("List: %+v %v", list, err)
	}
	list, err = c.List(ctx, "a")
	if err != nil || len(list) != 1 || list[0].Name != "a" {
		t.Fatalf("List(a): %+v %v", list, err)
	}
	if ok, err := c.Delete(ctx, "a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if ok, err := c.Delete(ctx, "a"); err != nil || ok {
		t.Fatal(ok, err)
	}
	if _, found, _ := other.Circuits().Get(ctx, "a"); !found {
		t.Fatal("Delete crossed namespaces")
	}
}

// TestCircuitConcurrentFailures: no increment is lost.
func TestCircuitConcurrentFailures(t *testing.T) {
	ctx := context.Background()
	st, path := openTest(t, nil)
	st2 := openAt(t, path, nil)
	var wg sync.WaitGroup
	errc := make(chan error, 100)
	for g := 0; g < 10; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := st
			if g%2 == 0 {
				s = st2
			}
			for i := 0; i < 10; i++ {
				if _, err := s.Circuits().RecordFailure(ctx, "hot", 1000); err != nil {
					errc <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	r, found, err := st.Circuits().Get(ctx, "hot")
	if err != nil || !found || r.Failures != 100 {
		t.Fatalf("after 100 failures: %+v %v %v", r, found, err)
	}
}

// TestCircuitSingleProber: of many concurrent probers exactly one is
// granted.
func TestCircuitSingleProber(t *testing.T) {
	ctx := context.Background()
	st, _ := openTest(t, nil)
	c := st.Circuits()
	if _, err := c.Set(ctx, "p", driver.Open); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for g := 0; g < 12; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := c.TryProbe(ctx, "p", fmt.Sprint("g", g), 0, time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if granted != 1 {
		t.Fatalf("%d probers granted", granted)
	}
}
