package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// storeNames gives, for each directory under store/, the name the README
// uses for that store and the one warden's help uses. A store added there
// must be added here, and so to every list TestDocsNameEveryStore checks.
var storeNames = map[string]struct{ readme, help string }{
	"memory":   {"memory", "memory"},
	"sqlite":   {"SQLite", "sqlite"},
	"postgres": {"PostgreSQL", "postgres"},
	"mysql":    {"MySQL", "mysql"},
	"redis":    {"Redis", "redis"},
	"mongo":    {"MongoDB", "mongodb"},
	"dynamo":   {"DynamoDB", "dynamodb"},
}

// TestDocsNameEveryStore: every list of stores in the README and in `lock
// watch --help` names every store the repository has — the Layout, which
// store for which reach, what lock watch sees on each, what each backend
// needs from the operator.
func TestDocsNameEveryStore(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := os.ReadDir("../../store")
	if err != nil {
		t.Fatal(err)
	}
	layout := section(t, string(readme), "## Layout")
	reach := section(t, string(readme), "Which store for which reach:", "\n\n")
	watch := section(t, string(readme), "- **What `lock watch` sees.**", "\n- **", "\n\n")
	operator := section(t, string(readme), "What each backend needs from the operator:", "\n## ")
	help := invoke(t, "", "lock", "watch", "--help")
	want(t, help, 0)
	helpWatch := section(t, help.stdout, "What each store can see:", "\nAn events-lost line")

	n := 0
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		if src, _ := filepath.Glob(filepath.Join("../../store", d.Name(), "*.go")); len(src) == 0 {
			continue // not a store
		}
		n++
		name, ok := storeNames[d.Name()]
		if !ok {
			t.Errorf("store/%s: not in storeNames; add it there and to the README's and lock watch's lists", d.Name())
			continue
		}
		if !strings.Contains(layout, "\nstore/"+d.Name()+"/ ") {
			t.Errorf("README's Layout lacks store/%s/", d.Name())
		}
		if !strings.Contains(watch, name.readme) {
			t.Errorf("README's \"What lock watch sees\" does not name %s:\n%s", name.readme, watch)
		}
		if !strings.Contains(helpWatch, name.help) {
			t.Errorf("lock watch --help does not say what %s can see:\n%s", name.help, helpWatch)
		}
		switch d.Name() {
		case "memory", "sqlite":
			if !strings.Contains(reach, "`"+d.Name()+"://`") {
				t.Errorf("README's \"Which store for which reach\" lacks %s://:\n%s", d.Name(), reach)
			}
		default: // a server store
			if !strings.Contains(reach, name.readme) {
				t.Errorf("README's \"Which store for which reach\" lacks %s:\n%s", name.readme, reach)
			}
		}
		if d.Name() != "memory" && !strings.Contains(operator, "\n- **"+name.readme) {
			t.Errorf("README's \"What each backend needs from the operator\" has no entry for %s", name.readme)
		}
	}
	if n != len(storeNames) {
		t.Errorf("store/ has %d stores, storeNames %d: keep them equal", n, len(storeNames))
	}
}

// section returns the text of doc from start up to the nearest of ends
// after it (or to the end of doc).
func section(t *testing.T, doc, start string, ends ...string) string {
	t.Helper()
	i := strings.Index(doc, start)
	if i < 0 {
		t.Fatalf("no %q in the document", start)
	}
	s := doc[i:]
	cut := len(s)
	for _, end := range ends {
		if j := strings.Index(s[len(start):], end); j >= 0 && len(start)+j < cut {
			cut = len(start) + j
		}
	}
	return s[:cut]
}
