package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warden-go/warden"
)

// TestReadOnly: Options.ReadOnly (?mode=ro) never creates a file, refuses a
// database without warden's tables, reads a warden database, and refuses
// writes.
func TestReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	missing := filepath.Join(dir, "typo.db")
	if _, err := Open(ctx, missing, &Options{ReadOnly: true}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: want fs.ErrNotExist, got %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a read-only open created %v", entries)
	}

	other := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite", other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(ctx, other, &Options{ReadOnly: true}); err == nil {
		t.Fatal("a database without warden's tables opened read-only")
	}

	path := filepath.Join(dir, "warden.db")
	rw, err := Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.Cache().Set(ctx, "k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	rw.Close()

	u := &url.URL{Scheme: "sqlite", Path: path, RawQuery: "mode=ro"}
	ro, err := warden.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if e, found, err := ro.Cache().Get(ctx, "k"); err != nil || !found || string(e.Value) != "v" {
		t.Fatalf("read: %v %v %q", err, found, e.Value)
	}
	if err := ro.Cache().Set(ctx, "k2", []byte("v"), 0); err == nil {
		t.Fatal("a write through a read-only store succeeded")
	}
	if _, _, err := ro.Locks().Acquire(ctx, "l", "o", time.Minute); err == nil {
		t.Fatal("an acquire through a read-only store succeeded")
	}

	if _, err := warden.Open(ctx, "sqlite://"+path+"?mode=bogus"); err == nil {
		t.Fatal("mode=bogus accepted")
	}
}
