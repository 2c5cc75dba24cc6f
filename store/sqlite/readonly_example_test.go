package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"

	"github.com/warden-go/warden/store/sqlite"
)

// A tool that only reads opens the database read-only: it creates no file
// at a mistyped path, and works on a file it may not write.
func ExampleOptions_readOnly() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "warden-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "app.db")

	_, err = sqlite.Open(ctx, path, &sqlite.Options{ReadOnly: true})
	fmt.Println("missing file:", errors.Is(err, fs.ErrNotExist))

	app, err := sqlite.Open(ctx, path, nil) // the application creates it
	if err != nil {
		log.Fatal(err)
	}
	if err := app.Cache().Set(ctx, "greeting", []byte("hello"), 0); err != nil {
		log.Fatal(err)
	}
	app.Close()

	ro, err := sqlite.Open(ctx, path, &sqlite.Options{ReadOnly: true}) // or sqlite://…?mode=ro
	if err != nil {
		log.Fatal(err)
	}
	defer ro.Close()
	e, _, err := ro.Cache().Get(ctx, "greeting")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("read:", string(e.Value))
	fmt.Println("write refused:", ro.Cache().Set(ctx, "greeting", []byte("bye"), 0) != nil)
	// Output:
	// missing file: true
	// read: hello
	// write refused: true
}
