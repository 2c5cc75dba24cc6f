package warden_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/breaker"
	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/checkpoint"
	"github.com/warden-go/warden/idempotency"
	"github.com/warden-go/warden/lock"
	"github.com/warden-go/warden/store/memory"
)

// entryPoint calls one constructor or entry point of a portable package
// with a duration d in one of its options (or arguments).
type entryPoint struct {
	name string
	call func(st *warden.Store, d time.Duration) error
}

func entryPoints() []entryPoint {
	ctx := context.Background()
	idem := func(o idempotency.Options) func(*warden.Store, time.Duration) error {
		return func(st *warden.Store, _ time.Duration) error {
			_, err := idempotency.Do(ctx, st, "k", &o, func(context.Context) (int, error) { return 0, nil })
			return err
		}
	}
	var eps []entryPoint
	lockOpt := map[string]func(*lock.Options, time.Duration){
		"TTL":             func(o *lock.Options, d time.Duration) { o.TTL = d },
		"RefreshInterval": func(o *lock.Options, d time.Duration) { o.RefreshInterval = d },
		"ClockSkew":       func(o *lock.Options, d time.Duration) { o.ClockSkew = d },
		"RetryMin":        func(o *lock.Options, d time.Duration) { o.RetryMin = d },
		"RetryMax":        func(o *lock.Options, d time.Duration) { o.RetryMax = d },
		"PollInterval":    func(o *lock.Options, d time.Duration) { o.PollInterval = d },
	}
	for name, set := range lockOpt {
		eps = append(eps, entryPoint{"lock.New " + name, func(st *warden.Store, d time.Duration) error {
			var o lock.Options
			set(&o, d)
			if name != "TTL" {
				o.TTL = time.Minute // a valid TTL, so that only the option under test decides
			}
			l, err := lock.New(st, &o)
			if err == nil {
				_ = l.Close()
			}
			return err
		}})
		eps = append(eps, entryPoint{"checkpoint.Run LockOptions." + name, func(st *warden.Store, d time.Duration) error {
			o := lock.Options{TTL: time.Minute}
			set(&o, d)
			return checkpoint.Run(ctx, st, "t", &checkpoint.Options{LockOptions: &o}, func(context.Context, *checkpoint.Cursor[int]) error { return nil })
		}})
	}
	for name, set := range map[string]func(*breaker.Options, time.Duration){
		"Interval":     func(o *breaker.Options, d time.Duration) { o.Interval = d },
		"OpenFor":      func(o *breaker.Options, d time.Duration) { o.OpenFor = d },
		"ProbeLease":   func(o *breaker.Options, d time.Duration) { o.ProbeLease = d },
		"SyncInterval": func(o *breaker.Options, d time.Duration) { o.SyncInterval = d },
		"StoreTimeout": func(o *breaker.Options, d time.Duration) { o.StoreTimeout = d },
	} {
		eps = append(eps, entryPoint{"breaker.New " + name, func(st *warden.Store, d time.Duration) error {
			var o breaker.Options
			set(&o, d)
			b, err := breaker.New(st, "c", &o)
			if err == nil {
				_ = b.Close()
			}
			return err
		}})
	}
	for name, set := range map[string]func(*cache.Options, time.Duration){
		"TTL":                  func(o *cache.Options, d time.Duration) { o.TTL = d },
		"NegativeTTL":          func(o *cache.Options, d time.Duration) { o.NegativeTTL = d },
		"LoadLease":            func(o *cache.Options, d time.Duration) { o.LoadLease = d },
		"StaleWhileRevalidate": func(o *cache.Options, d time.Duration) { o.StaleWhileRevalidate = d },
		"PollMin":              func(o *cache.Options, d time.Duration) { o.PollMin = d },
		"PollMax":              func(o *cache.Options, d time.Duration) { o.PollMax = d },
		"StoreTimeout":         func(o *cache.Options, d time.Duration) { o.StoreTimeout = d },
	} {
		eps = append(eps, entryPoint{"cache.New " + name, func(st *warden.Store, d time.Duration) error {
			var o cache.Options
			set(&o, d)
			c, err := cache.New[int](st, &o)
			if err == nil {
				_ = c.Close()
			}
			return err
		}})
	}
	eps = append(eps, entryPoint{"cache.SetTTL ttl", func(st *warden.Store, d time.Duration) error {
		c, err := cache.New[int](st, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.SetTTL(ctx, "k", 1, d)
	}})
	eps = append(eps,
		entryPoint{"idempotency.Do Lease", func(st *warden.Store, d time.Duration) error {
			return idem(idempotency.Options{Lease: d})(st, d)
		}},
		entryPoint{"idempotency.Do Retain", func(st *warden.Store, d time.Duration) error {
			return idem(idempotency.Options{Retain: d})(st, d)
		}},
		entryPoint{"idempotency.Do PollMin", func(st *warden.Store, d time.Duration) error {
			return idem(idempotency.Options{PollMin: d, PollMax: time.Hour})(st, d)
		}},
		entryPoint{"idempotency.Do PollMax", func(st *warden.Store, d time.Duration) error {
			return idem(idempotency.Options{PollMin: time.Millisecond, PollMax: d})(st, d)
		}},
		entryPoint{"idempotency.Result Retain", func(st *warden.Store, d time.Duration) error {
			_, _, err := idempotency.Result[int](ctx, st, "k", &idempotency.Options{Retain: d})
			return err
		}},
	)
	return eps
}

// TestDurationsValidatedAlike: every duration a portable package takes,
// as an option or an argument, follows one rule: 0 is the default, a
// negative duration and one under a millisecond are refused with an error
// matching warden.ErrInvalidArgument, and one millisecond or more is
// accepted (where the package has no larger minimum, like lock.MinTTL).
func TestDurationsValidatedAlike(t *testing.T) {
	st := memory.New(nil)
	defer st.Close()
	for _, ep := range entryPoints() {
		for _, c := range []struct {
			d  time.Duration
			ok bool
		}{
			{-time.Second, false},
			{-time.Nanosecond, false},
			{time.Nanosecond, false},
			{999 * time.Microsecond, false},
			{0, true},
			{lock.MinTTL, true},
			{time.Minute, true},
		} {
			t.Run(fmt.Sprintf("%s=%v", ep.name, c.d), func(t *testing.T) {
				err := ep.call(st, c.d)
				switch {
				case c.ok && errors.Is(err, warden.ErrInvalidArgument):
					t.Errorf("refused: %v", err)
				case !c.ok && !errors.Is(err, warden.ErrInvalidArgument):
					t.Errorf("got %v, want an error matching warden.ErrInvalidArgument", err)
				}
			})
		}
	}
}

// TestNilArgumentsValidatedAlike: a nil store, Locker, Breaker or function
// given to a portable package's constructor or entry point is an error
// matching warden.ErrInvalidArgument, never a panic or a plain error.
func TestNilArgumentsValidatedAlike(t *testing.T) {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()
	b, err := breaker.New(st, "c", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l, err := lock.New(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := cache.New[int](st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	task := func(context.Context, *checkpoint.Cursor[int]) error { return nil }
	for name, call := range map[string]func() error{
		"lock.New(nil store)":    func() error { _, err := lock.New(nil, nil); return err },
		"lock.Do(nil Locker)":    func() error { return lock.Do(ctx, nil, "k", func(context.Context) error { return nil }) },
		"lock.Do(nil fn)":        func() error { return lock.Do(ctx, l, "k", nil) },
		"breaker.New(nil store)": func() error { _, err := breaker.New(nil, "c", nil); return err },
		"Breaker.Do(nil fn)":     func() error { return b.Do(ctx, nil) },
		"breaker.Call(nil Breaker)": func() error {
			_, err := breaker.Call(ctx, nil, func(context.Context) (int, error) { return 0, nil })
			return err
		},
		"breaker.Call(nil fn)":        func() error { _, err := breaker.Call[int](ctx, b, nil); return err },
		"cache.New(nil store)":        func() error { _, err := cache.New[int](nil, nil); return err },
		"Cache.GetOrLoad(nil loader)": func() error { _, err := c.GetOrLoad(ctx, "k", nil); return err },
		"idempotency.Do(nil store)": func() error {
			_, err := idempotency.Do(ctx, nil, "k", nil, func(context.Context) (int, error) { return 0, nil })
			return err
		},
		"idempotency.Do(nil fn)":        func() error { _, err := idempotency.Do[int](ctx, st, "k", nil, nil); return err },
		"idempotency.Result(nil store)": func() error { _, _, err := idempotency.Result[int](ctx, nil, "k", nil); return err },
		"checkpoint.Run(nil store)":     func() error { return checkpoint.Run(ctx, nil, "t", nil, task) },
		"checkpoint.Run(nil fn)":        func() error { return checkpoint.Run[int](ctx, st, "t", nil, nil) },
		"checkpoint.Latest(nil store)":  func() error { _, _, err := checkpoint.Latest[int](ctx, nil, "t", nil); return err },
		"checkpoint.List(nil store)":    func() error { _, err := checkpoint.List(ctx, nil, "t"); return err },
		"checkpoint.Tasks(nil store)":   func() error { _, err := checkpoint.Tasks(ctx, nil, ""); return err },
		"checkpoint.Delete(nil store)":  func() error { _, err := checkpoint.Delete(ctx, nil, "t"); return err },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panicked: %v", p)
				}
			}()
			if err := call(); !errors.Is(err, warden.ErrInvalidArgument) {
				t.Errorf("got %v, want an error matching warden.ErrInvalidArgument", err)
			}
		})
	}
}
