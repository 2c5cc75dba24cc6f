//go:build race

package main

// raceEnabled reports whether the tests run with -race; the binary they
// build then does too.
const raceEnabled = true
