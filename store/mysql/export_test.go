package mysql

import (
	"context"

	"github.com/warden-go/warden"
)

// Retries reports how many deadlocks and lock wait timeouts the stores of
// this process retried.
func Retries() int64 { return retries.Load() }

// PlannedChanges returns the statements Migrate would run on the store's
// tables now (none once they are in the layout).
func PlannedChanges(ctx context.Context, st *warden.Store) ([]string, error) {
	s := st.Driver().(*store)
	var out []string
	for _, td := range s.layout {
		stmts, err := s.plan(ctx, td)
		if err != nil {
			return nil, err
		}
		out = append(out, stmts...)
	}
	return out, nil
}
