package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/recordlock"
	"github.com/warden-go/warden/store/sqlite"
)

// TestRecordCommands drives record ls, show and release on a SQLite table
// of the user's own, locked through recordlock.
func TestRecordCommands(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	url := "sqlite://" + path
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE jobs (id INTEGER PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO jobs (id, status) VALUES (1, 'todo'), (2, 'todo'), (3, 'todo')`); err != nil {
		t.Fatal(err)
	}
	rt, err := sqlite.Records(db, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := recordlock.New(rt, &recordlock.Options{Owner: "billing", NoAutoExtend: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	k, err := l.Lock(ctx, int64(2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	r := invoke(t, "", "--store", url, "record", "ls", "jobs")
	want(t, r, 0)
	wantLines(t, r, `ID +OWNER +TOKEN +UNTIL`, `2 +billing#[0-9a-f]{12}\.1 +1 +`+rfc3339ms)
	if strings.Count(r.stdout, "\n") != 2 {
		t.Errorf("record ls lists only live locks: %s", r)
	}
	r = invoke(t, "", "--store", url, "-o", "json", "record", "ls", "jobs")
	want(t, r, 0)
	var recs []recordJSON
	decode(t, r, &recs)
	if len(recs) != 1 || fmt.Sprint(recs[0].ID) != "2" || recs[0].Owner != k.Owner() || recs[0].Token != k.Token() || !recs[0].Locked {
		t.Errorf("record ls -o json: %+v", recs)
	}

	r = invoke(t, "", "--store", url, "record", "show", "jobs", "2", "--id-type", "int")
	want(t, r, 0)
	wantLines(t, r, `table: +jobs`, `id: +2`, `locked: +true`, `owner: +billing#[0-9a-f]{12}\.1`, `token: +1`, `until: +`+rfc3339ms)
	r = invoke(t, "", "--store", url, "record", "show", "jobs", "1", "--id-type", "int")
	want(t, r, 0)
	wantLines(t, r, `table: +jobs`, `id: +1`, `locked: +false`, `owner: +-`, `token: +0`, `until: +-`)
	r = invoke(t, "", "--store", url, "record", "show", "jobs", "9", "--id-type", "int")
	want(t, r, exitNotFound)
	r = invoke(t, "", "--store", url, "record", "show", "jobs", "x", "--id-type", "int")
	want(t, r, exitUsage)
	r = invoke(t, "", "--store", url, "record", "show", "jobs", "2", "--id-type", "uuid")
	want(t, r, exitUsage)

	r = invoke(t, "", "--store", url, "record", "release", "jobs", "2", "--id-type", "int")
	want(t, r, exitUsage) // --force is required
	r = invoke(t, "", "--store", url, "record", "release", "jobs", "2", "--id-type", "int", "--force")
	want(t, r, 0)
	wantLines(t, r, `released record 2 in jobs \(held by billing#[0-9a-f]{12}\.1, token 1\)`)
	if err := k.Extend(ctx, time.Hour); err == nil {
		t.Error("the holder kept its lock after record release --force")
	}
	r = invoke(t, "", "--store", url, "record", "release", "jobs", "2", "--id-type", "int", "--force")
	want(t, r, exitNotFound) // not locked any more
	r = invoke(t, "", "--store", url, "record", "release", "jobs", "9", "--id-type", "int", "--force")
	want(t, r, exitNotFound)
	var status string
	if err := db.QueryRow(`SELECT status FROM jobs WHERE id = 2`).Scan(&status); err != nil || status != "todo" {
		t.Errorf("the user's column after the CLI's release: %q, %v", status, err)
	}

	r = invoke(t, "", "--store", url, "record", "ls", "no_such_table")
	if r.code == 0 {
		t.Errorf("record ls of a missing table: %s", r)
	}
	r = invoke(t, "", "--store", url, "record", "ls", "jobs; DROP TABLE jobs")
	want(t, r, exitUsage)
	r = invoke(t, "", "--store", "memory://", "record", "ls", "jobs")
	want(t, r, exitUsage)
}
