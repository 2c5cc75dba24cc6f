package dynamo

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/warden-go/warden"
	"github.com/warden-go/warden/driver"
)

// Defaults of [RecordOptions].
const (
	// DefaultRecordPartitionKey is the partition key attribute of a
	// record table when RecordOptions.PartitionKey is empty.
	DefaultRecordPartitionKey = "id"
	// DefaultUntilAttr, DefaultOwnerAttr and DefaultTokenAttr name the
	// lock attributes: the holding's expiry (Number, Unix milliseconds),
	// the holder (String) and the last fencing token (Number).
	DefaultUntilAttr = "lockedUntil"
	DefaultOwnerAttr = "lockedBy"
	DefaultTokenAttr = "lockToken"
	// DefaultClaimPageSize is the least Limit of a Claim's first Query
	// page (RecordOptions.ClaimPageSize).
	DefaultClaimPageSize = 10
	// MaxClaimPageSize is the largest Limit of a Claim's Query page
	// (DynamoDB also ends a page at 1 MB read).
	MaxClaimPageSize = 10000
	// DefaultClaimTries is how many candidates one Claim may lose to
	// other claimers before it gives up with an error.
	DefaultClaimTries = 100
	// DefaultClaimResume is how long Claims resume where the last one
	// found its record (RecordOptions.ClaimResume).
	DefaultClaimResume = time.Second
)

// recordLockTries bounds Lock's loop: a refused update followed by a read
// that shows the record free (released in between) tries again.
const recordLockTries = 10

// Key size limits of DynamoDB (bytes of a string or binary key value).
const (
	maxPartitionKeyBytes = 2048
	maxSortKeyBytes      = 1024
)

// wdnPrefix starts every expression placeholder the record driver adds to
// a request (#wdn_by, :wdn_now, …); a RecordQuery may not use it.
const wdnPrefix = "wdn_"

// Placeholders of the record driver's expressions.
const (
	phPK    = "#wdn_pk"
	phSK    = "#wdn_sk"
	phBy    = "#wdn_by"
	phUntil = "#wdn_until"
	phTok   = "#wdn_tok"
	phNow   = ":wdn_now"
	phOwner = ":wdn_owner"
	phNewU  = ":wdn_until"
	phOne   = ":wdn_one"
	phToken = ":wdn_token"
)

// Expressions of the record driver.
const (
	// recFree: the record has no live holding by the client's clock.
	recFree = "(attribute_not_exists(" + phBy + ") OR attribute_not_exists(" + phUntil + ") OR " + phUntil + " <= " + phNow + ")"
	// recTakeCond: the record exists (UpdateItem never creates it) and is free.
	recTakeCond = "attribute_exists(" + phPK + ") AND " + recFree
	recTake     = "SET " + phBy + " = " + phOwner + ", " + phUntil + " = " + phNewU + " ADD " + phTok + " " + phOne
	recOurs     = phBy + " = " + phOwner + " AND " + phTok + " = " + phToken
	// recExtCond also keeps an extension from moving the expiry earlier
	// (one that reaches the table after a later, longer one): it then
	// fails its condition and Extend reads the holding back.
	recExtCond = recOurs + " AND " + phUntil + " > " + phNow + " AND " + phUntil + " <= " + phNewU
	recExtend  = "SET " + phUntil + " = " + phNewU
	recClear   = "REMOVE " + phBy + ", " + phUntil
	recExists  = "attribute_exists(" + phPK + ")"
	recLive    = "attribute_exists(" + phBy + ") AND " + phUntil + " > " + phNow
)

// RecordOptions configure a RecordTable. nil or the zero value gives the
// documented defaults.
type RecordOptions struct {
	// PartitionKey is the table's partition key attribute. "":
	// DefaultRecordPartitionKey ("id").
	PartitionKey string
	// SortKey is the table's sort key attribute, "" for a table with a
	// partition key only. With a sort key, ids are RecordKey values.
	SortKey string
	// UntilAttr, OwnerAttr and TokenAttr name the lock attributes. "":
	// lockedUntil (Number, Unix ms), lockedBy (String), lockToken
	// (Number).
	UntilAttr, OwnerAttr, TokenAttr string
	// ListIndex names an optional sparse global secondary index keyed by
	// OwnerAttr (so that it holds only the records with a holder) that
	// List scans instead of the table. "": List scans the table.
	ListIndex string
	// ClaimPageSize is the least Limit of a Claim's first Query page: a
	// Claim from the query's start asks for a quarter more than the last
	// one read past held records, a resumed Claim for ClaimPageSize;
	// further pages of one Claim double it, up to MaxClaimPageSize. 0:
	// DefaultClaimPageSize.
	ClaimPageSize int32
	// ClaimTries is how many candidates one Claim may lose (another
	// claimer updated them first) before it gives up with an error. 0:
	// DefaultClaimTries.
	ClaimTries int
	// ClaimResume is how long a Claim may resume its Query where the
	// RecordTable's previous Claim of the same query found its record,
	// instead of reading from the start past every held record again:
	// the time since the last Claim of that query that read from the
	// start. Records ahead of that position that become claimable
	// meanwhile (released, expired, inserted, or missed by an eventually
	// consistent index) are claimed after the ones behind it, at most
	// ClaimResume late, or as soon as the Query runs out behind it — a
	// Claim reports nothing to claim only after reading from the start.
	// 0: DefaultClaimResume (1 s). Negative: never resume; every Claim
	// reads from the start, in strict order, at a cost that grows with
	// the number of held records ahead of the first free one.
	ClaimResume time.Duration
}

// RecordKey is the id of a record in a table with a sort key: the values
// of the partition key and the sort key, each a string, an integer or a
// []byte (DynamoDB types S, N, B), as the table defines them.
type RecordKey struct {
	PK any
	SK any
}

