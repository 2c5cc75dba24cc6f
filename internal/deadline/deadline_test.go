package deadline

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errLost = errors.New("lost")

func TestMargin(t *testing.T) {
	for _, tc := range []struct{ ttl, asked, want time.Duration }{
		{MinTTL, 0, MinMargin},                  // ttl/20 is under the floor
		{MinTTL, time.Microsecond, MinMargin},   // asked under the floor
		{MinTTL, time.Hour, MinTTL / 2},         // at most half
		{time.Second, 0, 50 * time.Millisecond}, // ttl/20
		{time.Hour, 0, time.Second},             // capped default
		{time.Minute, 7 * time.Second, 7 * time.Second},
	} {
		if got := Margin(tc.ttl, tc.asked); got != tc.want {
			t.Errorf("Margin(%v, %v) = %v, want %v", tc.ttl, tc.asked, got, tc.want)
		}
	}
}

type key struct{}

func TestContextErrConsultsTheClock(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	c := New(parent, time.Now().Add(20*time.Millisecond), errLost)
	cancelParent() // the parent's cancellation does not carry over
	if c.Value(key{}) != "v" {
		t.Fatal("values of the parent are not carried")
	}
	for {
		before := c.Err() // asked at or before now
		now := time.Now()
		if now.Before(c.When()) {
			if before != nil {
				t.Fatalf("done (%v) before the deadline", before)
			}
			continue
		}
		if c.Err() != context.Canceled || context.Cause(c) != errLost {
			t.Fatalf("past the deadline: Err %v, cause %v", c.Err(), context.Cause(c))
		}
		select {
		case <-c.Done():
		default:
			t.Fatal("Err reported the deadline but Done is open")
		}
		break
	}
	if c.Extend(time.Now().Add(time.Hour)) {
		t.Fatal("a done context was extended")
	}
}

func TestContextExtend(t *testing.T) {
	start := time.Now()
	c := New(context.Background(), start.Add(time.Hour), errLost)
	if !c.Extend(start.Add(2*time.Hour)) || !c.When().Equal(start.Add(2*time.Hour)) {
		t.Fatalf("Extend later: deadline %v", c.When())
	}
	if !c.Extend(start.Add(time.Minute)) || !c.When().Equal(start.Add(2*time.Hour)) {
		t.Fatalf("Extend earlier moved the deadline to %v", c.When())
	}
	if c.Expire(time.Now()) {
		t.Fatal("Expire before the deadline ended the context")
	}
	if !c.Expire(start.Add(3*time.Hour)) || context.Cause(c) != errLost {
		t.Fatalf("Expire past the deadline: cause %v", context.Cause(c))
	}
	c2 := New(context.Background(), start.Add(time.Hour), errLost)
	other := errors.New("released")
	c2.Cancel(other)
	c2.Cancel(errLost)
	if context.Cause(c2) != other || c2.Extend(start.Add(2*time.Hour)) {
		t.Fatalf("after Cancel: cause %v", context.Cause(c2))
	}
}

func TestChild(t *testing.T) {
	// The holding ends: the child is done in the same instant.
	c := New(context.Background(), time.Now().Add(time.Hour), errLost)
	ch, stop := c.Child(context.Background())
	c.Cancel(errLost)
	if ch.Err() == nil || context.Cause(ch) != errLost {
		t.Fatalf("child after the holding ended: Err %v, cause %v", ch.Err(), context.Cause(ch))
	}
	stop()

	// The parent ends: the child ends with its cause, the holding does not.
	c = New(context.Background(), time.Now().Add(time.Hour), errLost)
	parent, cancel := context.WithCancelCause(context.Background())
	ch, stop = c.Child(parent)
	defer stop()
	gone := errors.New("caller gone")
	cancel(gone)
	<-ch.Done()
	if context.Cause(ch) != gone || c.Err() != nil {
		t.Fatalf("child cause %v, holding Err %v", context.Cause(ch), c.Err())
	}

	// The deadline passes: the child's Err consults the clock.
	c = New(context.Background(), time.Now().Add(10*time.Millisecond), errLost)
	ch, stop = c.Child(context.Background())
	defer stop()
	for time.Now().Before(c.When()) {
	}
	if ch.Err() == nil || context.Cause(ch) != errLost {
		t.Fatalf("child past the deadline: Err %v, cause %v", ch.Err(), context.Cause(ch))
	}
}
