package mysql

// Retries reports how many deadlocks and lock wait timeouts the stores of
// this process retried.
func Retries() int64 { return retries.Load() }