// RecordQuery is Claim's filter on DynamoDB: a Query of the table or of
// one of its indexes, in the user's own expressions with the values bound
// through Values — never concatenate a value into an expression.
//
// Claim reads the candidates with a Query (KeyCondition, Filter, in the
// index's sort key order) to which it adds its own filter "not locked",
// then takes the first it can with a conditional UpdateItem whose
// condition repeats KeyCondition and Filter: a record that stopped
// matching since the Query read it (an index is eventually consistent) is
// not claimed. KeyCondition must therefore also be valid as a condition
// expression on the table's items (every key condition is: =, <, <=, >,
// >=, BETWEEN, begins_with over attributes).
//
// A global secondary index must project the lock attributes (lockedBy
// and lockedUntil: projection INCLUDE or ALL), or Claim's filter could
// not see them: Claim refuses such an index. See docs/backends.md for
// what a Claim reads and costs.
type RecordQuery struct {
	// IndexName is the index to query; "": the table.
	IndexName string
	// KeyCondition is the Query's key condition expression (required),
	// such as "#s = :s".
	KeyCondition string
	// Filter is an optional filter expression over the items' attributes.
	Filter string
	// Names and Values are the expression attribute names and values of
	// KeyCondition and Filter. Placeholders starting with "wdn_" (#wdn_…,
	// :wdn_…) are the driver's own and refused.
	Names  map[string]string
	Values map[string]types.AttributeValue
	// Descending claims in descending sort key order; the zero value
	// claims in ascending order.
	Descending bool
	// ConsistentRead makes the Query strongly consistent (a table or a
	// local secondary index only; global secondary indexes refuse it).
	ConsistentRead bool
}

// RecordTable is the DynamoDB driver of package recordlock: locks kept in
// three attributes of the items of the user's own table (see
// recordlock.New). The client's clock decides expiry: DynamoDB has none
// in its expressions. Its methods are safe for concurrent use.
//
// Ids: in a table with a partition key only, a string, an integer (any Go
// integer type up to int64's range) or a []byte, matching the key's type
// S, N or B; in a table with a sort key, a RecordKey. Returned ids are
// normalised: string, int64, []byte, or a RecordKey of those.
type RecordTable struct {
	c              *dynamodb.Client
	table          string
	pk, sk         string
	until, by, tok string
	listIndex      string
	page           int32
	tries          int

	resume time.Duration

	hmu     sync.Mutex
	hints   map[string]claimHint // by query (claimKey)
	idxKeys map[string][]string  // by index: its key attributes but the table's
}

var _ driver.Records[RecordQuery] = (*RecordTable)(nil)

// Records returns the record-lock driver over table, whose items are the
// user's own records, reached with the caller's client (which stays the
// caller's). It does no I/O; Migrate checks the table.
func Records(client *dynamodb.Client, table string, opts *RecordOptions) (*RecordTable, error) {
	if client == nil {
		return nil, fmt.Errorf("dynamo: nil client: %w", warden.ErrInvalidArgument)
	}
	if !tableRe.MatchString(table) {
		return nil, fmt.Errorf("dynamo: %q is not a DynamoDB table name: %w", table, warden.ErrInvalidArgument)
	}
	var o RecordOptions
	if opts != nil {
		o = *opts
	}
	r := &RecordTable{
		c: client, table: table,
		pk: or(o.PartitionKey, DefaultRecordPartitionKey), sk: o.SortKey,
		until: or(o.UntilAttr, DefaultUntilAttr), by: or(o.OwnerAttr, DefaultOwnerAttr), tok: or(o.TokenAttr, DefaultTokenAttr),
		listIndex: o.ListIndex,
		page:      or(o.ClaimPageSize, DefaultClaimPageSize),
		tries:     or(o.ClaimTries, DefaultClaimTries),
		resume:    or(o.ClaimResume, DefaultClaimResume),
	}
	if o.ClaimPageSize < 0 || o.ClaimPageSize > MaxClaimPageSize || o.ClaimTries < 0 {
		return nil, fmt.Errorf("dynamo: ClaimPageSize must be 0…%d and ClaimTries not negative: %w", MaxClaimPageSize, warden.ErrInvalidArgument)
	}
	if o.ListIndex != "" && !tableRe.MatchString(o.ListIndex) {
		return nil, fmt.Errorf("dynamo: ListIndex %q is not an index name: %w", o.ListIndex, warden.ErrInvalidArgument)
	}
	attrs := []string{r.pk, r.until, r.by, r.tok}
	if r.sk != "" {
		attrs = append(attrs, r.sk)
	}
	for i, a := range attrs {
		if len(a) > 255 || !utf8.ValidString(a) {
			return nil, fmt.Errorf("dynamo: attribute name %.40q is over 255 bytes or not UTF-8: %w", a, warden.ErrInvalidArgument)
		}
		if slices.Contains(attrs[:i], a) {
			return nil, fmt.Errorf("dynamo: attribute %q named twice in RecordOptions (keys and lock attributes must differ): %w", a, warden.ErrInvalidArgument)
		}
	}
	return r, nil
}

// Backend returns "dynamodb".
func (r *RecordTable) Backend() string { return "dynamodb" }

// Table returns the table's name.
func (r *RecordTable) Table() string { return r.table }

// showRecordID formats an id for messages, cut short.
func showRecordID(id any) string {
	var s string
	switch v := id.(type) {
	case string:
		if len(v) > 64 {
			v = v[:61] + "..."
		}
		s = strconv.Quote(v)
	case []byte:
		if len(v) > 32 {
			s = fmt.Sprintf("0x%x...", v[:29])
		} else {
			s = fmt.Sprintf("0x%x", v)
		}
	case RecordKey:
		s = "{" + showRecordID(v.PK) + ", " + showRecordID(v.SK) + "}"
	default:
		s = fmt.Sprintf("%v", id)
	}
	if len(s) > 150 {
		s = s[:147] + "..."
	}
	return s
}

