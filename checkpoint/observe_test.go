package checkpoint_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/warden-go/warden/checkpoint"
)

// observer collects what Run reports to Options.Observe.
type observer struct {
	mu  sync.Mutex
	obs []checkpoint.Observation
}

func (o *observer) observe(_ context.Context, ob checkpoint.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.obs = append(o.obs, ob)
}

func (o *observer) take() []checkpoint.Observation {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.obs
	o.obs = nil
	return c
}

// A fresh start, its saves, a resumption and a stale save are observed
// with the task, the progress and the save's error.
func TestObserveStartsAndSaves(t *testing.T) {
	ctx := context.Background()
	st := stores(t, 1)[0]
	o := &observer{}
	opts := &checkpoint.Options{Observe: o.observe}
	errStop := errors.New("stop")
	err := checkpoint.Run(ctx, st, "task", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		for i := 1; i <= 2; i++ {
			if err := cp.Save(ctx, i, float64(10*i)); err != nil {
				return err
			}
		}
		return errStop
	})
	if !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	err = checkpoint.Run(ctx, st, "task", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		return cp.Save(ctx, 3, 100)
	})
	if err != nil {
		t.Fatal(err)
	}
	got := o.take()
	want := []checkpoint.Observation{
		{Kind: checkpoint.ObservedStart, TaskID: "task"},
		{Kind: checkpoint.ObservedSave, TaskID: "task", Progress: 10},
		{Kind: checkpoint.ObservedSave, TaskID: "task", Progress: 20},
		{Kind: checkpoint.ObservedStart, TaskID: "task", Resumed: true, Progress: 20},
		{Kind: checkpoint.ObservedSave, TaskID: "task", Progress: 100},
	}
	if len(got) != len(want) {
		t.Fatalf("observed %+v, want %+v", got, want)
	}
	for i, w := range want {
		g := got[i]
		d := g.Duration
		g.Duration = 0
		if g != w || d < 0 || (w.Kind == checkpoint.ObservedStart && d != 0) {
			t.Errorf("observation %d: %+v, want %+v", i, got[i], w)
		}
	}

	// A save fenced out by a newer holder is observed with ErrStale.
	opts.Lock = true
	err = checkpoint.Run(ctx, st, "fenced", opts, func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		if ok, err := st.Checkpoints().Fence(ctx, "fenced", cp.Token()+1); !ok || err != nil {
			t.Fatalf("Fence = %v, %v", ok, err)
		}
		return cp.Save(ctx, 1, 50)
	})
	if !errors.Is(err, checkpoint.ErrStale) {
		t.Fatalf("a fenced-out save: %v", err)
	}
	got = o.take()
	if len(got) != 2 || got[0].Kind != checkpoint.ObservedStart || got[0].Resumed ||
		got[1].Kind != checkpoint.ObservedSave || got[1].Progress != 50 || !errors.Is(got[1].Err, checkpoint.ErrStale) {
		t.Fatalf("a fenced-out run observed as %+v", got)
	}
}
