package dynamo

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// Attribute names. Expressions spell them as #name (every name goes
// through ExpressionAttributeNames, so reserved words need no care).
const (
	aPk         = "pk"
	aSk         = "sk"
	aGpk        = "gpk" // events index partition key: EVT#<prefix><kind tag>
	aGsk        = "gsk" // events index sort key: zero-padded ms of the write, '#', process sequence, '#', request id
	aLpk        = "lpk" // list index partition key: the pk prefix of the item's kind and namespace (KIND#<prefix><tag>)
	aTTL        = "expiresAt"
	aExp        = "expiresAtMs"
	aOwner      = "owner"
	aVersion    = "version"
	aData       = "data"
	aAcq        = "acquiredAt"
	aRel        = "releasedAt"
	aUpd        = "updatedAt"
	aReq        = "req"
	aHandoff    = "handoff" // lock items: set by a release that handed the key to a waiter, until a refresh or acquire takes it
	aState      = "state"
	aFail       = "failures"
	aLastF      = "lastFailure"
	aLastS      = "lastSuccess"
	aOpened     = "openedAt"
	aProbe      = "probeOwner"
	aProbeUntil = "probeUntil"
	aStatus     = "status"
	aFp         = "fingerprint"
	aCreated    = "createdAt"
	aFence      = "fence"
	aSeq        = "seq"
	aProgress   = "progress"
	aTime       = "time"
	aEta        = "eta"
	aToken      = "token"
)

// metaSK is the sort key of every item but checkpoints.
const metaSK = "METADATA"

// fenceSK is the sort key of a task's fence item, next to its checkpoints.
const fenceSK = "FENCE"

type item = map[string]types.AttributeValue

func vS(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
func vN(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}
func vF(v float64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatFloat(v, 'g', -1, 64)}
}
func vB(v []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: v} }

