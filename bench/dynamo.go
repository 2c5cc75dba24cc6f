package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/store/dynamo" // registers dynamodb://
)

// dynamoEnv names the DynamoDB endpoint of the benchmarks (dynalite,
// DynamoDB Local, or a real regional endpoint), as in the tests; without
// it the dynamodb cases are left out.
const dynamoEnv = "WARDEN_TEST_DYNAMODB_ENDPOINT"

// dynamoTable is the table the benchmarks use (created on first use).
const dynamoTable = "warden_bench"

// dynamoCases returns the DynamoDB groups, measured on the endpoint ep.
// Cases() includes them when WARDEN_TEST_DYNAMODB_ENDPOINT is set.
func dynamoCases(ep string) []Case {
	return []Case{
		{Group: "dynamodb lock cycle", Name: "raw conditional PutItem + DeleteItem (aws-sdk-go-v2)", Baseline: true, Run: func(b *testing.B) { rawDynamoCycle(b, ep) }},
		{Group: "dynamodb lock cycle", Name: "raw pair on a kept item shaped as warden's (UpdateItem acquire and release, events index keys)", Run: func(b *testing.B) { rawDynamoShapedCycle(b, ep) }},
		{Group: "dynamodb lock cycle", Name: "warden primitives Acquire + Release", Run: func(b *testing.B) { primitiveCycle(b, dynamoURL(ep)) }},
		{Group: "dynamodb lock cycle", Name: "lock.Locker TryAcquire + Release", Run: func(b *testing.B) { lockerCycle(b, dynamoURL(ep)) }},
		{Group: "dynamodb cache get", Name: "raw consistent GetItem (aws-sdk-go-v2)", Baseline: true, Run: func(b *testing.B) { rawDynamoGet(b, ep) }},
		{Group: "dynamodb cache get", Name: "warden Cache().Get", Run: func(b *testing.B) { dynamoCacheGet(b, dynamoURL(ep)) }},
		{Group: "lock hand-off (p50 µs, release → waiting Acquire on another connection)", Name: "dynamodb (notifications: events index polled every 50 ms)", Metric: HandoffMetric, Run: func(b *testing.B) { handoff(b, dynamoURL(ep)) }},
	}
}

var dynamoRuns atomic.Int64

// dynamoURL is the benchmark table's URL with a namespace of the run's
// own, so that runs never see each other's records.
func dynamoURL(ep string) string {
	q := url.Values{}
	q.Set("endpoint", ep)
	q.Set("region", dynamoRegion())
	q.Set("prefix", fmt.Sprintf("bench%d%d%d:", os.Getpid(), time.Now().UnixNano(), dynamoRuns.Add(1)))
	return "dynamodb://" + dynamoTable + "?" + q.Encode()
}

func dynamoRegion() string {
	if r := os.Getenv("AWS_REGION"); r != "" {
		return r
	}
	return "us-east-1"
}

// rawDynamo returns a client of ep configured as the store configures its
// own (dummy credentials when none are in the environment, as for a local
// endpoint) and makes sure the benchmark table exists.
func rawDynamo(b *testing.B, ep string) *dynamodb.Client {
	b.Helper()
	ctx := context.Background()
	loads := []func(*config.LoadOptions) error{config.WithRegion(dynamoRegion())}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		loads = append(loads, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("warden-bench", "warden-bench", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		b.Fatal(err)
	}
	c := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(ep) })
	if err := dynamo.CreateTable(ctx, c, dynamoTable); err != nil {
		b.Fatal(err)
	}
	return c
}

// rawDynamoCycle: the least a DynamoDB lock can do — a PutItem conditioned
// on the key being absent or expired (by the client clock, in ms), then a
// DeleteItem conditioned on the owner.
func rawDynamoCycle(b *testing.B, ep string) {
	c := rawDynamo(b, ep)
	ctx := context.Background()
	pk := fmt.Sprintf("RAW#bench-%d-%d", os.Getpid(), dynamoRuns.Add(1))
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "METADATA"}}
	b.Cleanup(func() { c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(dynamoTable), Key: key}) })
	for b.Loop() {
		now := time.Now().UnixMilli()
		_, err := c.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(dynamoTable),
			Item: map[string]types.AttributeValue{
				"pk": key["pk"], "sk": key["sk"],
				"owner":       &types.AttributeValueMemberS{Value: "owner"},
				"expiresAtMs": &types.AttributeValueMemberN{Value: strconv.FormatInt(now+60_000, 10)},
			},
			ConditionExpression:       aws.String("attribute_not_exists(pk) OR expiresAtMs <= :now"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":now": &types.AttributeValueMemberN{Value: strconv.FormatInt(now, 10)}},
		})
		if err != nil {
			b.Fatal("raw acquire failed: ", err)
		}
		_, err = c.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName:                 aws.String(dynamoTable),
			Key:                       key,
			ConditionExpression:       aws.String("#o = :o"),
			ExpressionAttributeNames:  map[string]string{"#o": "owner"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": &types.AttributeValueMemberS{Value: "owner"}},
		})
		if err != nil {
			b.Fatal("raw release failed: ", err)
		}
	}
}