// keyValue converts one key value to an attribute value of at most max
// bytes.
func keyValue(v any, max int) (types.AttributeValue, string) {
	var n int64
	switch x := v.(type) {
	case string:
		if x == "" || len(x) > max || !utf8.ValidString(x) {
			return nil, fmt.Sprintf("a string key must be non-empty UTF-8 of at most %d bytes", max)
		}
		return vS(x), ""
	case []byte:
		if len(x) == 0 || len(x) > max {
			return nil, fmt.Sprintf("a binary key must be 1…%d bytes", max)
		}
		return vB(bytes.Clone(x)), ""
	case int:
		n = int64(x)
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint:
		if uint64(x) > math.MaxInt64 {
			return nil, "an integer key must be within int64's range"
		}
		n = int64(x)
	case uint64:
		if x > math.MaxInt64 {
			return nil, "an integer key must be within int64's range"
		}
		n = int64(x)
	default:
		return nil, fmt.Sprintf("%T is not a key type (string, integer, []byte)", v)
	}
	return vN(n), ""
}

// key returns the item key of id.
func (r *RecordTable) key(id any) (item, error) {
	bad := func(why string) error {
		return fmt.Errorf("dynamo: record id %s of %s: %s: %w", showRecordID(id), r.table, why, warden.ErrInvalidArgument)
	}
	if r.sk == "" {
		if _, ok := id.(RecordKey); ok {
			return nil, bad("the table has no sort key (RecordOptions.SortKey): ids are strings, integers or []byte")
		}
		v, why := keyValue(id, maxPartitionKeyBytes)
		if v == nil {
			return nil, bad(why)
		}
		return item{r.pk: v}, nil
	}
	k, ok := id.(RecordKey)
	if !ok {
		return nil, bad(fmt.Sprintf("the table has a sort key (%s): ids are dynamo.RecordKey values", r.sk))
	}
	pv, why := keyValue(k.PK, maxPartitionKeyBytes)
	if pv == nil {
		return nil, bad("partition key: " + why)
	}
	sv, why := keyValue(k.SK, maxSortKeyBytes)
	if sv == nil {
		return nil, bad("sort key: " + why)
	}
	return item{r.pk: pv, r.sk: sv}, nil
}

// CheckID accepts the ids of the table's key schema (see RecordTable);
// others are refused with an error wrapping warden.ErrInvalidArgument.
func (r *RecordTable) CheckID(id any) error {
	_, err := r.key(id)
	return err
}

// keyID turns one key attribute back into an id value.
func keyID(v types.AttributeValue) (any, error) {
	switch x := v.(type) {
	case *types.AttributeValueMemberS:
		return x.Value, nil
	case *types.AttributeValueMemberB:
		return x.Value, nil
	case *types.AttributeValueMemberN:
		n, err := strconv.ParseInt(x.Value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("the number key %s is not an int64, which this driver's ids cannot hold", x.Value)
		}
		return n, nil
	}
	return nil, fmt.Errorf("key attribute of type %T", v)
}

// idOf returns the id of an item (one that holds the key attributes).
func (r *RecordTable) idOf(it item) (any, error) {
	pv, ok := it[r.pk]
	if !ok {
		return nil, fmt.Errorf("dynamo: an item of %s without its partition key %s", r.table, r.pk)
	}
	p, err := keyID(pv)
	if err != nil {
		return nil, fmt.Errorf("dynamo: %s: %s: %w", r.table, r.pk, err)
	}
	if r.sk == "" {
		return p, nil
	}
	sv, ok := it[r.sk]
	if !ok {
		return nil, fmt.Errorf("dynamo: an item of %s without its sort key %s", r.table, r.sk)
	}
	s, err := keyID(sv)
	if err != nil {
		return nil, fmt.Errorf("dynamo: %s: %s: %w", r.table, r.sk, err)
	}
	return RecordKey{PK: p, SK: s}, nil
}

// numAttr reads a Number lock attribute (absent or NULL: 0).
func (r *RecordTable) numAttr(it item, name string) (int64, error) {
	v, ok := it[name]
	if !ok {
		return 0, nil
	}
	switch x := v.(type) {
	case *types.AttributeValueMemberNULL:
		return 0, nil
	case *types.AttributeValueMemberN:
		if n, err := strconv.ParseInt(x.Value, 10, 64); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(x.Value, 64); err == nil && f >= math.MinInt64 && f <= math.MaxInt64 {
			return int64(f), nil
		}
		return 0, fmt.Errorf("dynamo: %s: attribute %s is %s, not an int64", r.table, name, x.Value)
	}
	return 0, fmt.Errorf("dynamo: %s: lock attribute %s is a %T, not a Number", r.table, name, v)
}

// state reads the lock state of an item at now (ms).
func (r *RecordTable) state(id any, it item, now int64) (driver.RecordLock, error) {
	rec := driver.RecordLock{ID: id, Now: time.UnixMilli(now).UTC()}
	switch v := it[r.by].(type) {
	case nil, *types.AttributeValueMemberNULL:
	case *types.AttributeValueMemberS:
		rec.Owner = v.Value
	default:
		return rec, fmt.Errorf("dynamo: %s: lock attribute %s is a %T, not a String", r.table, r.by, v)
	}
	until, err := r.numAttr(it, r.until)
	if err != nil {
		return rec, err
	}
	rec.Until = msTime(until)
	if rec.Token, err = r.numAttr(it, r.tok); err != nil {
		return rec, err
	}
	return rec, nil
}

