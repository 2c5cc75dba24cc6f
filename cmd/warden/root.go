package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warden-go/warden"
)

// newRoot builds warden's command tree (spf13/cobra) from the command
// table, with the global flags bound to c.g. Cobra parses the flags
// (GNU-style, through pflag), prints help and writes the shell completion
// scripts; the commands' RunE report their errors through c.ran so that run
// can tell a command's error from a command-line error.
func (c *cli) newRoot(ctx context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:   "warden",
		Short: "distributed locks, circuit breakers, caches, idempotency keys and task checkpoints on the database you already run",
		Long: `warden — distributed locks, circuit breakers, caches, idempotency keys and
task checkpoints on the database you already run.`,
		Example: indent(`warden lock run nightly-report -- ./report.sh    # one run across the processes sharing the store
warden lock ls                                   # who holds what, until when`),
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: c.runE(func(cmd *cobra.Command, args []string) error {
			if f := cmd.Flags().Lookup("store"); len(args) == 0 && f != nil && f.Changed {
				// "warden --store ping": the command was taken as the URL.
				if sub, _, err := cmd.Find([]string{f.Value.String()}); err == nil && sub != cmd {
					return usagef(nil, "--store %q is a command, not a store URL: --store needs a URL, such as %s", f.Value.String(), defaultStore)
				}
			}
			if len(args) == 0 {
				cmd.SetOut(c.stderr)
				if err := cmd.Help(); err != nil {
					return err
				}
				return &exitError{code: exitUsage}
			}
			return usagef(nil, "unknown command %q (see 'warden --help')", args[0])
		}),
	}
	root.SetContext(ctx)
	// Before InitDefaultCompletionCmd, which keeps the output writer.
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	pf := root.PersistentFlags()
	// --store has no default in pflag's sense, so that help never prints
	// WARDEN_STORE (which may hold a password); resolveGlobals applies it.
	pf.StringVar(&c.g.store, "store", "", "") // usage: setStoreUsage
	pf.StringVarP(&c.g.output, "output", "o", "table", "output `FORMAT`: table or json")
	pf.DurationVar(&c.g.timeout, "timeout", defaultTimeout, "bound on each command's store work (opening the store and the operation), a `DURATION` such as 10s")
	c.setStoreUsage(root)
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{path: commandPath(cmd), msg: err.Error()}
	})
	root.SetUsageTemplate(root.UsageTemplate() + `{{if not .HasParent}}{{wardenRootExtra}}{{end}}`)
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		c.resolveGlobals(cmd)
		c.setStoreUsage(cmd.Root())
		defaultHelp(cmd, args)
	})

	for _, g := range groups {
		group := &cobra.Command{
			Use:   g.name,
			Short: g.summary,
			Long:  "warden " + g.name + " — " + g.summary + ".",
			Args:  cobra.ArbitraryArgs,
		}
		name := g.name
		group.RunE = c.runE(func(cmd *cobra.Command, args []string) error {
			subs := strings.Join(subcommands(name), ", ")
			if len(args) == 0 {
				return &usageError{path: name, msg: "missing subcommand: " + subs}
			}
			return &usageError{path: name, msg: fmt.Sprintf("unknown subcommand %q: want %s", args[0], subs)}
		})
		root.AddCommand(group)
	}
	for _, cmd := range commands {
		parent := root
		words := strings.Fields(cmd.path)
		if len(words) == 2 {
			parent, _, _ = root.Find(words[:1])
		}
		parent.AddCommand(c.leaf(cmd, words[len(words)-1]))
	}

	root.SetHelpCommand(c.helpCommand(root))
	root.InitDefaultCompletionCmd()
	for _, sub := range root.Commands() {
		if sub.Name() == "completion" {
			sub.Args = cobra.ArbitraryArgs
			sub.RunE = c.runE(func(_ *cobra.Command, args []string) error {
				if len(args) == 0 {
					return &usageError{path: "completion", msg: "want one shell: bash, zsh, fish or powershell"}
				}
				return &usageError{path: "completion", msg: fmt.Sprintf("unknown shell %s: want bash, zsh, fish or powershell", quoteShort(args[0]))}
			})
		}
	}
	return root
}

