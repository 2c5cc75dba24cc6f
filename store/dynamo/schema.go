package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// tableInfo is what DescribeTable told about the store's table.
type tableInfo struct {
	exists bool
	index  bool // the events index exists and is active
	list   bool // the list index exists and is active
	status types.TableStatus
	desc   *types.TableDescription
}

func (s *store) describe(ctx context.Context) (tableInfo, error) {
	out, err := s.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return tableInfo{}, nil
	}
	if err != nil {
		return tableInfo{}, s.err(ctx, "describing table "+s.table, err)
	}
	info := tableInfo{exists: true, status: out.Table.TableStatus, desc: out.Table}
	for _, g := range out.Table.GlobalSecondaryIndexes {
		active := g.IndexStatus == types.IndexStatusActive || g.IndexStatus == ""
		switch aws.ToString(g.IndexName) {
		case EventsIndex:
			info.index = active
		case ListIndex:
			info.list = active && listIndexUsable(g)
		}
	}
	return info, nil
}

// hasIndex reports whether the table described has an index of that
// name, active or not.
func hasIndex(t *types.TableDescription, name string) bool {
	for _, g := range t.GlobalSecondaryIndexes {
		if aws.ToString(g.IndexName) == name {
			return true
		}
	}
	return false
}

// listIndexUsable reports whether an index named ListIndex is the one the
// store queries: partition key lpk, sort key pk. (One made by someone
// else under that name with other keys is not used: listings Scan.)
func listIndexUsable(g types.GlobalSecondaryIndexDescription) bool {
	var hash, rng string
	for _, k := range g.KeySchema {
		switch k.KeyType {
		case types.KeyTypeHash:
			hash = aws.ToString(k.AttributeName)
		case types.KeyTypeRange:
			rng = aws.ToString(k.AttributeName)
		}
	}
	return hash == aLpk && rng == aPk
}

func (s *store) eventsIndexDef() types.GlobalSecondaryIndex {
	return types.GlobalSecondaryIndex{
		IndexName: aws.String(EventsIndex),
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(aGpk), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(aGsk), KeyType: types.KeyTypeRange},
		},
		Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
	}
}

// listIndexDef is the list index: partition key lpk (the kind and
// namespace: the pk prefix of the store's items of one kind), sort key
// pk, keys only. Every item warden writes carries lpk, so that a listing
// is a Query of its namespace and kind (see listing.go).
func listIndexDef() types.GlobalSecondaryIndex {
	return types.GlobalSecondaryIndex{
		IndexName: aws.String(ListIndex),
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(aLpk), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(aPk), KeyType: types.KeyTypeRange},
		},
		Projection: &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly},
	}
}

// attrDefs defines the table's keys and those of the indexes given (all
// strings), each once: DynamoDB refuses definitions no key uses.
func attrDefs(idx ...types.GlobalSecondaryIndex) []types.AttributeDefinition {
	names := []string{aPk, aSk}
	for _, g := range idx {
		for _, k := range g.KeySchema {
			names = append(names, aws.ToString(k.AttributeName))
		}
	}
	var defs []types.AttributeDefinition
	seen := map[string]bool{}
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			defs = append(defs, types.AttributeDefinition{AttributeName: aws.String(n), AttributeType: types.ScalarAttributeTypeS})
		}
	}
	return defs
}

// createTable creates the table (on-demand billing, the events and list
// indexes),
// waits until it is active and enables TTL on expiresAt where the
// endpoint supports it. A table created meanwhile by someone else is
// accepted.
func (s *store) createTable(ctx context.Context) error {
	_, err := s.c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: &s.table,
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(aPk), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(aSk), KeyType: types.KeyTypeRange},
		},
		AttributeDefinitions:   attrDefs(s.eventsIndexDef(), listIndexDef()),
		BillingMode:            types.BillingModePayPerRequest,
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{s.eventsIndexDef(), listIndexDef()},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return s.err(ctx, "creating table "+s.table, err)
	}
	if err := s.waitActive(ctx); err != nil {
		return err
	}
	return s.enableTTL(ctx)
}

// waitActive waits until the table and its indexes are active.
func (s *store) waitActive(ctx context.Context) error {
	delay := 20 * time.Millisecond
	for {
		out, err := s.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
		if err != nil {
			var nf *types.ResourceNotFoundException
			if !errors.As(err, &nf) {
				return s.err(ctx, "describing table "+s.table, err)
			}
		} else if out.Table.TableStatus == types.TableStatusActive {
			ready := true
			for _, g := range out.Table.GlobalSecondaryIndexes {
				if g.IndexStatus != "" && g.IndexStatus != types.IndexStatusActive {
					ready = false
				}
			}
			if ready {
				return nil
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// enableTTL turns on DynamoDB TTL on expiresAt. Endpoints without
// UpdateTimeToLive (dynalite) and tables whose TTL is already on are
// fine: TTL only collects garbage.
func (s *store) enableTTL(ctx context.Context) error {
	_, err := s.c.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: &s.table,
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(aTTL), Enabled: aws.Bool(true),
		},
	})
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// CreateTable creates the store's table if it does not exist — partition
// key pk, sort key sk, on-demand billing, the events and list indexes —
// waits until it is active, and enables TTL on expiresAt where the
// endpoint supports it. It is the same as Migrate.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	if !tableRe.MatchString(table) {
		return fmt.Errorf("dynamo: %q is not a DynamoDB table name", table)
	}
	s := &store{c: client, table: table}
	return s.Migrate(ctx)
}

