package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strconv"

	"github.com/spf13/pflag"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/sqlite"
)

// recordFlags are the flags that say how to find a table's record locks.
type recordFlags struct {
	idField, until, owner, token, idType *string
}

func addRecordFlags(fs *pflag.FlagSet, withType bool) recordFlags {
	f := recordFlags{
		idField: fs.String("id-field", "", "the id column or field (default: id; _id on mongodb)"),
		until:   fs.String("until-field", "", "the lock's expiry column or field (default: locked_until in SQL, lockedUntil otherwise)"),
		owner:   fs.String("owner-field", "", "the holder column or field (default: locked_by in SQL, lockedBy otherwise)"),
		token:   fs.String("token-field", "", "the fencing token column or field (default: lock_token in SQL, lockToken otherwise)"),
	}
	if withType {
		f.idType = fs.String("id-type", "string", "how to read ID: string, int, or objectid (mongodb)")
	}
	return f
}

func (f recordFlags) fields() driver.RecordFields {
	return driver.RecordFields{ID: *f.idField, Until: *f.until, Owner: *f.owner, Token: *f.token}
}

// parseID reads an id given on the command line as --id-type says.
func (f recordFlags) parseID(cmd *command, s string) (any, error) {
	switch *f.idType {
	case "string":
		return s, nil
	case "int":
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, usagef(cmd, "ID %q is not an integer (--id-type int)", s)
		}
		return n, nil
	case "objectid":
		id, err := bson.ObjectIDFromHex(s)
		if err != nil {
			return nil, usagef(cmd, "ID %q is not an ObjectId of 24 hex digits (--id-type objectid)", s)
		}
		return id, nil
	}
	return nil, usagef(cmd, "--id-type %q: want string, int or objectid", *f.idType)
}

func recordCommands() []*command {
	const fieldsHelp = `
The table's id and lock fields are the defaults of warden's record drivers
(id / locked_until / locked_by / lock_token in SQL; _id / lockedUntil /
lockedBy / lockToken on MongoDB; id / lockedUntil / lockedBy / lockToken on
DynamoDB) unless --id-field, --until-field, --owner-field or --token-field
name others. The table is in the database of --store; memory and redis
stores have no tables of records.`
	return []*command{
		{
			path:     "record ls",
			readOnly: true,
			args:     "TABLE [--limit N]",
			summary:  "list the locked records of one of your tables",
			need:     []string{"TABLE"},
			maxArgs:  1,
			help: `
Lists the records of TABLE (a table or collection of your own, locked with
package recordlock) whose lock is live, in id order: id, holder, fencing
token and expiry.` + fieldsHelp,
			example: `warden record ls invoices
warden record ls jobs --store postgres://app@db/app -o json`,
			setup: func(fs *pflag.FlagSet) runFunc {
				f := addRecordFlags(fs, false)
				limit := fs.Int("limit", 1000, "list at most N records")
				return func(ctx context.Context, c *cli, args []string) error {
					if *limit < 1 {
						return usagef(findCommand("record ls"), "--limit %d: want 1 or more", *limit)
					}
					return recordLs(ctx, c, args[0], f, *limit)
				}
			},
		},
		{
			path:     "record show",
			readOnly: true,
			args:     "TABLE ID [--id-type T]",
			short:    "TABLE ID",
			summary:  "show the lock of one record",
			need:     []string{"TABLE", "ID"},
			maxArgs:  2,
			help: `
Shows the lock of record ID in TABLE: whether it is locked, the holder, the
fencing token last issued and the expiry. Exits 4 if no record has that id.` + fieldsHelp,
			example: `warden record show invoices inv-1042
warden record show jobs 42 --id-type int`,
			setup: func(fs *pflag.FlagSet) runFunc {
				f := addRecordFlags(fs, true)
				return func(ctx context.Context, c *cli, args []string) error {
					return recordShow(ctx, c, args[0], args[1], f)
				}
			},
		},
		{
			path:     "record release",
			noCreate: true,
			args:     "TABLE ID --force [--id-type T]",
			short:    "TABLE ID --force",
			summary:  "clear the lock of one record, whoever holds it",
			need:     []string{"TABLE", "ID"},
			maxArgs:  2,
			help: `
Clears the lock of record ID in TABLE, whoever holds it (the fencing token
stays, so the next holder's is greater). The holder is not asked: it learns
it lost the record at its next extension, so --force is required. Exits 4
if no record has that id, or if it was not locked.` + fieldsHelp,
			example: `warden record release invoices inv-1042 --force`,
			setup: func(fs *pflag.FlagSet) runFunc {
				f := addRecordFlags(fs, true)
				force := fs.Bool("force", false, "required: clear the lock even though someone holds it")
				return func(ctx context.Context, c *cli, args []string) error {
					return recordRelease(ctx, c, args[0], args[1], f, *force)
				}
			},
		},
	}
}

// recordJSON is a record lock's JSON form.
type recordJSON struct {
	Table  string   `json:"table"`
	ID     any      `json:"id"`
	Locked bool     `json:"locked"`
	Owner  string   `json:"owner"`
	Token  int64    `json:"token"`
	Until  jsonTime `json:"until"`
}

func toRecordJSON(table string, r driver.RecordLock) recordJSON {
	j := recordJSON{Table: table, ID: r.ID, Locked: r.Live(), Token: r.Token}
	if j.Locked {
		j.Owner, j.Until = r.Owner, jsonTime(r.Until)
	}
	if oid, ok := r.ID.(bson.ObjectID); ok {
		j.ID = oid.Hex()
	}
	return j
}