// leaf returns the cobra command for a leaf command of the table.
func (c *cli) leaf(cmd *command, name string) *cobra.Command {
	lc := &cobra.Command{
		Use:     strings.TrimSpace(name + " " + cmd.args),
		Short:   cmd.summary,
		Long:    strings.TrimSpace(cmd.help),
		Example: indent(cmd.example),
		Args:    cobra.ArbitraryArgs,
		// A synopsis that names the command's flags gets no "[flags]".
		DisableFlagsInUseLine: strings.Contains(cmd.args, "--"),
	}
	var exec runFunc
	if cmd.setup != nil {
		exec = cmd.setup(lc.Flags())
	}
	if cmd.tail {
		// lock run KEY [FLAGS] CMD ARGS…: pflag stops at KEY and RunE
		// parses the rest with parseArgs, which takes CMD and what follows
		// as they are.
		lc.Flags().SetInterspersed(false)
		// pflag stops at KEY, so cobra would not complete the flags
		// between KEY and CMD: offer them while CMD has not begun.
		lc.ValidArgsFunction = func(cc *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) != 1 || !strings.HasPrefix(toComplete, "-") {
				return nil, cobra.ShellCompDirectiveDefault
			}
			var names []cobra.Completion
			cc.Flags().VisitAll(func(f *pflag.Flag) {
				if name := "--" + f.Name; strings.HasPrefix(name, toComplete) {
					names = append(names, cobra.CompletionWithDesc(name, f.Usage))
				}
			})
			return names, cobra.ShellCompDirectiveNoFileComp
		}
	}
	lc.RunE = c.runE(func(cc *cobra.Command, args []string) error {
		pos := args
		if cmd.tail {
			var err error
			if pos, err = parseArgs(cc.Flags(), args); err != nil {
				if errors.Is(err, pflag.ErrHelp) {
					return cc.Help()
				}
				return &usageError{path: cmd.path, msg: err.Error()}
			}
			if help, _ := cc.Flags().GetBool("help"); help {
				return cc.Help()
			}
		}
		c.args = pos
		c.readOnly = cmd.readOnly
		c.noCreate = cmd.noCreate
		c.path = cmd.path
		if err := c.checkGlobals(cc, cmd.path); err != nil {
			return err
		}
		if len(pos) < cmd.minArgs() {
			return usagef(cmd, "missing %s", cmd.argNames(len(pos)))
		}
		if cmd.maxArgs >= 0 && len(pos) > cmd.maxArgs {
			return usagef(cmd, "unexpected argument %s", quoteShort(pos[cmd.maxArgs]))
		}
		return c.tel.command(cc.Context(), cmd.path, func(ctx context.Context) error { return exec(ctx, c, pos) })
	})
	return lc
}

// helpCommand is `warden help [COMMAND…]`: cobra's, but a command that
// does not exist is a usage error (exit 2) rather than a help text.
func (c *cli) helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:     "help [COMMAND]",
		Short:   "show a command's help and an example",
		Long:    "Shows the help of a command, such as 'warden help lock run'.",
		Example: indent(`warden help lock run`),
		Args:    cobra.ArbitraryArgs,
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			target, _, err := root.Find(args)
			if err != nil || target == nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, sub := range target.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: c.runE(func(cmd *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || target == nil || len(rest) > 0 {
				return usagef(nil, "help: unknown command %s (see 'warden --help')", quoteShort(strings.Join(args, " ")))
			}
			target.InitDefaultHelpFlag()
			return target.Help()
		}),
	}
}

// runE wraps a command's function so that run knows the error came from
// a command, not from cobra's parsing of the command line.
func (c *cli) runE(f func(cmd *cobra.Command, args []string) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c.ran = true
		return f(cmd, args)
	}
}

// commandPath is a cobra command's path without "warden".
func commandPath(cmd *cobra.Command) string {
	return strings.TrimPrefix(strings.TrimPrefix(cmd.CommandPath(), "warden"), " ")
}

// resolveGlobals applies WARDEN_STORE and the default store when --store
// was not given.
func (c *cli) resolveGlobals(cmd *cobra.Command) {
	if f := cmd.Flags().Lookup("store"); f != nil && f.Changed {
		return
	}
	if f := cmd.Root().PersistentFlags().Lookup("store"); f != nil && f.Changed {
		return
	}
	c.g.store = c.getenv("WARDEN_STORE")
	if c.g.store == "" {
		c.g.store = defaultStore
	}
}