func (r *RecordTable) err(ctx context.Context, op string, id any, err error) error {
	if err == nil {
		return nil
	}
	if e := ctx.Err(); e != nil {
		return e
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	what := r.table
	if id != nil {
		what += " " + showRecordID(id)
	}
	return fmt.Errorf("dynamo: record %s of %s: %w", op, what, err)
}

// names returns the attribute names of the driver's placeholders ph.
func (r *RecordTable) names(ph ...string) map[string]string {
	m := make(map[string]string, len(ph))
	for _, p := range ph {
		switch p {
		case phPK:
			m[p] = r.pk
		case phSK:
			m[p] = r.sk
		case phBy:
			m[p] = r.by
		case phUntil:
			m[p] = r.until
		case phTok:
			m[p] = r.tok
		}
	}
	return m
}

// keyProjection is the projection of the key and lock attributes, and its
// placeholders.
func (r *RecordTable) keyProjection(lock ...string) (string, []string) {
	ph := []string{phPK}
	if r.sk != "" {
		ph = append(ph, phSK)
	}
	ph = append(ph, lock...)
	return strings.Join(ph, ", "), ph
}

// take is the conditional update of Lock and Claim: the record exists and
// is free at now (and matches cond, if any) → holder owner, expiry
// now + d, token + 1. ok false: the condition failed.
func (r *RecordTable) take(ctx context.Context, key item, id any, owner string, d time.Duration, cond string, names map[string]string, vals item) (rec driver.RecordLock, ok bool, err error) {
	now := nowMs()
	until := now + d.Milliseconds()
	c := recTakeCond
	if cond != "" {
		c += " AND " + cond
	}
	n := r.names(phPK, phBy, phUntil, phTok)
	maps.Copy(n, names)
	v := item{phNow: vN(now), phOwner: vS(owner), phNewU: vN(until), phOne: vN(1)}
	maps.Copy(v, vals)
	out, err := r.c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &r.table,
		Key:                       key,
		UpdateExpression:          aws.String(recTake),
		ConditionExpression:       &c,
		ExpressionAttributeNames:  n,
		ExpressionAttributeValues: v,
		ReturnValues:              types.ReturnValueUpdatedNew,
	})
	if _, failed := ccf(err); failed {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, r.err(ctx, "lock", id, err)
	}
	rec, err = r.state(id, out.Attributes, now)
	return rec, err == nil, err
}

// get reads the record's lock state: one strongly consistent GetItem of
// the key and lock attributes.
func (r *RecordTable) get(ctx context.Context, key item, id any) (driver.RecordLock, bool, error) {
	proj, ph := r.keyProjection(phBy, phUntil, phTok)
	out, err := r.c.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                &r.table,
		Key:                      key,
		ConsistentRead:           aws.Bool(true),
		ProjectionExpression:     &proj,
		ExpressionAttributeNames: r.names(ph...),
	})
	if err != nil {
		return driver.RecordLock{}, false, r.err(ctx, "read", id, err)
	}
	if len(out.Item) == 0 {
		return driver.RecordLock{}, false, nil
	}
	rec, err := r.state(id, out.Item, nowMs())
	return rec, err == nil, err
}

// Lock implements driver.Records: one conditional UpdateItem. When its
// condition fails, a strongly consistent GetItem tells a missing record
// from a locked one (DynamoDB's ReturnValuesOnConditionCheckFailure is
// not used: dynalite does not support it, and one code path serves every
// endpoint). A record released between the two is tried again, at most
// 10 times.
func (r *RecordTable) Lock(ctx context.Context, id any, owner string, d time.Duration) (driver.RecordLock, bool, bool, error) {
	key, err := r.key(id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	nid, err := r.idOf(key)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	for range recordLockTries {
		rec, ok, err := r.take(ctx, key, nid, owner, d, "", nil, nil)
		if err != nil || ok {
			return rec, err == nil, ok, err
		}
		cur, found, err := r.get(ctx, key, nid)
		if err != nil || !found {
			return driver.RecordLock{}, false, false, err
		}
		if cur.Live() {
			return cur, true, false, nil
		}
	}
	return driver.RecordLock{}, false, false, &contendedError{op: "record lock", key: r.table + " " + showRecordID(nid), tries: recordLockTries}
}

// Extend implements driver.Records: one conditional UpdateItem (holder,
// token, expiry after now), and a GetItem when it is refused.
func (r *RecordTable) Extend(ctx context.Context, id any, owner string, token int64, d time.Duration) (driver.RecordLock, bool, bool, error) {
	key, err := r.key(id)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	nid, err := r.idOf(key)
	if err != nil {
		return driver.RecordLock{}, false, false, err
	}
	now := nowMs()
	until := now + d.Milliseconds()
	_, err = r.c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &r.table,
		Key:                       key,
		UpdateExpression:          aws.String(recExtend),
		ConditionExpression:       aws.String(recExtCond),
		ExpressionAttributeNames:  r.names(phBy, phUntil, phTok),
		ExpressionAttributeValues: item{phOwner: vS(owner), phToken: vN(token), phNow: vN(now), phNewU: vN(until)},
	})
	if _, failed := ccf(err); failed {
		cur, found, err := r.get(ctx, key, nid)
		if err == nil && found && cur.Owner == owner && cur.Token == token && cur.Live() && !cur.Until.Before(msTime(until)) {
			// Still ours, and already held beyond now + d: the
			// extension has nothing to do (the expiry never moves
			// earlier).
			return cur, true, true, nil
		}
		return cur, found, false, err
	}
	if err != nil {
		return driver.RecordLock{}, false, false, r.err(ctx, "extend", nid, err)
	}
	return driver.RecordLock{ID: nid, Owner: owner, Until: msTime(until), Token: token, Now: msTime(now)}, true, true, nil
}

