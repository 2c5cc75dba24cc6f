// Package drivertest is the conformance suite every warden store runs
// against its real server. It checks, through the checked entry points of
// [warden.Store], every guarantee the driver contract (package driver) and
// the design make: mutual exclusion and fencing of locks, lossless circuit
// counting (gobreaker's counts, counting periods, trips decided by the
// caller and applied once, concurrent probe slots — also from several OS
// processes, through breaker.Breaker with a ReadyToTrip over the fleet's
// counts), atomic cache and idempotency primitives, checkpoint sequences
// and fences,
// millisecond TTLs, hostile keys and patterns, namespace isolation,
// lifecycle and context handling, notifications across connections, and
// exclusion across OS processes.
//
// It also runs the portable packages users call — lock, breaker,
// idempotency, cache and checkpoint — on the store (the Portable group):
// a smoke test of each in one process; leases that end with
// lock.ErrLeaseLost when an operator force-releases their key or when
// their refreshes fail (no later than about their TTL after the last
// refresh that succeeded); and, across OS processes, Lockers of several
// processes waiting with lock.Do and Acquire on one key without ever
// overlapping and with increasing fencing tokens, a prompt hand-off from
// a holder in one process to a lock.Acquire waiting in another (woken by
// the release notification on stores that have them; the measured
// latencies are logged), exactly one run of idempotency.Do among a
// hundred concurrent duplicates, breaker failures from four processes all
// counted with the circuit opening exactly at its threshold and exactly
// one probe in the fleet after the open period, one cache.GetOrLoad
// loader among fifty callers, and a checkpoint.Run resumed from its last
// save after its worker process was killed (SIGKILL) and its lease lapsed.
//
// # Running it for a store
//
// A store package adds one test file:
//
//	package postgres_test
//
//	import (
//		"context"
//		neturl "net/url"
//		"testing"
//
//		"github.com/warden-go/warden"
//		"github.com/warden-go/warden/drivertest"
//		_ "github.com/warden-go/warden/store/postgres"
//	)
//
//	// TestMain lets the suite re-execute the test binary as a child
//	// process for the multi-process checks.
//	func TestMain(m *testing.M) { drivertest.Main(m) }
//
//	func TestConformance(t *testing.T) {
//		url := serverURL(t) // the store's helper: skips, or fails under WARDEN_TEST_REQUIRE=all
//		drivertest.Run(t, drivertest.Harness{
//			Name: "postgres",
//			Open: func(t testing.TB, prefix string) *warden.Store {
//				st, err := warden.Open(context.Background(), url+"?prefix="+neturl.QueryEscape(prefix))
//				if err != nil {
//					t.Fatal(err)
//				}
//				return st
//			},
//			URL: func(t testing.TB, prefix string) string {
//				return url + "?prefix=" + neturl.QueryEscape(prefix)
//			},
//		})
//	}
//
// Run returns before the checks have run: they are parallel subtests, which
// start when the calling test function returns. Release what the harness
// uses (servers, temporary databases) with t.Cleanup, never with defer.
//
// Open must return a new store (a new connection) on the harness's one
// database in the given namespace; the suite closes it. URL, if set, must
// return a URL that opens the same database in that namespace from another
// OS process through [warden.Open]; it enables the multi-process checks,
// which re-execute the test binary, so the binary's TestMain must call
// [Main] and the store package must be imported (its scheme registered).
//
// # How the suite behaves
//
// Every check is a named subtest (Locks/Exclusion, Cache/Clear,
// HostileKeys/Patterns, …) so that a store author can run one with
// -run. Each check opens its stores in a namespace of its own, made of the
// test's name and a random suffix, and runs in parallel with the others
// against the one database, as services sharing a server do.
//
// The suite uses real time: the store's clock may be the database's. Checks
// of expiry never assume that the machine is fast: an operation that had to
// happen before a deadline but could only be issued after it makes the
// check retry with a longer TTL instead of failing. Checks of TTL precision
// compare two expiries written by the store's own clock, bracketed by the
// local monotonic clock, so clock offsets between client and server do not
// matter.
//
// Checks of optional capabilities (notifications) are skipped when the
// store does not offer them, and the multi-process checks (MultiProcess/…
// and the Portable checks that start child processes) are skipped when
// Harness.URL is nil.
//
// A store whose checkpoint Save, Cleanup or DeleteAll is more than one
// write (the task's fence record, then the checkpoints) should implement
// [CheckpointPauser] in a _test.go file of its package, so that the checks
// of late writes (Checkpoints/LateSaveHidden, LateDeleteSparesSuccessor,
// RunAfterZombieSave) can run a newer holder's calls between its two
// writes. Without it they run the stalled call to its end first, which
// only proves something for a store whose calls are atomic.
//
// Lists (Locks.List, Circuits.List, Cache.Keys, Idempotency.List,
// Checkpoints.Tasks) must be sorted in byte order, the order of Go's string
// comparison; SQL stores need a binary collation for that as for case
// sensitivity.
package drivertest
