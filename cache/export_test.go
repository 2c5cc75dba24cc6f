package cache

// LoadWaiters returns how many GetOrLoad callers wait on the loads this
// Cache runs, for tests that must know every caller has joined a load.
func LoadWaiters[T any](c *Cache[T]) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.flights {
		n += f.waiters
	}
	return n
}
