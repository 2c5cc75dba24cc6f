package main

import (
	"context"
	"strconv"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

func idemCommands() []*command {
	return []*command{
		{
			path:     "idem ls",
			readOnly: true,
			args:     "[PATTERN]",
			summary:  "list idempotency keys with their status",
			maxArgs:  1,
			help: `
Lists the live idempotency records whose keys match the glob PATTERN ('*'
any run, '?' one character, '\' escapes; default: all), sorted by key:
pending (a claimant is running the operation, until its lease expires) or
completed (the result is kept until the expiry shown, or "-": until
removed).`,
			example: `warden idem ls 'charge:*'`,
			setup:   noFlags(idemLs),
		},
		{
			path:     "idem show",
			readOnly: true,
			args:     "KEY",
			summary:  "show an idempotency record and its stored result",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Shows the idempotency record KEY: status, owner, request fingerprint,
creation and expiry, and the stored result (-o json: exact bytes, as text or
base64). Exits 4 if there is no live record.`,
			example: `warden idem show charge:order-42`,
			setup:   noFlags(idemShow),
		},
		{
			path:     "idem rm",
			noCreate: true,
			args:     "KEY",
			summary:  "remove an idempotency record",
			need:     []string{"KEY"},
			maxArgs:  1,
			help: `
Removes the idempotency record KEY, so that the next call with this key runs
the operation again. Removing a pending record lets a duplicate run while
the first claimant still runs. Exits 4 if there was no live record.`,
			example: `warden idem rm charge:order-42`,
			setup:   noFlags(idemRm),
		},
	}
}

// idemJSON is an idempotency record's JSON form; Result and Encoding are
// set by `idem show` only, ResultBytes always.
type idemJSON struct {
	Key         string   `json:"key"`
	Status      string   `json:"status"`
	Owner       string   `json:"owner"`
	Fingerprint string   `json:"fingerprint"`
	CreatedAt   jsonTime `json:"created_at"`
	ExpiresAt   jsonTime `json:"expires_at"`
	ResultBytes int      `json:"result_bytes"`
	Result      *string  `json:"result,omitempty"`
	Encoding    string   `json:"encoding,omitempty"`
}

func toIdemJSON(r driver.IdemRecord, withResult bool) idemJSON {
	j := idemJSON{
		Key: r.Key, Status: string(r.Status), Owner: r.Owner, Fingerprint: r.Fingerprint,
		CreatedAt: jsonTime(r.CreatedAt), ExpiresAt: jsonTime(r.ExpiresAt), ResultBytes: len(r.Result),
	}
	if withResult {
		v, enc := encodeBytes(r.Result)
		j.Result, j.Encoding = &v, enc
	}
	return j
}

func idemLs(ctx context.Context, c *cli, args []string) error {
	var recs []driver.IdemRecord
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		recs, err = st.Idempotency().List(ctx, argOr(args, 0, ""))
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		out := make([]idemJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toIdemJSON(r, false))
		}
		return c.printJSON(out)
	}
	tw := c.table("KEY", "STATUS", "OWNER", "CREATED", "EXPIRES", "RESULT")
	for _, r := range recs {
		result := "-"
		if r.Status == driver.IdemCompleted {
			result = count(int64(len(r.Result)), "byte", "bytes")
		}
		row(tw, cell(r.Key), string(r.Status), cell(r.Owner), tableTime(r.CreatedAt), tableTime(r.ExpiresAt), result)
	}
	return tw.Flush()
}

func idemShow(ctx context.Context, c *cli, args []string) error {
	var rec driver.IdemRecord
	var found bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		rec, found, err = st.Idempotency().Get(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("idempotency key %q not found", args[0])
	}
	if c.isJSON() {
		return c.printJSON(toIdemJSON(rec, true))
	}
	result := "-"
	if rec.Status == driver.IdemCompleted {
		result = showBytes(rec.Result)
	}
	return c.printFields([]field{
		{"key", cell(rec.Key)},
		{"status", string(rec.Status)},
		{"owner", cell(rec.Owner)},
		{"fingerprint", cell(rec.Fingerprint)},
		{"created_at", tableTime(rec.CreatedAt)},
		{"expires_at", tableTime(rec.ExpiresAt)},
		{"result_bytes", strconv.Itoa(len(rec.Result))},
		{"result", result},
	})
}

func idemRm(ctx context.Context, c *cli, args []string) error {
	var ok bool
	err := c.withStore(ctx, func(ctx context.Context, st *warden.Store) (err error) {
		ok, err = st.Idempotency().Delete(ctx, args[0])
		return err
	})
	if err != nil {
		return err
	}
	if !ok {
		return notFoundf("idempotency key %q not found", args[0])
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Key     string `json:"key"`
			Removed bool   `json:"removed"`
		}{args[0], true})
	}
	return c.printf("removed idempotency key %s", cell(args[0]))
}