// Release implements driver.Records: one conditional UpdateItem that
// removes the holder and expiry (the token stays).
func (r *RecordTable) Release(ctx context.Context, id any, owner string, token int64) (bool, error) {
	key, err := r.key(id)
	if err != nil {
		return false, err
	}
	_, err = r.c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &r.table,
		Key:                       key,
		UpdateExpression:          aws.String(recClear),
		ConditionExpression:       aws.String(recOurs),
		ExpressionAttributeNames:  r.names(phBy, phUntil, phTok),
		ExpressionAttributeValues: item{phOwner: vS(owner), phToken: vN(token)},
	})
	if _, failed := ccf(err); failed {
		return false, nil
	}
	if err != nil {
		return false, r.err(ctx, "release", id, err)
	}
	return true, nil
}

// ForceRelease implements driver.Records: one UpdateItem (conditioned on
// the record's existence) that removes the holder and expiry and returns
// the item as it was (ALL_OLD: the lock state it cleared).
func (r *RecordTable) ForceRelease(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	key, err := r.key(id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	nid, err := r.idOf(key)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	now := nowMs()
	out, err := r.c.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                &r.table,
		Key:                      key,
		UpdateExpression:         aws.String(recClear),
		ConditionExpression:      aws.String(recExists),
		ExpressionAttributeNames: r.names(phPK, phBy, phUntil),
		ReturnValues:             types.ReturnValueAllOld,
	})
	if _, failed := ccf(err); failed {
		return driver.RecordLock{}, false, nil
	}
	if err != nil {
		return driver.RecordLock{}, false, r.err(ctx, "force-release", nid, err)
	}
	rec, err := r.state(nid, out.Attributes, now)
	return rec, err == nil, err
}

// Get implements driver.Records: one strongly consistent GetItem of the
// key and lock attributes.
func (r *RecordTable) Get(ctx context.Context, id any) (driver.RecordLock, bool, error) {
	key, err := r.key(id)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	nid, err := r.idOf(key)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	return r.get(ctx, key, nid)
}

// checkQuery refuses a RecordQuery that cannot run or that uses the
// driver's placeholders.
func (r *RecordTable) checkQuery(q RecordQuery) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("dynamo: Claim on %s: "+format+": %w", append(append([]any{r.table}, args...), warden.ErrInvalidArgument)...)
	}
	if strings.TrimSpace(q.KeyCondition) == "" {
		return bad("RecordQuery.KeyCondition is required (Claim never scans a table)")
	}
	if q.IndexName != "" && !tableRe.MatchString(q.IndexName) {
		return bad("%q is not an index name", q.IndexName)
	}
	for _, e := range []string{q.KeyCondition, q.Filter} {
		if strings.Contains(strings.ToLower(e), wdnPrefix) {
			return bad("the expression %.60q uses a placeholder starting with %q, which is the driver's", e, wdnPrefix)
		}
	}
	for k := range q.Names {
		if !strings.HasPrefix(k, "#") || strings.HasPrefix(strings.ToLower(k[1:]), wdnPrefix) {
			return bad("name placeholder %.40q: it must start with '#' and not with #%s", k, wdnPrefix)
		}
	}
	for k, v := range q.Values {
		if !strings.HasPrefix(k, ":") || strings.HasPrefix(strings.ToLower(k[1:]), wdnPrefix) {
			return bad("value placeholder %.40q: it must start with ':' and not with :%s", k, wdnPrefix)
		}
		if v == nil {
			return bad("value placeholder %.40q is nil", k)
		}
	}
	return nil
}

// claimGaveUp is the error of a Claim that lost every candidate it tried.
type claimGaveUp struct {
	table string
	tries int
}

func (e *claimGaveUp) Error() string {
	return fmt.Sprintf("dynamo: Claim on %s gave up after losing %d candidates to other claimers (each was taken or changed between the Query and the conditional update); nothing was claimed, try again", e.table, e.tries)
}

func (e *claimGaveUp) Unwrap() error { return errContended }

