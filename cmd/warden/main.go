// Command warden is the operator's and shell script's view of a warden
// store: run a command under a distributed lock, inspect and release locks,
// force circuit breakers open or closed, read and write the cache, and look
// at idempotency keys and task checkpoints, on any store warden can open
// (this build: memory://, sqlite://, mysql://, postgres://, postgresql://,
// redis://, rediss://, unix:// (Redis), mongodb://, mongodb+srv:// and
// dynamodb://).
//
//	warden lock run nightly-report -- ./report.sh
//	warden --store 'sqlite:///var/lib/app/warden.db?prefix=billing:' lock ls
//	warden -o json breaker ls
//
// Run `warden --help` for the commands, flags and exit codes, and `warden
// help COMMAND` for each command's details and an example.
//
// # Choices
//
//   - The store is --store, else WARDEN_STORE, else sqlite://warden.db in
//     the working directory. Global flags may come before or after the
//     command; everything after "--" is positional.
//   - -o table (the default, in a terminal or not) prints aligned columns;
//     -o json prints stable lower_snake_case fields, times as RFC 3339 UTC
//     with milliseconds or null, durations in milliseconds, bytes as a value
//     and its encoding ("text" or "base64"). `lock watch -o json` prints one
//     object per line. Errors are one line on stderr in both formats, with
//     the store URL's password and secret query parameters hidden (and the
//     password of a URL inside it, such as DynamoDB's endpoint), and keys,
//     patterns or names longer than 64 bytes cut to 64 bytes and a length.
//   - --timeout (default 10s) bounds each command's store work: opening
//     the store and the operation. It does not bound waiting for a lock,
//     the command `lock run` runs, nor `lock watch`.
//   - Exit codes: 0 ok, 1 error, 2 usage (including an invalid key,
//     pattern or store URL), 3 lock not acquired or circuit not closed, 4 not
//     found, 5 store unreachable, 6 lease lost, 130 interrupted; `lock run`
//     otherwise exits with its command's code. "Unreachable" is a --timeout
//     that ran out, a network error (net.Error, connection refused, reset or
//     aborted, host or network unreachable), a MySQL login or database the
//     server refuses, or an SQLite file that cannot be opened, is not a
//     database, cannot be read, is missing (for a command that only reads)
//     or is read-only (for a write); a store that answers with an error (a
//     busy SQLite file included) is an error, 1.
//   - With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
//     …_METRICS_ENDPOINT) set, warden exports a span per command, its store
//     operations and lock waits, and warden's metrics to that OTLP collector
//     (package otelwarden; OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf, the
//     default, or grpc), flushed before it exits; without it none are made.
//   - Commands that only read open a SQLite store read-only: they work on a
//     read-only file and never create a database at a mistyped path.
//   - Flags are GNU-style (spf13/cobra and pflag); `warden completion
//     bash|zsh|fish|powershell` prints a completion script.
//   - `lock run` waits for the lock until interrupted unless --wait or
//     --no-wait says otherwise. Its command runs in its own process group:
//     warden forwards SIGINT, SIGTERM and SIGHUP to it, and when the lease is
//     lost sends the group SIGTERM, then SIGKILL after --grace. A warden
//     killed with SIGKILL cannot stop its command; the lease then lapses after
//     its TTL, which is what the fencing token in WARDEN_FENCING_TOKEN is
//     for.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Environ()))
}