func showRecordID(id any) string {
	if oid, ok := id.(bson.ObjectID); ok {
		return oid.Hex()
	}
	return cell(fmt.Sprint(id))
}

// recordStoreURL is the store URL the record commands open: the tables
// are the user's own, so opening the store must not create warden's
// tables beside them (auto_migrate=false, unless the URL says otherwise).
func recordStoreURL(raw, scheme string) string {
	switch scheme {
	case "postgres", "postgresql", "mysql", "mongodb", "mongodb+srv":
		return withParam(raw, "auto_migrate", "false")
	}
	return raw
}

// withRecords runs f on the admin part of TABLE's record-lock driver.
// SQLite files are opened directly (read-only for ls and show), so that
// neither warden's tables nor a new file are created in the user's
// database; the other stores through the store's own connection.
func (c *cli) withRecords(ctx context.Context, table string, fields driver.RecordFields, f func(ctx context.Context, rt driver.RecordAdmin) error) error {
	if c.scheme() == "sqlite" {
		if err := checkStoreURL(c.g.store); err != nil {
			return err
		}
		ctx, cancel := c.storeContext(ctx)
		defer cancel()
		path := sqliteFile(c.g.store)
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("warden: open %s: %w", driver.RedactURL(mustParse(c.g.store)), err)
		}
		q := "_pragma=busy_timeout(5000)"
		if c.readOnly {
			q = "mode=ro"
		}
		db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: q}).String())
		if err != nil {
			return err
		}
		defer db.Close()
		rt, err := sqlite.Records(db, table, &sqlite.RecordOptions{IDColumn: fields.ID, UntilColumn: fields.Until, OwnerColumn: fields.Owner, TokenColumn: fields.Token})
		if err != nil {
			return err
		}
		return c.ctxError(ctx, f(ctx, rt))
	}
	return c.withStore(ctx, func(ctx context.Context, st *warden.Store) error {
		rts, ok := st.Driver().(driver.RecordTables)
		if !ok {
			return fmt.Errorf("the %s store has no tables of records: record locks live in a table of your own on mongodb, dynamodb, mysql, postgres or sqlite: %w", st.Name(), warden.ErrInvalidArgument)
		}
		rt, err := rts.RecordTable(table, fields)
		if err != nil {
			return err
		}
		return f(ctx, rt)
	})
}

func recordLs(ctx context.Context, c *cli, table string, f recordFlags, limit int) error {
	var recs []driver.RecordLock
	err := c.withRecords(ctx, table, f.fields(), func(ctx context.Context, rt driver.RecordAdmin) (err error) {
		recs, err = rt.List(ctx, limit)
		return err
	})
	if err != nil {
		return err
	}
	if c.isJSON() {
		out := make([]recordJSON, 0, len(recs))
		for _, r := range recs {
			out = append(out, toRecordJSON(table, r))
		}
		return c.printJSON(out)
	}
	tw := c.table("ID", "OWNER", "TOKEN", "UNTIL")
	for _, r := range recs {
		row(tw, showRecordID(r.ID), cell(r.Owner), strconv.FormatInt(r.Token, 10), tableTime(r.Until))
	}
	return tw.Flush()
}

func recordShow(ctx context.Context, c *cli, table, rawID string, f recordFlags) error {
	id, err := f.parseID(findCommand("record show"), rawID)
	if err != nil {
		return err
	}
	var rec driver.RecordLock
	var found bool
	err = c.withRecords(ctx, table, f.fields(), func(ctx context.Context, rt driver.RecordAdmin) error {
		if err := rt.CheckID(id); err != nil {
			return err
		}
		rec, found, err = rt.Get(ctx, id)
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("no record %s in %s", cell(rawID), cell(table))
	}
	j := toRecordJSON(table, rec)
	if c.isJSON() {
		return c.printJSON(j)
	}
	owner, until := "-", "-"
	if j.Locked {
		owner, until = cell(rec.Owner), tableTime(rec.Until)
	}
	return c.printFields([]field{
		{"table", cell(table)},
		{"id", showRecordID(rec.ID)},
		{"locked", strconv.FormatBool(j.Locked)},
		{"owner", owner},
		{"token", strconv.FormatInt(rec.Token, 10)},
		{"until", until},
	})
}

func recordRelease(ctx context.Context, c *cli, table, rawID string, f recordFlags, force bool) error {
	cmd := findCommand("record release")
	if !force {
		return usagef(cmd, "--force is required: the holder of record %q is not asked and learns of it only at its next extension", rawID)
	}
	id, err := f.parseID(cmd, rawID)
	if err != nil {
		return err
	}
	var was driver.RecordLock
	var found bool
	err = c.withRecords(ctx, table, f.fields(), func(ctx context.Context, rt driver.RecordAdmin) error {
		if err := rt.CheckID(id); err != nil {
			return err
		}
		was, found, err = rt.ForceRelease(ctx, id)
		return err
	})
	if err != nil {
		return err
	}
	if !found {
		return notFoundf("no record %s in %s", cell(rawID), cell(table))
	}
	if !was.Live() {
		return notFoundf("record %s in %s was not locked", cell(rawID), cell(table))
	}
	if c.isJSON() {
		return c.printJSON(struct {
			Table    string `json:"table"`
			ID       any    `json:"id"`
			Owner    string `json:"owner"`
			Token    int64  `json:"token"`
			Released bool   `json:"released"`
		}{table, toRecordJSON(table, was).ID, was.Owner, was.Token, true})
	}
	return c.printf("released record %s in %s (held by %s, token %d)", cell(rawID), cell(table), cell(was.Owner), was.Token)
}
