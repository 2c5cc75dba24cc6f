package cache_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/cache"
	"github.com/warden-go/warden/store/memory"
)

// Load a value once and serve it from the cache afterwards; a missing
// record is cached as absent.
func Example() {
	ctx := context.Background()
	st := memory.New(&memory.Options{Prefix: "shop:"})
	defer st.Close()

	type product struct {
		Name  string
		Price int
	}
	products, err := cache.New[product](st, &cache.Options{TTL: time.Minute, NegativeTTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	defer products.Close()

	load := func(id string) func(context.Context) (product, error) {
		return func(context.Context) (product, error) {
			fmt.Println("loading", id)
			if id != "p1" {
				return product{}, fmt.Errorf("product %s: %w", id, cache.ErrNotFound)
			}
			return product{Name: "teapot", Price: 30}, nil
		}
	}

	for range 2 {
		p, err := products.GetOrLoad(ctx, "p1", load("p1"))
		fmt.Println(p.Name, p.Price, err)
	}
	for range 2 {
		_, err := products.GetOrLoad(ctx, "p2", load("p2"))
		fmt.Println("p2 not found:", errors.Is(err, cache.ErrNotFound))
	}
	s := products.Stats()
	fmt.Println("loads:", s.Loads, "hits:", s.Hits, "negative hits:", s.NegativeHits)
	// Output:
	// loading p1
	// teapot 30 <nil>
	// teapot 30 <nil>
	// loading p2
	// p2 not found: true
	// p2 not found: true
	// loads: 2 hits: 1 negative hits: 1
}