func gS(it item, name string) string {
	if v, ok := it[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func has(it item, name string) bool {
	v, ok := it[name]
	if !ok {
		return false
	}
	_, null := v.(*types.AttributeValueMemberNULL)
	return !null
}

func gN(it item, name string) int64 {
	if v, ok := it[name].(*types.AttributeValueMemberN); ok {
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err == nil {
			return n
		}
		f, err := strconv.ParseFloat(v.Value, 64)
		if err == nil {
			return int64(f)
		}
	}
	return 0
}

func gF(it item, name string) float64 {
	if v, ok := it[name].(*types.AttributeValueMemberN); ok {
		f, _ := strconv.ParseFloat(v.Value, 64)
		return f
	}
	return 0
}

// gB reads a binary attribute; an absent one is an empty value (empty
// values are stored without the attribute).
func gB(it item, name string) []byte {
	if v, ok := it[name].(*types.AttributeValueMemberB); ok && v.Value != nil {
		return v.Value
	}
	return []byte{}
}

func itemKey(pk, sk string) item { return item{aPk: vS(pk), aSk: vS(sk)} }

var (
	nameRe  = regexp.MustCompile(`#[A-Za-z0-9_]+`)
	valueRe = regexp.MustCompile(`:[A-Za-z0-9_]+`)
)

// exprArgs builds ExpressionAttributeNames from the #names used in exprs
// and keeps the values exprs use (DynamoDB refuses unused ones).
func exprArgs(vals item, exprs ...string) (map[string]string, item) {
	names := map[string]string{}
	used := item{}
	for _, e := range exprs {
		for _, n := range nameRe.FindAllString(e, -1) {
			names[n] = n[1:]
		}
		for _, v := range valueRe.FindAllString(e, -1) {
			if x, ok := vals[v]; ok {
				used[v] = x
			}
		}
	}
	if len(names) == 0 {
		names = nil
	}
	if len(used) == 0 {
		used = nil
	}
	return names, used
}

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// reqID is a random id stamped on conditional writes (attribute req), so
// that a write the SDK retried after it had applied (its reply lost) is
// recognised when the retry fails its condition.
func reqID() string {
	var b [8]byte
	u := rand.Uint64()
	for i := range b {
		b[i] = byte(u >> (8 * i))
	}
	return hex.EncodeToString(b[:])
}

// ccf returns the condition failure in err, if that is what it is.
func ccf(err error) (*types.ConditionalCheckFailedException, bool) {
	var c *types.ConditionalCheckFailedException
	if errors.As(err, &c) {
		return c, true
	}
	return nil, false
}

// update runs one UpdateItem. A failed condition is not an error: it
// returns failed=true with the item as it was when the endpoint returns
// it (ReturnValuesOnConditionCheckFailure ALL_OLD), else old=nil.
func (s *store) update(ctx context.Context, op, pk, sk, upd, cond string, vals item, ret types.ReturnValue) (attrs item, failed bool, old item, err error) {
	return s.updateNames(ctx, op, pk, sk, upd, cond, nil, vals, ret)
}

// updateNames is update with expression names of the caller's (extra:
// placeholder → attribute name or map key, for names that are data, such
// as a waiter's owner in a lock item's queue).
func (s *store) updateNames(ctx context.Context, op, pk, sk, upd, cond string, extra map[string]string, vals item, ret types.ReturnValue) (attrs item, failed bool, old item, err error) {
	names, values := exprArgs(vals, upd, cond)
	if names == nil && len(extra) > 0 {
		names = map[string]string{}
	}
	for n, v := range extra {
		names[n] = v
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                 &s.table,
		Key:                       itemKey(pk, sk),
		UpdateExpression:          &upd,
		ConditionExpression:       strp(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ReturnValues:              ret,
	}
	if cond != "" {
		in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	}
	out, err := s.c.UpdateItem(ctx, in)
	if c, ok := ccf(err); ok {
		return nil, true, c.Item, nil
	}
	if err != nil {
		return nil, false, nil, s.err(ctx, op, err)
	}
	return out.Attributes, false, nil, nil
}

// put runs one PutItem; failed=true when cond did not hold.
func (s *store) put(ctx context.Context, op string, it item, cond string, vals item) (failed bool, err error) {
	names, values := exprArgs(vals, cond)
	_, err = s.c.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 &s.table,
		Item:                      it,
		ConditionExpression:       strp(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	})
	if _, ok := ccf(err); ok {
		return true, nil
	}
	return false, s.err(ctx, op, err)
}

// del runs one DeleteItem and returns the deleted item (nil if there was
// none); failed=true when cond did not hold.
func (s *store) del(ctx context.Context, op, pk, sk, cond string, vals item) (old item, failed bool, err error) {
	names, values := exprArgs(vals, cond)
	out, err := s.c.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 &s.table,
		Key:                       itemKey(pk, sk),
		ConditionExpression:       strp(cond),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ReturnValues:              types.ReturnValueAllOld,
	})
	if _, ok := ccf(err); ok {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, s.err(ctx, op, err)
	}
	return out.Attributes, false, nil
}

