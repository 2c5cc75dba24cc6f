package warden_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/token"
	"sort"
	"strings"
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

// sentinels are the exported error variables of the root and portable
// packages, by qualified name.
var sentinels = map[string]error{
	"warden.ErrInvalidKey":      warden.ErrInvalidKey,
	"warden.ErrInvalidPattern":  warden.ErrInvalidPattern,
	"warden.ErrInvalidArgument": warden.ErrInvalidArgument,
	"warden.ErrValueTooLarge":   warden.ErrValueTooLarge,
	"warden.ErrClosed":          warden.ErrClosed,
	"warden.ErrLeaseLost":       warden.ErrLeaseLost,
	"warden.ErrStoreTooSlow":    warden.ErrStoreTooSlow,
	"warden.ErrStoreTimeout":    warden.ErrStoreTimeout,
	"warden.ErrUnknownScheme":   warden.ErrUnknownScheme,

	"lock.ErrLocked":       lock.ErrLocked,
	"lock.ErrNotHeld":      lock.ErrNotHeld,
	"lock.ErrLeaseLost":    lock.ErrLeaseLost,
	"lock.ErrReleased":     lock.ErrReleased,
	"lock.ErrClosed":       lock.ErrClosed,
	"lock.ErrStoreTooSlow": lock.ErrStoreTooSlow,
	"lock.ErrPolled":       lock.ErrPolled,

	"breaker.ErrOpen":         breaker.ErrOpen,
	"breaker.ErrStoreTimeout": breaker.ErrStoreTimeout,

	"cache.ErrNotFound": cache.ErrNotFound,
	"cache.ErrClosed":   cache.ErrClosed,

	"idempotency.ErrInProgress":   idempotency.ErrInProgress,
	"idempotency.ErrMismatch":     idempotency.ErrMismatch,
	"idempotency.ErrStoredError":  idempotency.ErrStoredError,
	"idempotency.ErrLeaseLost":    idempotency.ErrLeaseLost,
	"idempotency.ErrNotStored":    idempotency.ErrNotStored,
	"idempotency.ErrStoreTooSlow": idempotency.ErrStoreTooSlow,

	"checkpoint.ErrNotFound": checkpoint.ErrNotFound,
	"checkpoint.ErrStale":    checkpoint.ErrStale,
}

// distinctMeanings are sentinel names found in several packages that name
// different things, so that they are different values on purpose.
var distinctMeanings = map[string]string{
	// A cache miss (or a loader's "no such value") and a task without
	// checkpoints: errors.Is(err, cache.ErrNotFound) must not hold for a
	// checkpoint lookup that a cache loader happens to make.
	"ErrNotFound": "cache: no value for the key; checkpoint: the task has no checkpoint",
}

// TestSentinelTableIsComplete: the table above lists every exported
// error variable of the packages, so that the checks below see them all.
func TestSentinelTableIsComplete(t *testing.T) {
	for _, sf := range packageSources(t) {
		path, f := sf.path, sf.f
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, n := range spec.(*ast.ValueSpec).Names {
					if !n.IsExported() || !strings.HasPrefix(n.Name, "Err") {
						continue
					}
					if _, ok := sentinels[f.Name.Name+"."+n.Name]; !ok {
						t.Errorf("%s.%s (%s) is not in the sentinel table", f.Name.Name, n.Name, path)
					}
				}
			}
		}
	}
}

// TestOneSentinelPerMeaning: a sentinel name found in several packages is
// one value (the root package's), so errors.Is matches across packages in
// both directions, wrapped or not — unless the name means different things
// in those packages (distinctMeanings), where the values differ.
func TestOneSentinelPerMeaning(t *testing.T) {
	byName := map[string][]string{}
	for q := range sentinels {
		_, name, _ := strings.Cut(q, ".")
		byName[name] = append(byName[name], q)
	}
	shared := 0
	for name, qs := range byName {
		if len(qs) < 2 {
			continue
		}
		sort.Strings(qs)
		if _, ok := distinctMeanings[name]; ok {
			for _, a := range qs {
				for _, b := range qs {
					if a != b && errors.Is(sentinels[a], sentinels[b]) {
						t.Errorf("%s matches %s, but %s has different meanings: %s", a, b, name, distinctMeanings[name])
					}
				}
			}
			continue
		}
		shared++
		for _, a := range qs {
			for _, b := range qs {
				wrapped := fmt.Errorf("context: %w", sentinels[a])
				if !errors.Is(sentinels[a], sentinels[b]) || !errors.Is(wrapped, sentinels[b]) {
					t.Errorf("errors.Is(%s, %s) is false: %s is one meaning with several values", a, b, name)
				}
			}
		}
	}
	if shared < 4 {
		t.Fatalf("%d shared sentinels found, want ErrClosed, ErrLeaseLost, ErrStoreTooSlow and ErrStoreTimeout at least", shared)
	}
}

// TestSharedSentinelsFromOperations: errors the packages return match the
// shared sentinels as every other package spells them.
func TestSharedSentinelsFromOperations(t *testing.T) {
	ctx := context.Background()
	st := memory.New(nil)
	defer st.Close()

	l, err := lock.New(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	_, err = l.Acquire(ctx, "k")
	for _, target := range []error{warden.ErrClosed, cache.ErrClosed} {
		if !errors.Is(err, target) {
			t.Errorf("Acquire on a closed Locker = %v, does not match %v", err, target)
		}
	}

	c, err := cache.New[int](st, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	_, err = c.GetOrLoad(ctx, "k", func(context.Context) (int, error) { return 1, nil })
	for _, target := range []error{warden.ErrClosed, lock.ErrClosed} {
		if !errors.Is(err, target) {
			t.Errorf("GetOrLoad on a closed Cache = %v, does not match %v", err, target)
		}
	}

	// A task fenced by a newer holder: checkpoint's stale error matches
	// the lease loss as every package spells it.
	if _, err := st.Checkpoints().Fence(ctx, "task", 1<<60); err != nil {
		t.Fatal(err)
	}
	err = checkpoint.Run(ctx, st, "task", &checkpoint.Options{Lock: true, LockOptions: &lock.Options{TTL: time.Minute}},
		func(context.Context, *checkpoint.Cursor[int]) error { return nil })
	for _, target := range []error{checkpoint.ErrStale, warden.ErrLeaseLost, lock.ErrLeaseLost, idempotency.ErrLeaseLost} {
		if !errors.Is(err, target) {
			t.Errorf("Run on a task fenced with a newer token = %v, does not match %v", err, target)
		}
	}
}