// Claim implements driver.Records. It pages through a Query of
// q.IndexName (or the table) with q's key condition, q's filter and the
// filter "not locked" added, in the sort key's order, and tries a
// conditional UpdateItem on the candidates — locked as Lock does, and
// only if the record still matches q.KeyCondition and q.Filter — until
// one succeeds. The first attempt is on the first candidate in order;
// after a candidate was lost to another claimer, the next is picked at
// random among the following few, so that concurrent claimers spread
// instead of all racing for the same record. After RecordOptions.ClaimTries
// lost candidates Claim gives up with an error saying so. It never scans
// the table. claimed false: a Query from the start of the key condition
// found no candidate left.
//
// Held records ahead of the first free one are read past by every Query
// (a filter does not skip reading). So that a queue whose head is held
// does not cost each Claim a read of the whole head, a Claim resumes the
// Query where the RecordTable's previous Claim of the same query found
// its record — for RecordOptions.ClaimResume after the last Claim that
// read from the start (it reads from the start once it ran out), asking
// its first page for a little more than that Claim read past. See
// RecordOptions.ClaimResume for what this does to the order.
func (r *RecordTable) Claim(ctx context.Context, q RecordQuery, owner string, d time.Duration) (driver.RecordLock, bool, error) {
	if err := r.checkQuery(q); err != nil {
		return driver.RecordLock{}, false, err
	}
	cond := "(" + q.KeyCondition + ")"
	filter := recFree
	if strings.TrimSpace(q.Filter) != "" {
		cond += " AND (" + q.Filter + ")"
		filter = "(" + q.Filter + ") AND " + recFree
	}
	// The projection: the table's keys, the index's keys (so that a
	// candidate's key is a position to resume from) and the lock state.
	proj, ph := r.keyProjection(phBy, phUntil)
	qnames := r.names(ph...)
	ikeys, err := r.indexKeys(ctx, q.IndexName)
	if err != nil {
		return driver.RecordLock{}, false, err
	}
	for i, k := range ikeys {
		p := "#wdn_k" + strconv.Itoa(i)
		proj += ", " + p
		qnames[p] = k
	}
	maps.Copy(qnames, q.Names)
	hkey, hintable := claimKey(q)
	var h claimHint
	if hintable {
		h = r.hint(hkey)
	}
	var start item
	limit := min(max(r.page, h.limit), MaxClaimPageSize)
	resumed := len(h.after) > 0 && r.resume > 0 && time.Since(h.since) < r.resume
	if resumed {
		start, limit = h.after, r.page
	}
	lost := 0
	var ahead int32 // items read: held, or lost
	for {
		qvals := item{phNow: vN(nowMs())}
		maps.Copy(qvals, q.Values)
		out, err := r.c.Query(ctx, &dynamodb.QueryInput{
			TableName:                 &r.table,
			IndexName:                 strp(q.IndexName),
			KeyConditionExpression:    &q.KeyCondition,
			FilterExpression:          &filter,
			ProjectionExpression:      &proj,
			ExpressionAttributeNames:  qnames,
			ExpressionAttributeValues: qvals,
			ScanIndexForward:          aws.Bool(!q.Descending),
			ConsistentRead:            aws.Bool(q.ConsistentRead),
			Limit:                     &limit,
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return driver.RecordLock{}, false, r.err(ctx, "claim query", nil, err)
		}
		cands := out.Items
		tried := make([]bool, len(cands))
		// after returns the position up to which every item of the page
		// is held (read past, lost, or claimed): the last candidate before
		// the first untried one, or the page's start.
		after := func() item {
			u := slices.Index(tried, false)
			if u < 0 {
				u = len(cands)
			}
			if u == 0 {
				return start
			}
			return r.position(cands[u-1], ikeys)
		}
		refresh := false
		pageLost := 0
		for n := range cands {
			// The first candidate in the query's order; after a lost race,
			// one of the next few untried at random (see spread).
			skip := 0
			if lost > 0 {
				skip = rand.IntN(min(len(cands)-n, spread(lost)))
			}
			i := 0
			for tried[i] || skip > 0 {
				if !tried[i] {
					skip--
				}
				i++
			}
			tried[i] = true
			it := cands[i]
			id, err := r.idOf(it)
			if err != nil {
				return driver.RecordLock{}, false, err
			}
			key := item{r.pk: it[r.pk]}
			if r.sk != "" {
				key[r.sk] = it[r.sk]
			}
			rec, ok, err := r.take(ctx, key, id, owner, d, cond, q.Names, q.Values)
			if err != nil {
				return driver.RecordLock{}, false, err
			}
			if ok {
				if hintable {
					// The next Claim resumes after every item known held.
					r.claimed(hkey, h, resumed, after(), ahead+out.ScannedCount-out.Count+int32(n))
				}
				return rec, true, nil
			}
			if lost++; lost >= r.tries {
				return driver.RecordLock{}, false, &claimGaveUp{table: r.table, tries: lost}
			}
			// A page that keeps losing is stale (others claimed its
			// candidates since it was read): read on from where every
			// item is held, not through every stale candidate.
			if pageLost++; pageLost >= refreshAfter && n+1 < len(cands) {
				if pos := after(); pos != nil {
					ahead += int32(slices.Index(tried, false))
					start, limit, refresh = pos, r.page, true
					break
				}
			}
		}
		if refresh {
			continue
		}
		ahead += out.ScannedCount
		if len(out.LastEvaluatedKey) == 0 {
			if resumed {
				// Nothing after the resumed position: read from the start.
				start, resumed, ahead = nil, false, 0
				limit = min(max(r.page, h.limit), MaxClaimPageSize)
				continue
			}
			if hintable {
				r.setHint(hkey, claimHint{limit: r.grow(ahead)})
			}
			return driver.RecordLock{}, false, nil
		}
		start = out.LastEvaluatedKey
		limit = min(2*limit, MaxClaimPageSize)
	}
}

// position returns the key of candidate it as an ExclusiveStartKey of
// the query (table and index keys), nil if it has no index key (not in a
// sparse index).
func (r *RecordTable) position(it item, ikeys []string) item {
	pos := item{r.pk: it[r.pk]}
	if r.sk != "" {
		pos[r.sk] = it[r.sk]
	}
	for _, k := range ikeys {
		v, ok := it[k]
		if !ok {
			return nil
		}
		pos[k] = v
	}
	return pos
}

// claimed leaves the hint of a Claim that claimed a record: resume after
// pos; if it read from the start, it read ahead items past before its
// record, and resuming holds from now.
func (r *RecordTable) claimed(hkey string, h claimHint, resumed bool, pos item, ahead int32) {
	if !resumed {
		h.since, h.limit = time.Now(), r.grow(ahead)
	}
	h.after = pos
	r.setHint(hkey, h)
}

// grow is the first page size for a Claim from the start when the last
// one read ahead items past: a quarter more, and ClaimPageSize.
func (r *RecordTable) grow(ahead int32) int32 {
	return int32(min(int64(ahead)+int64(ahead)/4+int64(r.page), MaxClaimPageSize))
}

// unprojected returns the lock attributes that Claim's filter reads and
// an index with projection p and key schema ks lacks.
func (r *RecordTable) unprojected(p *types.Projection, ks []types.KeySchemaElement) []string {
	if p != nil && p.ProjectionType == types.ProjectionTypeAll {
		return nil
	}
	var missing []string
	for _, a := range []string{r.by, r.until} {
		in := a == r.pk || a == r.sk
		if p != nil && p.ProjectionType == types.ProjectionTypeInclude {
			in = in || slices.Contains(p.NonKeyAttributes, a)
		}
		for _, k := range ks {
			in = in || aws.ToString(k.AttributeName) == a
		}
		if !in {
			missing = append(missing, a)
		}
	}
	return missing
}

// indexKeys returns the key attributes of index other than the table's
// (nil for the table), from one DescribeTable per RecordTable and index
// (which also checks that a global secondary index projects the lock
// attributes).
func (r *RecordTable) indexKeys(ctx context.Context, index string) ([]string, error) {
	if index == "" {
		return nil, nil
	}
	r.hmu.Lock()
	ks, ok := r.idxKeys[index]
	r.hmu.Unlock()
	if ok {
		return ks, nil
	}
	out, err := r.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &r.table})
	if err != nil {
		return nil, r.err(ctx, "claim (describing the table)", nil, err)
	}
	var schema []types.KeySchemaElement
	found := false
	for _, g := range out.Table.GlobalSecondaryIndexes {
		if aws.ToString(g.IndexName) != index {
			continue
		}
		schema, found = g.KeySchema, true
		// A global secondary index holds only what it projects: a filter
		// on lock attributes it lacks sees every record as free, and
		// Claim would try (and pay a failed write for) every held one.
		if missing := r.unprojected(g.Projection, g.KeySchema); len(missing) > 0 {
			return nil, fmt.Errorf("dynamo: Claim: index %s of %s does not project %s, so Claim cannot skip locked records; give it projection INCLUDE with %s (or ALL): %w",
				index, r.table, strings.Join(missing, " and "), strings.Join(missing, " and "), warden.ErrInvalidArgument)
		}
	}
	for _, l := range out.Table.LocalSecondaryIndexes {
		if aws.ToString(l.IndexName) == index {
			// A local secondary index fetches unprojected attributes
			// from the table.
			schema, found = l.KeySchema, true
		}
	}
	if !found {
		return nil, fmt.Errorf("dynamo: Claim: table %s has no index %q: %w", r.table, index, warden.ErrInvalidArgument)
	}
	ks = []string{}
	for _, k := range schema {
		if a := aws.ToString(k.AttributeName); a != r.pk && a != r.sk {
			ks = append(ks, a)
		}
	}
	r.hmu.Lock()
	if r.idxKeys == nil {
		r.idxKeys = map[string][]string{}
	}
	r.idxKeys[index] = ks
	r.hmu.Unlock()
	return ks, nil
}

