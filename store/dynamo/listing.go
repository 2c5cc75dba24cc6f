package dynamo

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden/driver"
)

// Listings (Keys, List, Tasks, Clear, Purge) read a namespace through the
// list index (ListIndex): every item warden writes carries lpk, the pk
// prefix of its kind and namespace (LOCK#<prefix>lock:, CB#…, CACHE#…,
// IDEM#…, CHECKPOINT#…), and the index is keyed by lpk and pk, keys only.
// A listing is a Query of one lpk, narrowed to the pattern's literal
// prefix by begins_with on pk, then a strongly consistent BatchGetItem of
// the items it needs (100 keys a request). The index is eventually
// consistent: an item written or deleted a moment before a listing may
// be missing from it or still in it (a deleted one is then absent from
// the BatchGetItem and skipped). Items without lpk — written by an older
// warden before Migrate's backfill, or replaced whole by a service using
// the go-go-scope layout — are not in the index and not listed. On a
// table without the index (made by an older warden, Migrate not run) the
// same listings Scan the whole table, as before.

// span is the items of one kind and namespace whose key starts with lit:
// those whose pk starts with lpk+lit.
type span struct{ lpk, lit string }

// need says what a listing needs of an item, by its key.
type need int

const (
	skip    need = iota // nothing
	keyOnly             // its key: each is called with a nil item
	load                // the item, read strongly consistently
)

// batchGetMax is the most keys one BatchGetItem reads.
const batchGetMax = 100

// parallelWrites is how many single-item writes Purge and the backfill
// keep in flight.
const parallelWrites = 8

// lpkSet is the SET clause that stamps an item with its list index key
// pfx (and binds :lpk in vals).
func lpkSet(pfx string, vals item) string {
	vals[":lpk"] = vS(pfx)
	return ", #lpk = :lpk"
}

