package dynamo

import "github.com/warden-go/warden"

// SetPageLimit makes the store read Scan and Query results n items per
// page, so that tests cross page boundaries with few items.
func SetPageLimit(st *warden.Store, n int32) {
	st.Driver().(driverStore).base().pageLimit = n
}

// EventsOn reports whether the store writes to the events index.
func EventsOn(st *warden.Store) bool { return st.Driver().(driverStore).base().events }

// ErrContended is what the error of an operation that gave up wraps.
var ErrContended = errContended

// SetTries sets how many attempts each retry loop of st makes before it
// gives up (0: each loop's default).
func SetTries(st *warden.Store, n int) { st.Driver().(driverStore).base().tries = n }

// SetRace sets the hook st's retry loops call where they can lose a race
// (see store.raced for the sites).
func SetRace(st *warden.Store, f func(site string)) { st.Driver().(driverStore).base().race = f }

// ListsByIndex reports whether st's listings Query the list index (else
// they Scan the table).
func ListsByIndex(st *warden.Store) bool { return st.Driver().(driverStore).base().byIndex }

// LpkOf is the list index key of an item of pk (see lpkOf).
var LpkOf = lpkOf

// SetCloseHook sets a function Close calls once it refuses new queue
// entries and before it waits for the entry writes in flight.
func SetCloseHook(st *warden.Store, f func()) {
	st.Driver().(driverStore).base().waits.book.SetCloseHook(f)
}
