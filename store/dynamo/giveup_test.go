package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
	"github.com/warden-go/warden/store/dynamo"
)

// giveUpTries is the attempts each retry loop makes in these tests.
const giveUpTries = 5

// TestGiveUp: a retry loop whose every attempt loses a race gives up with
// an error that says so — naming the operation's key and the number of
// attempts, wrapping ErrContended — never with a made-up outcome (a lock
// "held" by a holder with no expiry, a claim "in progress"). Each loop's
// race is made to happen on every attempt, at the hook sites of the store
// (see SetRace); the races are the same whether or not the endpoint
// returns the item with a failed condition (dynalite does not).
func TestGiveUp(t *testing.T) {
	table := testTable(t)
	c := newClient(t)
	open := func(t *testing.T) (*warden.Store, string) {
		prefix := fmt.Sprintf("giveup-%08x:", rand.Uint32())
		st, err := dynamo.Open(t.Context(), storeURL(table)(t, prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		dynamo.SetTries(st, giveUpTries)
		return st, prefix
	}
	put := func(t *testing.T, it map[string]types.AttributeValue) {
		t.Helper()
		if _, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: it}); err != nil {
			t.Fatal(err)
		}
	}
	del := func(t *testing.T, pk string) {
		t.Helper()
		_, err := c.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: aws.String(table),
			Key: map[string]types.AttributeValue{"pk": attrS(pk), "sk": attrS("METADATA")}})
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Locks.Acquire", func(t *testing.T) {
		st, prefix := open(t)
		pk := "LOCK#" + prefix + "lock:k"
		var attempts, renewals int
		token := driver.TokenBase(time.Now())
		dynamo.SetRace(st, func(site string) {
			switch site {
			case "write": // the caller's own live holding is there as each attempt starts
				attempts++
				token++
				now := time.Now().UnixMilli()
				put(t, map[string]types.AttributeValue{"pk": attrS(pk), "sk": attrS("METADATA"), "owner": attrS("me"),
					"version": attrN(token), "acquiredAt": attrN(now), "expiresAtMs": attrN(now + 60_000)})
			case "renew": // and ends (purged) before the store renews it
				renewals++
				del(t, pk)
			}
		})
		rec, ok, err := st.Driver().Locks().Acquire(t.Context(), "k", "me", time.Minute)
		checkGaveUp(t, err, "k", attempts)
		if ok || rec != (driver.LockRecord{}) {
			t.Errorf("a give-up returned acquired=%v and the record %+v, want false and none", ok, rec)
		}
		if renewals != giveUpTries {
			t.Errorf("%d renewals lost, want one per attempt (%d)", renewals, giveUpTries)
		}
	})
	t.Run("Idempotency.Claim", func(t *testing.T) {
		st, prefix := open(t)
		pk := "IDEM#" + prefix + "idem:i"
		var attempts, renewals int
		dynamo.SetRace(st, func(site string) {
			switch site {
			case "write": // the caller's own live claim is there as each attempt starts
				attempts++
				now := time.Now().UnixMilli()
				put(t, map[string]types.AttributeValue{"pk": attrS(pk), "sk": attrS("METADATA"), "status": attrS(string(driver.IdemPending)),
					"owner": attrS("me"), "createdAt": attrN(now), "expiresAtMs": attrN(now + 60_000)})
			case "renew": // and is gone before the store renews it
				renewals++
				del(t, pk)
			}
		})
		rec, outcome, err := st.Driver().Idempotency().Claim(t.Context(), "i", "me", time.Minute, "")
		checkGaveUp(t, err, "i", attempts)
		if outcome != 0 || rec.Status != "" {
			t.Errorf("a give-up returned the outcome %v and the record %+v, want none", outcome, rec)
		}
		if renewals != giveUpTries {
			t.Errorf("%d renewals lost, want one per attempt (%d)", renewals, giveUpTries)
		}
	})
	t.Run("Circuits.RecordSuccess", func(t *testing.T) {
		st, prefix := open(t)
		pk := "CB#" + prefix + "circuit:c"
		steps := 0
		dynamo.SetRace(st, func(site string) {
			if site != "step" {
				return
			}
			// Before each conditional update the circuit changes state:
			// open under the update for closed circuits, closed under the
			// update for open ones.
			steps++
			state := driver.Open
			if steps%2 == 0 {
				state = driver.Closed
			}
			put(t, map[string]types.AttributeValue{"pk": attrS(pk), "sk": attrS("METADATA"), "state": attrS(string(state)),
				"failures": attrN(0), "version": attrN(int64(steps))})
		})
		rec, err := st.Driver().Circuits().RecordSuccess(t.Context(), "c", driver.AnyGeneration)
		checkGaveUp(t, err, "c", steps)
		if rec != (driver.CircuitRecord{}) {
			t.Errorf("a give-up returned the record %+v, want none", rec)
		}
	})
}

// checkGaveUp checks the error of an operation on key that gave up after
// giveUpTries attempts, of which the hook saw attempts.
func checkGaveUp(t *testing.T, err error, key string, attempts int) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("no error after %d lost attempts: the store made an outcome up", attempts)
	case !errors.Is(err, dynamo.ErrContended):
		t.Errorf("error %v does not wrap ErrContended", err)
	case !strings.Contains(err.Error(), strconv.Quote(key)) || !strings.Contains(err.Error(), fmt.Sprintf("%d attempts", giveUpTries)):
		t.Errorf("error %q does not name the key %q and the %d attempts", err, key, giveUpTries)
	}
	if attempts != giveUpTries {
		t.Errorf("the hook saw %d attempts, want %d", attempts, giveUpTries)
	}
	t.Logf("%v", err)
}

func attrS(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func attrN(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}
