// Package bench measures warden side by side with the raw database
// primitives it is built on, in one run on one machine, and reports ratios
// (absolute times drift between runs; ratios measured together do not).
//
//	cd bench && go test -run '^$' -bench . -benchtime 2s    # raw numbers
//	cd bench && go run ./cmd/report                         # markdown table with ratios
//
// Benchmarks of stores that need a server skip without their
// WARDEN_TEST_* variable, like the tests.
package bench
