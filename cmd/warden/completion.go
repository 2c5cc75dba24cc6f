package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

const completionHelp = `Usage: warden completion bash|zsh|fish

Prints a shell completion script for warden's commands, subcommands and
flags. Load it in the current shell, or add the line to the shell's startup
file:

  source <(warden completion bash)             # ~/.bashrc
  source <(warden completion zsh)              # ~/.zshrc, after compinit
  warden completion fish | source              # ~/.config/fish/config.fish

Example:
  warden completion bash > /etc/bash_completion.d/warden
`

// completion answers `warden completion SHELL`.
func (c *cli) completion(args []string) error {
	if len(args) == 1 && isHelpFlag(args[0]) {
		_, err := io.WriteString(c.stdout, completionHelp)
		return err
	}
	if len(args) != 1 {
		return usagef(nil, "completion: want one shell: bash, zsh or fish (see 'warden help completion')")
	}
	var script string
	switch args[0] {
	case "bash":
		script = bashCompletion()
	case "zsh":
		script = "#compdef warden\n# zsh completion for warden: source <(warden completion zsh), after compinit.\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion()
	case "fish":
		script = fishCompletion()
	default:
		return usagef(nil, "completion: unknown shell %q: want bash, zsh or fish", args[0])
	}
	_, err := io.WriteString(c.stdout, script)
	return err
}

// globalFlagNames are the global flags, as completed.
var globalFlagNames = []string{"--store", "-o", "--output", "--timeout", "--help"}

// globalValueFlags are the global flags that take a value.
var globalValueFlags = []string{"--store", "-o", "--output", "--timeout"}

// isBoolFlag reports whether a flag takes no value.
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// valueFlags returns every flag, global or not, that takes a value.
func valueFlags() []string {
	set := map[string]bool{}
	for _, n := range globalValueFlags {
		set[n] = true
	}
	for _, cmd := range commands {
		for _, f := range commandFlags(cmd) {
			if !isBoolFlag(f) {
				set["--"+f.Name] = true
			}
		}
	}
	var names []string
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString(`# bash completion for warden: source <(warden completion bash)
_warden() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local words=() w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
            --)
                # lock run KEY -- CMD…: complete the command's words.
                COMPREPLY=($(compgen -c -- "$cur"))
                return ;;
`)
	fmt.Fprintf(&b, "            %s) ((i++)) ;;\n", strings.Join(valueFlags(), "|"))
	b.WriteString(`            -*) ;;
            *) words+=("$w") ;;
        esac
    done
    case $prev in
        -o|--output) COMPREPLY=($(compgen -W "table json" -- "$cur")); return ;;
`)
	fmt.Fprintf(&b, "        %s) return ;;\n", strings.Join(without(valueFlags(), "-o", "--output"), "|"))
	b.WriteString("    esac\n")
	fmt.Fprintf(&b, "    local flags=%q\n", strings.Join(globalFlagNames, " "))
	b.WriteString("    if [[ ${#words[@]} -eq 0 ]]; then\n")
	fmt.Fprintf(&b, "        [[ $cur == -* ]] && COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\")) || COMPREPLY=($(compgen -W %q -- \"$cur\"))\n", strings.Join(topLevel(), " "))
	b.WriteString("        return\n    fi\n    case ${words[0]} in\n")
	for _, g := range groups {
		fmt.Fprintf(&b, "        %s) if [[ ${#words[@]} -eq 1 && $cur != -* ]]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi ;;\n", g.name, strings.Join(subcommands(g.name), " "))
	}
	b.WriteString("        completion) COMPREPLY=($(compgen -W \"bash zsh fish\" -- \"$cur\")); return ;;\n")
	fmt.Fprintf(&b, "        help) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", strings.Join(topLevel(), " "))
	b.WriteString("    esac\n    case \"${words[0]} ${words[1]}\" in\n")
	for _, cmd := range commands {
		fl := commandFlags(cmd)
		if len(fl) == 0 {
			continue
		}
		var names []string
		for _, f := range fl {
			names = append(names, "--"+f.Name)
		}
		key := cmd.path
		if !strings.Contains(key, " ") {
			key += " "
		}
		fmt.Fprintf(&b, "        %q) flags+=%q ;;\n", key, " "+strings.Join(names, " "))
	}
	b.WriteString(`    esac
    [[ $cur == -* ]] && COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _warden warden
`)
	return b.String()
}

func without(list []string, drop ...string) []string {
	var out []string
	for _, s := range list {
		keep := true
		for _, d := range drop {
			keep = keep && s != d
		}
		if keep {
			out = append(out, s)
		}
	}
	return out
}

func fishCompletion() string {
	var b strings.Builder
	b.WriteString(`# fish completion for warden: warden completion fish | source
complete -c warden -f
complete -c warden -l store -r -d 'store URL (env WARDEN_STORE)'
complete -c warden -s o -l output -x -a 'table json' -d 'output format'
complete -c warden -l timeout -x -d 'bound on the store work (e.g. 10s)'
complete -c warden -s h -l help -d 'show help'
`)
	fishQuote := func(s string) string {
		return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "complete -c warden -n '__fish_use_subcommand' -a %s -d %s\n", g.name, fishQuote(g.summary))
	}
	for _, cmd := range commands {
		if !strings.Contains(cmd.path, " ") {
			fmt.Fprintf(&b, "complete -c warden -n '__fish_use_subcommand' -a %s -d %s\n", cmd.path, fishQuote(cmd.summary))
		}
	}
	b.WriteString("complete -c warden -n '__fish_use_subcommand' -a completion -d 'print a shell completion script'\n")
	b.WriteString("complete -c warden -n '__fish_use_subcommand' -a help -d 'show a command\\'s help'\n")
	b.WriteString("complete -c warden -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'\n")
	for _, g := range groups {
		subs := strings.Join(subcommands(g.name), " ")
		for _, cmd := range commands {
			group, sub, ok := strings.Cut(cmd.path, " ")
			if !ok || group != g.name {
				continue
			}
			fmt.Fprintf(&b, "complete -c warden -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %s -d %s\n", g.name, subs, sub, fishQuote(cmd.summary))
			for _, f := range commandFlags(cmd) {
				arg, usage := flag.UnquoteUsage(f)
				mode := "-x"
				if isBoolFlag(f) || arg == "" {
					mode = ""
				}
				fmt.Fprintf(&b, "complete -c warden -n '__fish_seen_subcommand_from %s; and __fish_seen_subcommand_from %s' -l %s %s -d %s\n", g.name, sub, f.Name, mode, fishQuote(usage))
			}
		}
	}
	return b.String()
}
