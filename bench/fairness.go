package bench

import (
	"os"
	"testing"
)

// FairnessGroup compares hand-off fairness across processes on every
// store: 2 processes × 4 workers, each with a lock.Locker (and store) of
// its own, take one key in turn and hold it 1 ms. The time per operation
// is wall time per acquisition (AcqMetric), over at least fairMinAcq
// acquisitions; min/max is the fewest acquisitions of one worker over the
// most (1: perfectly fair; the target is ≥ 0.5).
const FairnessGroup = "2 processes × 4 workers on one key, hold 1 ms: warden on each store (µs per acquisition; see min/max)"

// fairMinAcq is the fewest acquisitions of a fairness run: with 8
// workers, 15 turns each when the hand-off is fair. (The benchmark's own
// b.N, on a store whose acquisitions take tens of milliseconds, made 8–16
// in all, and min/max read over 1–2 turns a worker said nothing.)
const fairMinAcq = 120

// fairnessCases returns one case per store whose server is configured
// (SQLite always: both processes open the same file).
func fairnessCases() []Case {
	type st struct {
		name string
		ns   func(b *testing.B) string
	}
	stores := []st{{"sqlite (waiters' table, data_version polling)", sqliteURL}}
	if u := os.Getenv(postgresEnv); u != "" {
		stores = append(stores, st{"postgres (LISTEN/NOTIFY)", func(*testing.B) string { return postgresURL(u) }})
	}
	if u := os.Getenv(mysqlEnv); u != "" {
		stores = append(stores, st{"mysql (named-lock queue)", func(*testing.B) string { return mysqlURL(u) }})
	}
	if u := os.Getenv(redisEnv); u != "" {
		stores = append(stores, st{"redis (queue beside the record, BLPOP)", func(*testing.B) string { return redisURL(u) }})
	}
	if u := os.Getenv(mongoEnv); u != "" {
		stores = append(stores, st{"mongodb (queue in the lock document, events tailed)", func(*testing.B) string { return mongoURL(u) }})
	}
	if u := os.Getenv(dynamoEnv); u != "" {
		stores = append(stores, st{"dynamodb (queue in the lock item, events index polled)", func(*testing.B) string { return dynamoURL(u) }})
	}
	var cases []Case
	for _, s := range stores {
		cases = append(cases, Case{Group: FairnessGroup, Name: s.name, Metric: AcqMetric, Run: func(b *testing.B) {
			twoProcs(b, procsChild{Warden: true, NS: s.ns(b), Key: redisKey(), Workers: 4, MinAcq: fairMinAcq})
		}})
	}
	return cases
}