// walk calls each for every item of spans that want does not skip: with
// the list index, one Query per span (every page) and a consistent
// BatchGetItem per 100 items to load; without it, one consistent Scan of
// the table filtered on the spans' prefixes. Items to load that are gone
// by the time they are read are not visited. The order is unspecified.
func (s *store) walk(ctx context.Context, op string, spans []span, want func(pk, sk string) need, each func(pk, sk string, it item) error) error {
	if !s.byIndex {
		pfxs := make([]string, len(spans))
		for i, sp := range spans {
			pfxs[i] = sp.lpk + sp.lit
		}
		return s.scan(ctx, op, func(it item) error {
			pk, sk := gS(it, aPk), gS(it, aSk)
			switch want(pk, sk) {
			case keyOnly:
				return each(pk, sk, nil)
			case load:
				return each(pk, sk, it)
			}
			return nil
		}, pfxs...)
	}
	var batch []item
	flush := func() error {
		keys := batch
		batch = nil
		return s.batchGet(ctx, op, keys, func(it item) error { return each(gS(it, aPk), gS(it, aSk), it) })
	}
	for _, sp := range spans {
		err := s.queryIndex(ctx, op, sp, func(pk, sk string) error {
			switch want(pk, sk) {
			case keyOnly:
				return each(pk, sk, nil)
			case load:
				batch = append(batch, itemKey(pk, sk))
				if len(batch) == batchGetMax {
					return flush()
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

// queryIndex reads the list index entries of sp (their table keys), page
// by page.
func (s *store) queryIndex(ctx context.Context, op string, sp span, each func(pk, sk string) error) error {
	cond := "#lpk = :lpk AND begins_with(#pk, :from)"
	names, values := exprArgs(item{":lpk": vS(sp.lpk), ":from": vS(sp.lpk + sp.lit)}, cond)
	in := &dynamodb.QueryInput{
		TableName:                 &s.table,
		IndexName:                 aws.String(ListIndex),
		KeyConditionExpression:    &cond,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}
	if s.pageLimit > 0 {
		in.Limit = aws.Int32(s.pageLimit)
	}
	return s.paged(ctx, op, func(start item) ([]item, item, error) {
		in.ExclusiveStartKey = start
		out, err := s.c.Query(ctx, in)
		if err != nil {
			return nil, nil, err
		}
		return out.Items, out.LastEvaluatedKey, nil
	}, eachItem(func(it item) error { return each(gS(it, aPk), gS(it, aSk)) }))
}

// batchGet reads items by key with strongly consistent BatchGetItem
// requests of up to 100 keys, resending unprocessed keys with a backoff
// bounded by ctx, and calls each for every item that exists.
func (s *store) batchGet(ctx context.Context, op string, keys []item, each func(item) error) error {
	for len(keys) > 0 {
		n := min(batchGetMax, len(keys))
		pending := types.KeysAndAttributes{Keys: keys[:n], ConsistentRead: aws.Bool(true)}
		keys = keys[n:]
		delay := 10 * time.Millisecond
		for len(pending.Keys) > 0 {
			out, err := s.c.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{
				RequestItems: map[string]types.KeysAndAttributes{s.table: pending},
			})
			if err != nil {
				return s.err(ctx, op, err)
			}
			for _, it := range out.Responses[s.table] {
				if err := each(it); err != nil {
					return err
				}
			}
			pending = out.UnprocessedKeys[s.table]
			if len(pending.Keys) > 0 {
				if err := pause(ctx, &delay); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// pause waits *delay (or until ctx ends) and doubles it, up to a second:
// the backoff before resending what a batch request left unprocessed.
func pause(ctx context.Context, delay *time.Duration) error {
	t := time.NewTimer(*delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	*delay = min(2**delay, time.Second)
	return nil
}

// inParallel calls f for every i in [0, n), parallelWrites at a time. The
// first error stops the calls not yet started (the context given to the
// others is cancelled) and is returned.
func inParallel(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range min(n, parallelWrites) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// kindTags are the pk prefixes of warden's item kindTags and their kind tags.
var kindTags = []struct{ kind, tag string }{
	{"LOCK#", driver.TagLock}, {"CB#", driver.TagCircuit}, {"CACHE#", driver.TagCache},
	{"IDEM#", "idem:"}, {"CHECKPOINT#", "checkpoint:"},
}

// lpkOf returns the list index key of an item of pk: its kind, its
// namespace's prefix (a name and its only ':', or none) and the kind tag.
// ok is false for a pk of no warden kind.
func lpkOf(pk string) (string, bool) {
	for _, k := range kindTags {
		rest, ok := strings.CutPrefix(pk, k.kind)
		if !ok {
			continue
		}
		if strings.HasPrefix(rest, k.tag) {
			return k.kind + k.tag, true
		}
		if i := strings.IndexByte(rest, ':'); i > 0 && strings.HasPrefix(rest[i+1:], k.tag) {
			return pk[:len(k.kind)+i+1+len(k.tag)], true
		}
		return "", false
	}
	return "", false
}

// backfill stamps lpk on the items of warden's kindTags that lack it (written
// before the list index existed, by an older warden, or by a service of
// the go-go-scope layout), so that listings find them: one Scan of the
// whole table (keys only), then one conditional UpdateItem per item
// found, 8 in flight. The condition keeps an item deleted meanwhile
// deleted. Idempotent: items that have lpk are not written.
func (s *store) backfill(ctx context.Context) error {
	vals := item{}
	var alts []string
	for i, k := range kindTags {
		v := ":k" + strconv.Itoa(i)
		vals[v] = vS(k.kind)
		alts = append(alts, "begins_with(#pk, "+v+")")
	}
	filter := "attribute_not_exists(#lpk) AND (" + strings.Join(alts, " OR ") + ")"
	proj := "#pk, #sk"
	names, values := exprArgs(vals, filter, proj)
	in := &dynamodb.ScanInput{
		TableName:                 &s.table,
		FilterExpression:          &filter,
		ProjectionExpression:      &proj,
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}
	if s.pageLimit > 0 {
		in.Limit = aws.Int32(s.pageLimit)
	}
	const op = "backfilling the list index"
	return s.paged(ctx, op, s.scanPages(ctx, in), func(page []item) error {
		type tag struct{ pk, sk, lpk string }
		var tags []tag
		for _, it := range page {
			pk := gS(it, aPk)
			if l, ok := lpkOf(pk); ok {
				tags = append(tags, tag{pk, gS(it, aSk), l})
			}
		}
		return inParallel(ctx, len(tags), func(ctx context.Context, i int) error {
			t := tags[i]
			_, _, _, err := s.update(ctx, op, t.pk, t.sk, "SET #lpk = :lpk",
				"attribute_exists(#pk) AND attribute_not_exists(#lpk)", item{":lpk": vS(t.lpk)}, types.ReturnValueNone)
			return err
		})
	})
}