// refreshAfter is how many candidates of one page a Claim loses before it
// reads a fresh page.
const refreshAfter = 8

// spread is how many of the next candidates a Claim that lost lost races
// picks among at random: concurrent claimers that read the same page
// would otherwise all race for the same next record, each losing to
// every other (measured on dynalite, 8 claimers over 300 records: 2388
// updates in order, 1070 spread over 8).
func spread(lost int) int { return max(8, 2*lost) }

// claimHint is what Claims of one query leave for the next: where to
// resume (an ExclusiveStartKey up to which every item was held; nil:
// none), since when Claims resume (the last Claim that read from the
// start), and the first page size for a Claim from the start (see grow).
type claimHint struct {
	after item
	since time.Time
	limit int32
}

// maxClaimHints bounds the hints a RecordTable keeps.
const maxClaimHints = 256

// claimKey identifies a query for the hints: everything that decides
// which items it reads, in which order. Queries with values of types
// other than scalars get no hints.
func claimKey(q RecordQuery) (string, bool) {
	var b strings.Builder
	for _, s := range []string{q.IndexName, q.KeyCondition, q.Filter, strconv.FormatBool(q.Descending)} {
		b.WriteString(strconv.Quote(s))
	}
	for _, k := range slices.Sorted(maps.Keys(q.Names)) {
		b.WriteString(strconv.Quote(k) + strconv.Quote(q.Names[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(q.Values)) {
		b.WriteString(strconv.Quote(k))
		switch v := q.Values[k].(type) {
		case *types.AttributeValueMemberS:
			b.WriteString("S" + strconv.Quote(v.Value))
		case *types.AttributeValueMemberN:
			b.WriteString("N" + strconv.Quote(v.Value))
		case *types.AttributeValueMemberB:
			b.WriteString("B" + strconv.Quote(string(v.Value)))
		case *types.AttributeValueMemberBOOL:
			b.WriteString("T" + strconv.FormatBool(v.Value))
		case *types.AttributeValueMemberNULL:
			b.WriteString("0")
		default:
			return "", false
		}
	}
	return b.String(), true
}

func (r *RecordTable) hint(k string) claimHint {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	return r.hints[k]
}

func (r *RecordTable) setHint(k string, h claimHint) {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	if r.hints == nil || len(r.hints) >= maxClaimHints {
		r.hints = map[string]claimHint{}
	}
	r.hints[k] = h
}

// List implements driver.Records: the records whose lock is live, in id
// order. It reads with a Scan — of RecordOptions.ListIndex if set (a
// sparse index holding only the records with a holder), otherwise of the
// whole table (strongly consistent), which costs read capacity for every
// item of the table: an operator's call, not a hot path — filtered on
// "holder set and expiry after now" and projected to the key and lock
// attributes, then sorted by id in the process.
func (r *RecordTable) List(ctx context.Context, limit int) ([]driver.RecordLock, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("dynamo: List: limit %d must be positive: %w", limit, warden.ErrInvalidArgument)
	}
	now := nowMs()
	proj, ph := r.keyProjection(phBy, phUntil, phTok)
	filter := recLive
	var out []driver.RecordLock
	var start item
	for {
		res, err := r.c.Scan(ctx, &dynamodb.ScanInput{
			TableName:                 &r.table,
			IndexName:                 strp(r.listIndex),
			ConsistentRead:            aws.Bool(r.listIndex == ""),
			FilterExpression:          &filter,
			ProjectionExpression:      &proj,
			ExpressionAttributeNames:  r.names(ph...),
			ExpressionAttributeValues: item{phNow: vN(now)},
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return nil, r.err(ctx, "list", nil, err)
		}
		for _, it := range res.Items {
			id, err := r.idOf(it)
			if err != nil {
				return nil, err
			}
			rec, err := r.state(id, it, now)
			if err != nil {
				return nil, err
			}
			if rec.Live() {
				out = append(out, rec)
			}
		}
		if len(out) > 2*limit {
			sortRecords(out)
			out = out[:limit]
		}
		if len(res.LastEvaluatedKey) == 0 {
			break
		}
		start = res.LastEvaluatedKey
	}
	sortRecords(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// sortRecords sorts records by id as DynamoDB orders keys: numbers by
// value, strings and binaries by their bytes; partition key first.
func sortRecords(recs []driver.RecordLock) {
	slices.SortFunc(recs, func(a, b driver.RecordLock) int { return compareIDs(a.ID, b.ID) })
}

func compareIDs(a, b any) int {
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y)
		}
	case int64:
		if y, ok := b.(int64); ok {
			return cmp.Compare(x, y)
		}
	case []byte:
		if y, ok := b.([]byte); ok {
			return bytes.Compare(x, y)
		}
	case RecordKey:
		if y, ok := b.(RecordKey); ok {
			if c := compareIDs(x.PK, y.PK); c != 0 {
				return c
			}
			return compareIDs(x.SK, y.SK)
		}
	}
	return strings.Compare(fmt.Sprintf("%T", a), fmt.Sprintf("%T", b))
}

// Migrate checks the table for record locks: it exists, its key schema
// is the one RecordOptions name, and the ListIndex (if set) exists keyed
// by the owner attribute. Nothing is written: the lock attributes appear
// on an item when it is first locked, and the index Claim queries is the
// user's own (see Migration). Idempotent.
func (r *RecordTable) Migrate(ctx context.Context) error {
	out, err := r.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &r.table})
	if err != nil {
		return r.err(ctx, "migrate", nil, err)
	}
	t := out.Table
	var pk, sk string
	for _, k := range t.KeySchema {
		switch k.KeyType {
		case types.KeyTypeHash:
			pk = aws.ToString(k.AttributeName)
		case types.KeyTypeRange:
			sk = aws.ToString(k.AttributeName)
		}
	}
	if pk != r.pk || sk != r.sk {
		return fmt.Errorf("dynamo: table %s has partition key %q and sort key %q; RecordOptions say %q and %q: %w", r.table, pk, sk, r.pk, r.sk, warden.ErrInvalidArgument)
	}
	if r.listIndex == "" {
		return nil
	}
	for _, g := range t.GlobalSecondaryIndexes {
		if aws.ToString(g.IndexName) != r.listIndex {
			continue
		}
		for _, k := range g.KeySchema {
			if k.KeyType == types.KeyTypeHash && aws.ToString(k.AttributeName) == r.by {
				return nil
			}
		}
		return fmt.Errorf("dynamo: index %s of %s is not keyed by %s (see Migration): %w", r.listIndex, r.table, r.by, warden.ErrInvalidArgument)
	}
	return fmt.Errorf("dynamo: table %s has no index %s (ListIndex; see Migration): %w", r.table, r.listIndex, warden.ErrInvalidArgument)
}

