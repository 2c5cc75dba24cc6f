package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func cacheCommands() []*command {
	return []*command{
		{
			path:     "cache get",
			readOnly: true,
			args:     "KEY",
			summary:  "print a cached value",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Prints the value cached under KEY followed by a newline (table format), or
an object with the value, its encoding and its expiry (-o json: the exact
bytes, as text or base64). Exits 4 if there is no live entry. Values written
by the typed cache package are the codec's output (JSON by default), or an
envelope {"_warden":"cache/v1",…} when they carry a soft expiry.`,
			example: `warden cache get user:42`,
			setup:   noFlags(cacheGet),
		},
		{
			path:    "cache set",
			args:    "KEY VALUE [--ttl DURATION]",
			summary: "cache a value",
			need:    []string{"KEY", "VALUE"},
			maxArgs: 2,
			help: `
Caches VALUE under KEY, replacing any entry, for --ttl (default: no expiry).
VALUE "-" reads the value from stdin. A value starting with '-' goes after
"--". The bytes are stored as given: the typed cache package's default JSON
codec reads them if they are JSON (write '"text"' for a string).`,
			example: `warden cache set user:42 '{"name":"Ada"}' --ttl 10m
echo '"hello"' | warden cache set greeting -`,
			setup: func(fs *pflag.FlagSet) runFunc {
				ttl := fs.Duration("ttl", 0, "expire the entry after this long (0: never)")
				return func(ctx context.Context, c *cli, args []string) error {
					return cacheSet(ctx, c, args[0], args[1], *ttl)
				}
			},
		},
		{
			path:     "cache del",
			noCreate: true,
			args:     "KEY",
			summary:  "delete a cached value",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Deletes the entry cached under KEY. Exits 4 if there was no live entry.`,
			example: `warden cache del user:42`,
			setup:   noFlags(cacheDel),
		},
		{
			path:     "cache keys",
			readOnly: true,
			args:     "[PATTERN]",
			summary:  "list cached keys",
			maxArgs:  1,
			help: `
Lists the keys of the live cache entries that match the glob PATTERN ('*'
any run, '?' one character, '\' escapes; default: all), sorted.`,
			example: `warden cache keys 'user:*'`,
			setup:   noFlags(cacheKeys),
		},
		{
			path:    "cache clear",
			args:    "[--yes]",
			summary: "delete every cache entry of the store's namespace",
			maxArgs: 0,
			help: `
Deletes every cache entry in the store's namespace (the ?prefix= of the
store URL) and nothing else: locks, circuit breakers, idempotency keys,
checkpoints and other namespaces are untouched. Prints how many live
entries were deleted.

It asks for confirmation on the terminal (stdin); scripts pass --yes.
Without a terminal and without --yes it deletes nothing and exits 2.`,
			example: `warden --store 'sqlite://warden.db?prefix=billing:' cache clear
warden --store "$WARDEN_STORE" cache clear --yes   # in a script`,
			setup: func(fs *pflag.FlagSet) runFunc {
				yes := fs.BoolP("yes", "y", false, "do not ask for confirmation (required without a terminal)")
				return func(ctx context.Context, c *cli, _ []string) error {
					return cacheClear(ctx, c, *yes)
				}
			},
		},
	}
}

func cacheGet(ctx context.Context, c *cli, args []string) error {
	var e driver.CacheEntry
	var found bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		e, found, err = st.Cache().Get(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("cache key %q not found", args[0])
	}
	if c.isJSON() {
		v, enc := encodeBytes(e.Value)
		return c.printJSON(struct {
			Key       string   `json:"key"`
			Value     string   `json:"value"`
			Encoding  string   `json:"encoding"`
			ExpiresAt jsonTime `json:"expires_at"`
		}{e.Key, v, enc, jsonTime(e.ExpiresAt)})
	}
	if _, err := c.stdout.Write(e.Value); err != nil {
		return err
	}
	_, err = io.WriteString(c.stdout, "\n")
	return err
}

func cacheSet(ctx context.Context, c *cli, key, value string, ttl time.Duration) error {
	if ttl < 0 {
		return usagef(findCommand("cache set"), "--ttl %v: want 0 (no expiry) or more", ttl)
	}
	b := []byte(value)
	if value == "-" {
		var err error
		if b, err = io.ReadAll(c.stdin); err != nil {
			return fmt.Errorf("reading the value from stdin: %w", err)
		}
	}
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) error {
		return st.Cache().Set(ctx, key, b, ttl)
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Key   string `json:"key"`
			Bytes int    `json:"bytes"`
			TTLMs int64  `json:"ttl_ms"`
		}{key, len(b), driver.Millis(ttl)})
	}
	expiry := "no expiry"
	if ttl > 0 {
		expiry = "expires in " + ttl.String()
	}
	return c.printf("set %s (%s, %s)", cell(key), count(int64(len(b)), "byte", "bytes"), expiry)
}

func cacheDel(ctx context.Context, c *cli, args []string) error {
	var ok bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		ok, err = st.Cache().Delete(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !ok {
		return notFoundf("cache key %q not found", args[0])
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Key     string `json:"key"`
			Deleted bool   `json:"deleted"`
		}{args[0], true})
	}
	return c.printf("deleted %s", cell(args[0]))
}

func cacheKeys(ctx context.Context, c *cli, args []string) error {
	var keys []string
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		keys, err = st.Cache().Keys(ctx, argOr(args, 0, ""))
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		type keyJSON struct {
			Key string `json:"key"`
		}
		out := make([]keyJSON, 0, len(keys))
		for _, k := range keys {
			out = append(out, keyJSON{k})
		}
		return c.printJSON(out)
	}
	tw := c.table("KEY")
	for _, k := range keys {
		row(tw, cell(k))
	}
	return tw.Flush()
}

func cacheClear(ctx context.Context, c *cli, yes bool) error {
	if !yes {
		if !c.terminal() {
			return usagef(findCommand("cache clear"), "refusing to delete every cache entry of %s without --yes: stdin is not a terminal to ask", c.redactedStore())
		}
		fmt.Fprintf(c.stderr, "Delete every cache entry of %s? [y/N] ", c.redactedStore())
		line, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
			return exitf(exitFailed, "cache clear: not confirmed; nothing was deleted")
		}
	}
	var n int64
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		n, err = st.Cache().Clear(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Deleted int64 `json:"deleted"`
		}{n})
	}
	return c.printf("deleted %s", count(n, "cache entry", "cache entries"))
}
