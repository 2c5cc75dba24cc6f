package recordlocktest_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/recordlock/recordlocktest"
	"github.com/warden-go/warden/store/memory"
)

// memTables are the memory harness's tables, by name.
var memTables sync.Map

func memTable(name string) (*memory.RecordTable, error) {
	t, ok := memTables.Load(name)
	if !ok {
		return nil, fmt.Errorf("no table %q", name)
	}
	return t.(*memory.RecordTable), nil
}

func memID(n int) any { return fmt.Sprintf("rec-%06d", n) }

var memHarness = recordlocktest.Harness[memory.RecordFilter]{
	Name: "memory",
	Create: func(_ context.Context, name string, rows []recordlocktest.Row) error {
		t := memory.NewRecordTable(name)
		for _, r := range rows {
			t.Insert(memID(r.N).(string), map[string]any{"status": r.Status, "rank": r.Rank, "note": r.Note})
		}
		memTables.Store(name, t)
		return nil
	},
	Drop: func(_ context.Context, name string) error { memTables.Delete(name); return nil },
	Open: func(_ context.Context, name string) (driver.Records[memory.RecordFilter], func(), error) {
		t, err := memTable(name)
		return t, func() {}, err
	},
	ID: memID,
	Read: func(_ context.Context, name string, id any) (recordlocktest.Row, bool, error) {
		t, err := memTable(name)
		if err != nil {
			return recordlocktest.Row{}, false, err
		}
		s, _ := id.(string)
		f, ok := t.Fields(s)
		if !ok {
			return recordlocktest.Row{}, false, nil
		}
		return recordlocktest.Row{Status: f["status"].(string), Rank: f["rank"].(int), Note: f["note"].(string)}, true, nil
	},
	SetNote: func(_ context.Context, name string, id any, note string) error {
		t, err := memTable(name)
		if err != nil {
			return err
		}
		f, _ := t.Fields(id.(string))
		f["note"] = note
		t.Insert(id.(string), f)
		return nil
	},
	Count: func(_ context.Context, name string) (int, error) {
		t, err := memTable(name)
		if err != nil {
			return 0, err
		}
		return t.Len(), nil
	},
	ByStatus: func(status string) memory.RecordFilter {
		return memory.RecordFilter{
			Match: func(_ string, f map[string]any) bool { return f["status"] == status },
			Less:  func(a, b map[string]any) bool { return a["rank"].(int) < b["rank"].(int) },
		}
	},
	HostileIDs:    []any{"*", "%", "rec-%", "rec-00000?", 42, []byte("rec-000001")},
	SingleProcess: true,
}

func TestMemory(t *testing.T) { recordlocktest.Run(t, memHarness) }

func TestMain(m *testing.M) {
	recordlocktest.Child(memHarness)
	os.Exit(m.Run())
}
