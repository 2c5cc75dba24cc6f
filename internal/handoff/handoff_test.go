package handoff

import (
	"slices"
	"testing"
)

// TestPickNext: the next holder is the live entry of another owner that
// arrived first; the releaser's own entry, lapsed entries and entries
// whose name the store could not read are removed, never handed the key.
func TestPickNext(t *testing.T) {
	const now = 1000
	q := []Entry{
		{Owner: "c", Arrival: 30, Until: now + 1},
		{Owner: "", Name: "w!!", Arrival: 1, Until: now + 500}, // unreadable
		{Owner: "me", Arrival: 5, Until: now + 500},
		{Owner: "b", Arrival: 20, Until: now + 500},
		{Owner: "dead", Arrival: 2, Until: now}, // lapsed at now
		{Owner: "a", Arrival: 20, Until: now + 500},
	}
	Sort(q)
	next, ok, drop := PickNext(q, "me", now)
	if !ok || next.Owner != "a" {
		t.Errorf("next %+v (%v), want a: arrived first with b, a before b", next, ok)
	}
	var dropped []string
	for _, e := range drop {
		dropped = append(dropped, e.Owner+"/"+e.Name)
	}
	if want := []string{"/w!!", "dead/", "me/"}; !slices.Equal(dropped, want) {
		t.Errorf("dropped %v, want %v", dropped, want)
	}
	if _, ok, _ := PickNext([]Entry{{Owner: "me", Until: now + 1}}, "me", now); ok {
		t.Error("the releaser's own entry was picked")
	}
}

// TestBookClose: Close refuses new entry writes, and returns every place
// and untaken holding once.
func TestBookClose(t *testing.T) {
	var b Book
	k1, k2, k3 := Key{"p", "a"}, Key{"p", "b"}, Key{"q", "a"}
	if a := b.Arrival(k1, 5); a != 5 || b.Arrival(k1, 9) != 5 {
		t.Errorf("arrival %d, then %d: want the first kept", a, b.Arrival(k1, 9))
	}
	b.Arrival(k2, 6)
	b.SetHanded(k2, Handed{Token: 7})
	b.SetHanded(k3, Handed{Token: 8})
	done, ok := b.StartWrite()
	if !ok {
		t.Fatal("StartWrite refused before Close")
	}
	done()
	ls := b.Close()
	if _, ok := b.StartWrite(); ok {
		t.Error("StartWrite accepted after Close")
	}
	got := map[Key]Left{}
	for _, l := range ls {
		got[l.Key] = l
	}
	want := map[Key]Left{k1: {k1, 0, false}, k2: {k2, 7, true}, k3: {k3, 8, true}}
	if len(got) != len(ls) || len(got) != len(want) {
		t.Fatalf("Close returned %v, want %v", ls, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%v: %+v, want %+v", k, got[k], w)
		}
	}
	if ls := b.Close(); len(ls) != 0 {
		t.Errorf("a second Close returned %v", ls)
	}
}