// rawDynamoShapedCycle: the raw pair on an item kept as warden keeps it,
// for its fencing tokens: an UpdateItem that takes the item when absent,
// released or expired, writing warden's attributes (owner, version,
// times, the TTL attribute, request id, the events index keys gpk/gsk and
// the list index key), then an UpdateItem that marks it released under
// the owner and version and an empty waiters' queue, also feeding the
// events index — the expressions
// warden sends, written here by hand. What it costs above the raw
// PutItem + DeleteItem is the layout's (a kept item, longer expressions,
// an index entry rewritten by each write), not warden's code.
func rawDynamoShapedCycle(b *testing.B, ep string) {
	c := rawDynamo(b, ep)
	ctx := context.Background()
	run := dynamoRuns.Add(1)
	pk := fmt.Sprintf("LOCK#shaped%d-%d:lock:k", os.Getpid(), run)
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "METADATA"}}
	b.Cleanup(func() { c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(dynamoTable), Key: key}) })
	n := func(v int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
	}
	str := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	names := func(ns ...string) map[string]string {
		m := map[string]string{}
		for _, x := range ns {
			m["#"+x] = x
		}
		return m
	}
	var seq int64
	for b.Loop() {
		t := time.Now()
		now := t.UnixMilli()
		seq++
		base := now*4096 + int64(t.Nanosecond()/1000%1000)*4096/1000
		_, err := c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(dynamoTable), Key: key,
			UpdateExpression: aws.String("SET #owner = :o, #version = :base1, #acquiredAt = :now, #expiresAtMs = :exp, #expiresAt = :ttl, " +
				"#updatedAt = :now, #req = :req, #lpk = :lpk, #gpk = :gpk, #gsk = :gsk REMOVE #releasedAt"),
			ConditionExpression: aws.String("(attribute_not_exists(#pk) OR attribute_exists(#releasedAt) OR #expiresAtMs <= :now) AND " +
				"(attribute_not_exists(#version) OR #version < :base1)"),
			ExpressionAttributeNames: names("owner", "version", "acquiredAt", "expiresAtMs", "expiresAt", "updatedAt", "req", "lpk", "gpk", "gsk", "releasedAt", "pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": str("owner"), ":base1": n(base), ":now": n(now), ":exp": n(now + 60_000),
				":ttl": n(now/1000 + 61), ":req": str(fmt.Sprintf("%016x", seq)), ":lpk": str(fmt.Sprintf("LOCK#shaped%d-%d:lock:", os.Getpid(), run)),
				":gpk": str(fmt.Sprintf("EVT#shaped%d-%d:lock:", os.Getpid(), run)), ":gsk": str(fmt.Sprintf("%015d#%016x#a%016x", now, seq, seq))},
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err != nil {
			b.Fatal("raw shaped acquire failed: ", err)
		}
		now = time.Now().UnixMilli()
		_, err = c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(dynamoTable), Key: key,
			UpdateExpression:         aws.String("SET #releasedAt = :now, #updatedAt = :now, #expiresAt = :ttl, #req = :req, #gpk = :gpk, #gsk = :gsk"),
			ConditionExpression:      aws.String("#owner = :o AND #version = :t AND attribute_not_exists(#releasedAt) AND attribute_not_exists(#waiters)"),
			ExpressionAttributeNames: names("releasedAt", "updatedAt", "expiresAt", "req", "gpk", "gsk", "owner", "version", "waiters"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": str("owner"), ":t": n(base), ":now": n(now), ":ttl": n(now / 1000),
				":req": str(fmt.Sprintf("%016xr", seq)), ":gpk": str(fmt.Sprintf("EVT#shaped%d-%d:lock:", os.Getpid(), run)),
				":gsk": str(fmt.Sprintf("%015d#%016x#r%016x", now, seq, seq))},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err != nil {
			b.Fatal("raw shaped release failed: ", err)
		}
	}
}

// rawDynamoGet: a strongly consistent GetItem with the expiry checked by
// the client, as the store reads.
func rawDynamoGet(b *testing.B, ep string) {
	c := rawDynamo(b, ep)
	ctx := context.Background()
	key := map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: fmt.Sprintf("RAW#cache-%d-%d", os.Getpid(), dynamoRuns.Add(1))},
		"sk": &types.AttributeValueMemberS{Value: "METADATA"},
	}
	item := map[string]types.AttributeValue{"pk": key["pk"], "sk": key["sk"], "data": &types.AttributeValueMemberB{Value: []byte("value")}}
	if _, err := c.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(dynamoTable), Item: item}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(dynamoTable), Key: key}) })
	for b.Loop() {
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(dynamoTable), Key: key, ConsistentRead: aws.Bool(true)})
		if err != nil || len(out.Item) == 0 {
			b.Fatal("raw get failed: ", err)
		}
		if v, ok := out.Item["expiresAtMs"].(*types.AttributeValueMemberN); ok {
			if ms, _ := strconv.ParseInt(v.Value, 10, 64); ms <= time.Now().UnixMilli() {
				b.Fatal("expired")
			}
		}
	}
}

// dynamoCacheGet: a hit through the store's checked cache primitive.
func dynamoCacheGet(b *testing.B, u string) {
	ctx := context.Background()
	c := open(b, u).Cache()
	if err := c.Set(ctx, "bench", []byte("value"), 0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Delete(ctx, "bench") })
	for b.Loop() {
		if _, ok, err := c.Get(ctx, "bench"); err != nil || !ok {
			b.Fatal(fmt.Sprint(ok), err)
		}
	}
}
