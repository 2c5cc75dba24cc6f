package dynamo

import "github.com/warden-go/warden"

// SetPageLimit makes the store read Scan and Query results n items per
// page, so that tests cross page boundaries with few items.
func SetPageLimit(st *warden.Store, n int32) {
	st.Driver().(driverStore).base().pageLimit = n
}

// EventsOn reports whether the store writes to the events index.
func EventsOn(st *warden.Store) bool { return st.Driver().(driverStore).base().events }
