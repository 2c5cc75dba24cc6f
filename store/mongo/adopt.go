package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warden-go/warden/driver"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// adoptingCircuits is the circuit driver the store hands out: circuits,
// plus the adoption of circuits the go-go-scope adapter created.
//
// The adapter upserts a circuit by key alone. Into warden's document when
// there is one (both sides then share it); when there is none it inserts
// its own, with an ObjectId _id and no namespace, which warden's lookups
// by _id do not see and which the unique key index keeps warden from
// duplicating (every write would collide until it gave up). A Get that
// finds nothing, and a write that gave up, therefore adopt such a document
// once: it is replaced by warden's document of the same state (openedAt
// taken from its last failure, else its last update, as TryProbe does),
// which the adapter's later upserts by key then update in place. The
// steady state costs nothing more.
type adoptingCircuits struct{ circuits }

// Get implements driver.Circuits.
func (c adoptingCircuits) Get(ctx context.Context, name string) (driver.CircuitRecord, bool, error) {
	rec, found, err := c.circuits.Get(ctx, name)
	if err != nil || found {
		return rec, found, err
	}
	if adopted, err := c.adopt(ctx, name); err != nil || !adopted {
		return rec, false, err
	}
	return c.circuits.Get(ctx, name)
}

// again runs a circuit write, and once more after adopting the adapter's
// document if the write gave up (its upserts collided with that document).
func again[T any](ctx context.Context, c adoptingCircuits, name string, f func() (T, error)) (T, error) {
	out, err := f()
	if !errors.Is(err, errBusy) {
		return out, err
	}
	if adopted, aerr := c.adopt(ctx, name); aerr != nil || !adopted {
		return out, err
	}
	return f()
}

// RecordFailure implements driver.Circuits.
func (c adoptingCircuits) RecordFailure(ctx context.Context, name string, threshold int, gen int64) (driver.CircuitRecord, error) {
	return again(ctx, c, name, func() (driver.CircuitRecord, error) { return c.circuits.RecordFailure(ctx, name, threshold, gen) })
}

// RecordSuccess implements driver.Circuits.
func (c adoptingCircuits) RecordSuccess(ctx context.Context, name string, gen int64) (driver.CircuitRecord, error) {
	return again(ctx, c, name, func() (driver.CircuitRecord, error) { return c.circuits.RecordSuccess(ctx, name, gen) })
}

// RecordOutcome implements driver.Circuits.
func (c adoptingCircuits) RecordOutcome(ctx context.Context, name string, o driver.Outcome) (driver.CircuitRecord, error) {
	return again(ctx, c, name, func() (driver.CircuitRecord, error) { return c.circuits.RecordOutcome(ctx, name, o) })
}

// Set implements driver.Circuits.
func (c adoptingCircuits) Set(ctx context.Context, name string, state driver.CircuitState) (driver.CircuitRecord, error) {
	return again(ctx, c, name, func() (driver.CircuitRecord, error) { return c.circuits.Set(ctx, name, state) })
}

// nodeCircuit is a circuit document of the go-go-scope adapter.
type nodeCircuit struct {
	State       string     `bson:"state"`
	Failures    any        `bson:"failureCount"`
	LastFailure *time.Time `bson:"lastFailureTime"`
	LastSuccess *time.Time `bson:"lastSuccessTime"`
	UpdatedAt   *time.Time `bson:"updatedAt"`
}

// adopt replaces the adapter's document of circuit name, if there is one,
// by warden's: deleted, then inserted under warden's _id with the same
// state. It reports whether there was one.
func (c adoptingCircuits) adopt(ctx context.Context, name string) (bool, error) {
	s := c.s
	sk := s.circPfx + name
	var d nodeCircuit
	err := s.circs.FindOneAndDelete(ctx, nodeEntry(sk)).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, err)
	}
	t := now()
	st := driver.CircuitState(d.State)
	if !st.Valid() {
		st = driver.Closed
	}
	var opened any // generation 0 while closed
	if st != driver.Closed {
		switch {
		case d.LastFailure != nil:
			opened = d.LastFailure.UTC()
		case d.UpdatedAt != nil:
			opened = d.UpdatedAt.UTC()
		default:
			opened = t
		}
	}
	doc := bson.D{{Key: "_id", Value: s.docID(sk)}, {Key: "key", Value: sk}, {Key: "namespace", Value: s.prefix},
		{Key: "state", Value: string(st)}, {Key: "failureCount", Value: count(d.Failures)},
		{Key: "lastFailureTime", Value: d.LastFailure}, {Key: "lastSuccessTime", Value: d.LastSuccess},
		{Key: "openedAt", Value: opened}, {Key: "version", Value: int64(1)},
		{Key: "updatedAt", Value: t}, {Key: "createdAt", Value: t}}
	if _, err := s.circs.InsertOne(ctx, doc); err != nil && !isDup(err) {
		// A duplicate means another writer made the circuit meanwhile:
		// its state is newer.
		return false, ctxErr(ctx, fmt.Errorf("mongo: adopting the go-go-scope circuit %q (state %s, %v failures, now deleted): %w", name, st, count(d.Failures), err))
	}
	return true, nil
}

// count reads a number the adapter wrote (a JavaScript number: int32 or
// double).
func count(v any) int64 {
	switch n := v.(type) {
	case int32:
		return int64(n)
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}