// get reads one item with a strongly consistent read; nil if absent.
func (s *store) get(ctx context.Context, op, pk, sk string) (item, error) {
	out, err := s.c.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: &s.table, Key: itemKey(pk, sk), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, s.err(ctx, op, err)
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// scan reads every item whose pk begins with one of pfxs, page by page
// (a Scan of the whole table with a filter: O(table)), calling each for
// every item.
func (s *store) scan(ctx context.Context, op string, each func(item) error, pfxs ...string) error {
	vals := item{}
	cond := ""
	for i, p := range pfxs {
		v := ":p" + strconv.Itoa(i)
		vals[v] = vS(p)
		if i > 0 {
			cond += " OR "
		}
		cond += "begins_with(#pk, " + v + ")"
	}
	names, values := exprArgs(vals, cond)
	in := &dynamodb.ScanInput{
		TableName:                 &s.table,
		FilterExpression:          &cond,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ConsistentRead:            aws.Bool(true),
	}
	if s.pageLimit > 0 {
		in.Limit = aws.Int32(s.pageLimit)
	}
	return s.paged(ctx, op, s.scanPages(ctx, in), eachItem(each))
}

// scanPages reads the pages of in for paged.
func (s *store) scanPages(ctx context.Context, in *dynamodb.ScanInput) func(start item) ([]item, item, error) {
	return func(start item) ([]item, item, error) {
		in.ExclusiveStartKey = start
		out, err := s.c.Scan(ctx, in)
		if err != nil {
			return nil, nil, err
		}
		return out.Items, out.LastEvaluatedKey, nil
	}
}

// eachItem calls each for every item of a page, for paged.
func eachItem(each func(item) error) func(page []item) error {
	return func(page []item) error {
		for _, it := range page {
			if err := each(it); err != nil {
				return err
			}
		}
		return nil
	}
}

// paged reads pages with read, from the start (start nil) and then from
// each page's last evaluated key until a page has none, calling each for
// every page.
func (s *store) paged(ctx context.Context, op string, read func(start item) (page []item, last item, err error), each func(page []item) error) error {
	var start item
	for {
		page, last, err := read(start)
		if err != nil {
			return s.err(ctx, op, err)
		}
		if err := each(page); err != nil {
			return err
		}
		if len(last) == 0 {
			return nil
		}
		start = last
	}
}

// query reads a partition's items with sk in [from, to], in sort key order
// (or reversed), page by page, until each returns false.
func (s *store) query(ctx context.Context, op, pk, from, to string, forward bool, limit int32, each func(item) (bool, error)) error {
	cond := "#pk = :pk AND #sk BETWEEN :from AND :to"
	names, values := exprArgs(item{":pk": vS(pk), ":from": vS(from), ":to": vS(to)}, cond)
	in := &dynamodb.QueryInput{
		TableName:                 &s.table,
		KeyConditionExpression:    &cond,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
		ConsistentRead:            aws.Bool(true),
		ScanIndexForward:          aws.Bool(forward),
	}
	if s.pageLimit > 0 {
		in.Limit = aws.Int32(s.pageLimit)
	}
	if limit > 0 {
		in.Limit = aws.Int32(limit)
	}
	for {
		out, err := s.c.Query(ctx, in)
		if err != nil {
			return s.err(ctx, op, err)
		}
		for _, it := range out.Items {
			more, err := each(it)
			if err != nil || !more {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// deleteKeys deletes items by key with BatchWriteItem, 25 at a time,
// resending unprocessed ones with a backoff bounded by ctx.
func (s *store) deleteKeys(ctx context.Context, op string, keys []item) error {
	for len(keys) > 0 {
		n := min(25, len(keys))
		var reqs []types.WriteRequest
		for _, k := range keys[:n] {
			reqs = append(reqs, types.WriteRequest{DeleteRequest: &types.DeleteRequest{Key: k}})
		}
		keys = keys[n:]
		delay := 10 * time.Millisecond
		for len(reqs) > 0 {
			out, err := s.c.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{
				RequestItems: map[string][]types.WriteRequest{s.table: reqs},
			})
			if err != nil {
				return s.err(ctx, op, err)
			}
			reqs = out.UnprocessedItems[s.table]
			if len(reqs) > 0 {
				if err := pause(ctx, &delay); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// evKeys are the events index attributes of a lock or circuit write at
// now: SET clauses and values, or nothing when the store writes no
// events.
func (s *store) evSet(gpk string, now int64, req string, vals item) string {
	if !s.events {
		return ""
	}
	vals[":gpk"] = vS(gpk)
	vals[":gsk"] = vS(gskOf(now, fmt.Sprintf("%016x#%s", evSeq.Add(1), req)))
	return ", #gpk = :gpk, #gsk = :gsk"
}

// evSeq numbers this process's event writes. It follows the time in the
// events sort key, so that writes this process made in one millisecond
// (a release, then the next acquire of another key) are read back in the
// order they were made, not in the order of their random request ids.
var evSeq atomic.Uint64

// gskOf is the events index sort key of a write at ms by request req:
// the zero-padded time, so that the index sorts by it.
func gskOf(ms int64, req string) string { return fmt.Sprintf("%015d#%s", ms, req) }

// list reads the items of kind pfx (sk METADATA) whose key may match
// pattern: one consistent GetItem for a pattern without wildcards, else
// the items of the namespace whose key starts with the pattern's literal
// prefix and matches it (see walk). The caller still matches every key.
func (s *store) list(ctx context.Context, op, pfx string, pattern driver.Pattern, each func(item) error) error {
	if lit, ok := pattern.Literal(); ok {
		it, err := s.get(ctx, op, pfx+lit, metaSK)
		if err != nil || it == nil {
			return err
		}
		return each(it)
	}
	want := func(pk, sk string) need {
		k, ok := cutPrefix(pk, pfx)
		if ok && sk == metaSK && pattern.Match(k) {
			return load
		}
		return skip
	}
	return s.walk(ctx, op, []span{{pfx, pattern.Prefix()}}, want, func(_, _ string, it item) error { return each(it) })
}