// setStoreUsage writes --store's help, with the store in use (its
// password hidden).
func (c *cli) setStoreUsage(root *cobra.Command) {
	f := root.PersistentFlags().Lookup("store")
	now := ""
	if c.g.store != "" {
		now = "; now " + c.redactedStore()
	}
	f.Usage = fmt.Sprintf("the store `URL` (env WARDEN_STORE; default %s%s)", defaultStore, now)
}

// checkGlobals applies the store's default and validates the global
// flags; path names the command in messages.
func (c *cli) checkGlobals(cmd *cobra.Command, path string) error {
	storeGiven := false
	if f := cmd.Flags().Lookup("store"); f != nil && f.Changed {
		storeGiven = true
	}
	c.resolveGlobals(cmd)
	switch {
	case c.g.output != "table" && c.g.output != "json":
		return &usageError{path: path, msg: fmt.Sprintf("-o %q: want table or json", c.g.output)}
	case c.g.timeout <= 0:
		return &usageError{path: path, msg: fmt.Sprintf("--timeout %v: want a positive duration such as 10s", c.g.timeout)}
	case storeGiven && c.g.store == "":
		return &usageError{path: path, msg: "--store is empty"}
	}
	return nil
}

// indent indents each line of an example by two spaces, as cobra's help
// shows examples.
func indent(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n")
}

func init() {
	cobra.AddTemplateFunc("wardenRootExtra", rootExtra)
}

// rootExtra is the end of warden's main help: stores, output formats and
// exit codes.
func rootExtra() string {
	var b strings.Builder
	fmt.Fprintf(&b, `
Stores (registered schemes: %s):
  sqlite:///abs/path/file.db, sqlite://rel/path.db   the embedded default, shared by the processes of one host
  memory://                                          in this process only (useful for trying commands)
  mysql://user:pass@host:3306/db                     MySQL 8.0+ / MariaDB
  postgres://user:pass@host:5432/db, postgresql://…  PostgreSQL (lock and circuit events via LISTEN/NOTIFY)
  redis://host:6379/0, rediss://…, unix:///sock      Redis; Cluster redis://h1:7000?addr=h2:7001&cluster=true
  mongodb://host:27017/db, mongodb+srv://host/db     MongoDB (lock and circuit events via a capped collection)
  dynamodb://TABLE?region=R[&endpoint=URL]           DynamoDB (credentials from the AWS SDK's default chain)
  Every store takes ?prefix=NAME: for its namespace, e.g. sqlite://warden.db?prefix=billing:
  The CLI sees an application's records only with the same ?prefix= as the application.

Output: -o table prints aligned columns (times in UTC); -o json prints stable
lower_snake_case field names (times RFC 3339 UTC or null, durations in ms).
Errors are one line on stderr in both formats.

Telemetry: with OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_/_METRICS_ENDPOINT) set,
traces and metrics go to that OTLP collector (OTEL_EXPORTER_OTLP_PROTOCOL:
http/protobuf or grpc); without it, none are made.

Exit codes:
`, strings.Join(warden.Schemes(), ", "))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, e := range exitCodes {
		fmt.Fprintf(tw, "  %d\t%s\n", e.code, e.text)
	}
	fmt.Fprintf(tw, "  other\tlock run: the command's own exit code (128+N if signal N killed it)\n")
	tw.Flush()
	return b.String()
}

// parseArgs parses the flags and positional arguments of a command whose
// positional arguments after the first are a command line taken as it is
// (lock run KEY CMD ARGS…). The flag set must not be interspersed. warden's
// flags end at the first "--" or at the first argument after KEY that is not
// a flag: CMD begins there, and from CMD on every argument is the
// command's, verbatim, a later "--" or anything that looks like a warden
// flag included.
func parseArgs(fs *pflag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		a := args[0]
		switch {
		case a == "--":
			return append(pos, args[1:]...), nil
		case len(a) > 1 && a[0] == '-':
			if err := fs.Parse(args); err != nil {
				return nil, err
			}
			rest := fs.Args()
			if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
				return append(pos, rest...), nil
			}
			args = rest
		case len(pos) == 0:
			pos, args = append(pos, a), args[1:]
		default:
			return append(pos, args...), nil
		}
	}
	return pos, nil
}
