package checkpoint_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/store/memory"
)

// A task that fails half-way resumes from its last checkpoint on the next
// run.
func Example() {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()

	items := []string{"a", "b", "c", "d"}
	crash := true
	task := func(ctx context.Context, cp *checkpoint.Cursor[int]) error {
		next, resumed := cp.State()
		fmt.Printf("start at %d (resumed: %v)\n", next, resumed)
		for ; next < len(items); next++ {
			if next == 2 && crash {
				crash = false
				return errors.New("crash")
			}
			fmt.Println("process", items[next])
			if err := cp.Save(ctx, next+1, float64(next+1)*100/float64(len(items))); err != nil {
				return err
			}
		}
		return nil
	}

	for {
		err := checkpoint.Run(ctx, st, "nightly-export", &checkpoint.Options{Lock: true}, task)
		fmt.Println("run:", err)
		if err == nil {
			break
		}
	}
	_, _, err := checkpoint.Latest[int](ctx, st, "nightly-export", nil)
	fmt.Println("checkpoints deleted:", errors.Is(err, checkpoint.ErrNotFound))
	// Output:
	// start at 0 (resumed: false)
	// process a
	// process b
	// run: crash
	// start at 2 (resumed: true)
	// process c
	// process d
	// run: <nil>
	// checkpoints deleted: true
}
