package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/warden-go/warden"
)

// helpRequest asks for the help of a group (warden lock --help).
type helpRequest struct{ path string }

func (h *helpRequest) Error() string { return "help " + h.path }

// help answers `warden help [COMMAND…]`.
func (c *cli) help(args []string) error {
	if len(args) == 0 {
		c.printMainHelp(c.stdout)
		return nil
	}
	path := strings.Join(args, " ")
	if cmd := findCommand(path); cmd != nil {
		return c.printHelp(cmd)
	}
	if len(args) == 1 && isGroup(args[0]) {
		c.printGroupHelp(args[0])
		return nil
	}
	if path == "completion" {
		fmt.Fprint(c.stdout, completionHelp)
		return nil
	}
	if path == "help" {
		fmt.Fprintln(c.stdout, "Usage: warden help [COMMAND]\n\nShows the help of a command, such as 'warden help lock run'.")
		return nil
	}
	return usagef(nil, "help: unknown command %q (see 'warden --help')", path)
}

// printHelp prints a command's help (nil: the main help) on stdout.
func (c *cli) printHelp(cmd *command) error {
	if cmd == nil {
		c.printMainHelp(c.stdout)
		return nil
	}
	w := c.stdout
	fmt.Fprintf(w, "Usage: warden %s %s\n\n", cmd.path, cmd.args)
	fmt.Fprintf(w, "%s\n", strings.TrimSpace(cmd.help))
	if fl := commandFlags(cmd); len(fl) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, f := range fl {
			name := "--" + f.Name
			if arg := flagArg(f); arg != "" {
				name += " " + arg
			}
			usage := f.Usage
			if !isBoolFlag(f) && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "" {
				usage += " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\nGlobal flags:")
	c.printGlobalFlags(w)
	fmt.Fprintf(w, "\nExample:\n")
	for _, line := range strings.Split(strings.TrimSpace(cmd.example), "\n") {
		fmt.Fprintf(w, "  %s\n", line)
	}
	return nil
}

// flagArg names a flag's value in help: DURATION, N or VALUE ("" for a
// flag without value).
func flagArg(f *flag.Flag) string {
	if isBoolFlag(f) {
		return ""
	}
	switch arg, _ := flag.UnquoteUsage(f); arg {
	case "duration":
		return "DURATION"
	case "int":
		return "N"
	}
	return "VALUE"
}

// printGroupHelp prints the help of a command group.
func (c *cli) printGroupHelp(group string) {
	w := c.stdout
	for _, g := range groups {
		if g.name == group {
			fmt.Fprintf(w, "warden %s — %s\n\n", g.name, g.summary)
		}
	}
	fmt.Fprintf(w, "Usage: warden %s SUBCOMMAND [ARGS…]\n\nSubcommands:\n", group)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var example string
	for _, cmd := range commands {
		if strings.HasPrefix(cmd.path, group+" ") {
			fmt.Fprintf(tw, "  %s %s\t%s\n", cmd.path, cmd.brief(), cmd.summary)
			if example == "" {
				example = strings.SplitN(strings.TrimSpace(cmd.example), "\n", 2)[0]
			}
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "\nGlobal flags:")
	c.printGlobalFlags(w)
	fmt.Fprintf(w, "\nExample:\n  %s\n\nRun 'warden help %s SUBCOMMAND' for a subcommand's flags and an example.\n", example, group)
}

// printGlobalFlags lists the flags every command takes.
func (c *cli) printGlobalFlags(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  --store URL\tthe store (env WARDEN_STORE; default %s; now %s)\n", defaultStore, c.redactedStore())
	fmt.Fprintf(tw, "  -o, --output FORMAT\ttable or json (default table)\n")
	fmt.Fprintf(tw, "  --timeout DURATION\tbound on each command's store work (default %v)\n", defaultTimeout)
	tw.Flush()
}

// printMainHelp prints warden's help: commands, global flags, stores,
// output formats, exit codes and an example.
func (c *cli) printMainHelp(w io.Writer) {
	fmt.Fprint(w, `warden — distributed locks, circuit breakers, caches, idempotency keys and
task checkpoints on the database you already run.

Usage:
  warden [GLOBAL FLAGS] COMMAND [ARGS…] [FLAGS]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", cmd.path, cmd.brief(), cmd.summary)
	}
	fmt.Fprintf(tw, "  completion bash|zsh|fish\tprint a shell completion script\n")
	fmt.Fprintf(tw, "  help [COMMAND]\tshow a command's help and an example\n")
	tw.Flush()
	fmt.Fprintln(w, "\nGlobal flags (before or after the command):")
	c.printGlobalFlags(w)
	fmt.Fprintf(w, `
Stores (registered schemes: %s):
  sqlite:///abs/path/file.db, sqlite://rel/path.db   the embedded default, shared by the processes of one host
  memory://                                          in this process only (useful for trying commands)
  mysql://user:pass@host:3306/db                     MySQL 8.0+ / MariaDB
  mongodb://host:27017/db, mongodb+srv://host/db     MongoDB (lock and circuit events via a capped collection)
  dynamodb://TABLE?region=R[&endpoint=URL]           DynamoDB (credentials from the AWS SDK's default chain)
  Every store takes ?prefix=NAME: for its namespace, e.g. sqlite://warden.db?prefix=billing:

Output: -o table prints aligned columns (times in UTC); -o json prints stable
lower_snake_case field names (times RFC 3339 UTC or null, durations in ms).
Errors are one line on stderr in both formats.

Exit codes:
`, strings.Join(warden.Schemes(), ", "))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, e := range exitCodes {
		fmt.Fprintf(tw, "  %d\t%s\n", e.code, e.text)
	}
	fmt.Fprintf(tw, "  other\tlock run: the command's own exit code (128+N if signal N killed it)\n")
	tw.Flush()
	fmt.Fprint(w, `
Example:
  warden lock run nightly-report -- ./report.sh    # one run across every host sharing the store
  warden lock ls                                   # who holds what, until when

Run 'warden help COMMAND' (or 'warden COMMAND --help') for a command's flags and an example.
`)
}
