package main

import (
	"context"
	"strings"

	"github.com/spf13/pflag"
)

// runFunc runs a command with its positional arguments, after its flags
// were parsed.
type runFunc func(ctx context.Context, c *cli, args []string) error

// command is one leaf command of warden: "lock run", "cache get", "ping", …
type command struct {
	path    string   // the words that name it: "lock run"
	args    string   // the synopsis after the path: "KEY [--force]"
	short   string   // a shorter synopsis for command lists, if args is long
	summary string   // one line for the command list
	help    string   // what it does, for `warden help PATH`
	example string   // one or more example lines
	need    []string // names of the required positional arguments
	maxArgs int      // at most this many positional arguments; -1: no limit
	// tail: the positional arguments after the first are a command line,
	// taken as they are (lock run KEY CMD ARGS…).
	tail bool
	// readOnly: the command only reads the store, which it opens read-only
	// where the store can (sqlite: ?mode=ro), so that it works on a
	// read-only file and never creates a database at a mistyped path.
	readOnly bool
	// noCreate: the command can only delete or modify existing records, so
	// it never creates a database at a mistyped path (sqlite).
	noCreate bool
	// setup registers the command's flags on fs and returns the function
	// that runs it with their values.
	setup func(fs *pflag.FlagSet) runFunc
}

// brief is the synopsis shown in command lists.
func (cmd *command) brief() string {
	if cmd.short != "" {
		return cmd.short
	}
	return cmd.args
}

// minArgs is the number of required positional arguments.
func (cmd *command) minArgs() int { return len(cmd.need) }

// argNames names the required arguments from the n-th on.
func (cmd *command) argNames(n int) string {
	return strings.Join(cmd.need[n:], " and ")
}

// groups are the command groups, in help order.
var groups = []struct{ name, summary string }{
	{"lock", "distributed locks: run a command under a lock, list, show, release, watch"},
	{"breaker", "circuit breakers: list, show, force open or closed, reset"},
	{"cache", "the cache: get, set, delete, list keys, clear"},
	{"idem", "idempotency keys: list, show, remove"},
	{"checkpoint", "task checkpoints: list, show, prune, remove"},
	{"record", "record locks on your own tables: list, show, release"},
}

// commands is every leaf command, in help order (set in init, since the
// commands' code refers to the help that lists them).
var commands []*command

func init() {
	commands = concat(lockCommands(), breakerCommands(), cacheCommands(), idemCommands(), checkpointCommands(), recordCommands(), miscCommands())
}

func concat(lists ...[]*command) []*command {
	var all []*command
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// findCommand returns the command with this path, or nil.
func findCommand(path string) *command {
	for _, cmd := range commands {
		if cmd.path == path {
			return cmd
		}
	}
	return nil
}

// isGroup reports whether name is a command group.
func isGroup(name string) bool {
	for _, g := range groups {
		if g.name == name {
			return true
		}
	}
	return false
}

// subcommands returns the names of a group's subcommands.
func subcommands(group string) []string {
	var names []string
	for _, cmd := range commands {
		if g, sub, ok := strings.Cut(cmd.path, " "); ok && g == group {
			names = append(names, sub)
		}
	}
	return names
}

// noFlags is the setup of a command without flags of its own.
func noFlags(f runFunc) func(fs *pflag.FlagSet) runFunc {
	return func(*pflag.FlagSet) runFunc { return f }
}
