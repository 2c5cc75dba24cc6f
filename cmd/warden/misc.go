package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/warden-go/warden"
)

func miscCommands() []*command {
	return []*command{
		{
			path:    "migrate",
			summary: "create the store's tables and indexes if they are missing",
			maxArgs: 0,
			help: `
Creates the store's tables, collections and indexes if they are missing,
and adds what is missing to tables created by the go-go-scope adapters. It
is idempotent; stores also do it on first use, so this is for deployments
where the application's database user may not change the schema.`,
			example: `warden --store 'sqlite:///var/lib/app/warden.db' migrate`,
			setup:   noFlags(migrate),
		},
		{
			path:     "ping",
			readOnly: true,
			summary:  "check that the store answers",
			maxArgs:  0,
			help: `
Opens the store and checks that it answers, within --timeout. Exits 0 and
prints the round trip's duration if it does, 5 if it cannot be reached.`,
			example: `warden --store "$WARDEN_STORE" --timeout 2s ping`,
			setup:   noFlags(ping),
		},
		{
			path:    "version",
			summary: "print warden's version, Go version and registered stores",
			maxArgs: 0,
			help: `
Prints the version of the warden command (the module version it was built
from, "(devel)" for a build from a working tree), the Go version and
platform it was built with, and the store URL schemes it can open.`,
			example: `warden version`,
			setup:   noFlags(version),
		},
	}
}

func migrate(ctx context.Context, c *cli, _ []string) error {
	var name string
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) error {
		name = st.Name()
		return st.Migrate(ctx)
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Store    string `json:"store"`
			URL      string `json:"url"`
			Migrated bool   `json:"migrated"`
		}{name, c.redactedStore(), true})
	}
	return c.printf("migrated the %s store at %q: tables and indexes are in place", name, c.redactedStore())
}

func ping(ctx context.Context, c *cli, _ []string) error {
	var name string
	var took time.Duration
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) error {
		name = st.Name()
		start := time.Now()
		err := st.Ping(ctx)
		took = time.Since(start)
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Store     string  `json:"store"`
			URL       string  `json:"url"`
			LatencyMs float64 `json:"latency_ms"`
		}{name, c.redactedStore(), float64(took.Microseconds()) / 1000})
	}
	return c.printf("the %s store at %s answered in %v", name, c.redactedStore(), took.Round(time.Microsecond))
}

// buildVersion returns the module version warden was built from.
func buildVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(unknown)"
}

func version(_ context.Context, c *cli, _ []string) error {
	v, goV, platform := buildVersion(), runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	if c.isJSON() {
		return c.printJSON(struct {
			Version  string   `json:"version"`
			Go       string   `json:"go"`
			Platform string   `json:"platform"`
			Stores   []string `json:"stores"`
		}{v, goV, platform, warden.Schemes()})
	}
	return c.printFields([]field{
		{"warden", v},
		{"go", goV},
		{"platform", platform},
		{"stores", strings.Join(warden.Schemes(), ", ")},
	})
}