// Migration returns what a table needs for record locks, for users who
// manage their tables by hand: nothing for the items, the index Claim
// queries (with the lock attributes projected) and the optional
// ListIndex, as AWS CLI commands with placeholders in angle brackets.
func (r *RecordTable) Migration() string {
	li := r.listIndex
	if li == "" {
		li = "<list-index>"
	}
	return fmt.Sprintf(`# Record locks on DynamoDB table %[1]s need no change to its items: the attributes
# %[2]s (Number, Unix milliseconds), %[3]s (String) and %[4]s (Number) appear on an
# item when it is first locked. Claim queries an index of your choice (e.g. a status
# and an order); it must project %[3]s and %[2]s:
aws dynamodb update-table --table-name %[1]s \
  --attribute-definitions AttributeName=<status>,AttributeType=S AttributeName=<rank>,AttributeType=N \
  --global-secondary-index-updates '[{"Create":{"IndexName":"<status-rank>","KeySchema":[{"AttributeName":"<status>","KeyType":"HASH"},{"AttributeName":"<rank>","KeyType":"RANGE"}],"Projection":{"ProjectionType":"INCLUDE","NonKeyAttributes":["%[3]s","%[2]s"]}}}]'
# Optional: a sparse index of the locked records for List (RecordOptions.ListIndex);
# without it List scans the whole table:
aws dynamodb update-table --table-name %[1]s \
  --attribute-definitions AttributeName=%[3]s,AttributeType=S \
  --global-secondary-index-updates '[{"Create":{"IndexName":"%[5]s","KeySchema":[{"AttributeName":"%[3]s","KeyType":"HASH"}],"Projection":{"ProjectionType":"INCLUDE","NonKeyAttributes":["%[2]s","%[4]s"]}}}]'
# (add "ProvisionedThroughput" to each Create on a provisioned table)
`, r.table, r.until, r.by, r.tok, li)
}

// RecordTable implements driver.RecordTables: the record locks of table
// (partition key fields.ID, default id; tables with a sort key are not
// reachable this way) through the store's client, for operators' tools
// (warden record …).
func (s *store) RecordTable(table string, fields driver.RecordFields) (driver.RecordAdmin, error) {
	r, err := Records(s.c, table, &RecordOptions{PartitionKey: fields.ID, UntilAttr: fields.Until, OwnerAttr: fields.Owner, TokenAttr: fields.Token})
	if err != nil {
		return nil, err
	}
	return r, nil
}

var _ driver.RecordTables = (*store)(nil)