// Migrate implements driver.Migrator: it creates the table if it is
// missing; on an existing table it adds the events index and the list
// index where they are missing (one at a time: DynamoDB builds each in
// the background, and Migrate waits until it is active), tags the items
// written before the list index existed (backfill, one Scan of the table)
// and enables TTL. Idempotent.
func (s *store) Migrate(ctx context.Context) error {
	info, err := s.describe(ctx)
	if err != nil {
		return err
	}
	if !info.exists {
		return s.createTable(ctx)
	}
	if err := s.waitActive(ctx); err != nil {
		return err
	}
	var missing []error
	for _, idx := range []struct {
		def  types.GlobalSecondaryIndex
		miss error
	}{{s.eventsIndexDef(), ErrNoEventsIndex}, {listIndexDef(), ErrNoListIndex}} {
		name := aws.ToString(idx.def.IndexName)
		if info, err = s.describe(ctx); err != nil {
			return err
		}
		if !hasIndex(info.desc, name) {
			if err := s.addIndex(ctx, info.desc, idx.def); err != nil {
				return err
			}
			if err := s.waitActive(ctx); err != nil {
				return err
			}
			if info, err = s.describe(ctx); err != nil {
				return err
			}
			if !hasIndex(info.desc, name) {
				missing = append(missing, fmt.Errorf("%w: table %s (the endpoint accepted UpdateTable but did not create the index; dynalite cannot add indexes to a table)", idx.miss, s.table))
			}
		}
	}
	if info.list {
		if err := s.backfill(ctx); err != nil {
			return err
		}
	} else if len(missing) == 0 {
		missing = append(missing, fmt.Errorf("%w: table %s has an index named %s with other keys than (lpk, pk)", ErrNoListIndex, s.table, ListIndex))
	}
	if err := s.enableTTL(ctx); err != nil {
		return err
	}
	return errors.Join(missing...)
}

// ErrNoEventsIndex is returned by Migrate when the events index could not
// be added to an existing table. The store works without it, without
// notifications.
var ErrNoEventsIndex = errors.New("dynamo: the events index could not be added")

// ErrNoListIndex is returned by Migrate when the list index could not be
// added to an existing table. The store works without it: its listings
// Scan the whole table.
var ErrNoListIndex = errors.New("dynamo: the list index could not be added")

// addIndex adds a global secondary index to an existing table: without
// throughput on an on-demand table, with the table's own on a provisioned
// one (and on endpoints that insist on it, such as dynalite).
func (s *store) addIndex(ctx context.Context, t *types.TableDescription, idx types.GlobalSecondaryIndex) error {
	create := &types.CreateGlobalSecondaryIndexAction{IndexName: idx.IndexName, KeySchema: idx.KeySchema, Projection: idx.Projection}
	throughput := func() *types.ProvisionedThroughput {
		r, w := int64(1), int64(1)
		if p := t.ProvisionedThroughput; p != nil {
			r, w = max(r, aws.ToInt64(p.ReadCapacityUnits)), max(w, aws.ToInt64(p.WriteCapacityUnits))
		}
		return &types.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(r), WriteCapacityUnits: aws.Int64(w)}
	}
	onDemand := t.BillingModeSummary != nil && t.BillingModeSummary.BillingMode == types.BillingModePayPerRequest
	if !onDemand {
		create.ProvisionedThroughput = throughput()
	}
	in := &dynamodb.UpdateTableInput{
		TableName:                   &s.table,
		AttributeDefinitions:        attrDefs(idx),
		GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: create}},
	}
	_, err := s.c.UpdateTable(ctx, in)
	if err != nil && create.ProvisionedThroughput == nil && strings.Contains(strings.ToLower(err.Error()), "provisionedthroughput") {
		create.ProvisionedThroughput = throughput()
		_, err = s.c.UpdateTable(ctx, in)
	}
	if err != nil {
		return s.err(ctx, "adding index "+aws.ToString(idx.IndexName)+" to "+s.table, err)
	}
	return nil
}

// DeleteTable deletes table (for tests and tear-downs).
func DeleteTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &table})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dynamo: deleting table %s: %w", table, err)
	}
	return nil
}
