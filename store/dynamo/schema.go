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
	status types.TableStatus
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
	info := tableInfo{exists: true, status: out.Table.TableStatus}
	for _, g := range out.Table.GlobalSecondaryIndexes {
		if aws.ToString(g.IndexName) == EventsIndex && (g.IndexStatus == types.IndexStatusActive || g.IndexStatus == "") {
			info.index = true
		}
	}
	return info, nil
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

func attrDefs() []types.AttributeDefinition {
	var defs []types.AttributeDefinition
	for _, n := range []string{aPk, aSk, aGpk, aGsk} {
		defs = append(defs, types.AttributeDefinition{AttributeName: aws.String(n), AttributeType: types.ScalarAttributeTypeS})
	}
	return defs
}

// createTable creates the table (on-demand billing, the events index),
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
		AttributeDefinitions:   attrDefs(),
		BillingMode:            types.BillingModePayPerRequest,
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{s.eventsIndexDef()},
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
// key pk, sort key sk, on-demand billing, the events index — waits until
// it is active, and enables TTL on expiresAt where the endpoint supports
// it. It is the same as Migrate.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	if !tableRe.MatchString(table) {
		return fmt.Errorf("dynamo: %q is not a DynamoDB table name", table)
	}
	s := &store{c: client, table: table}
	return s.Migrate(ctx)
}

// Migrate implements driver.Migrator: it creates the table if it is
// missing, adds the events index to a table without it (DynamoDB builds
// it in the background; Migrate waits), and enables TTL. Idempotent.
func (s *store) Migrate(ctx context.Context) error {
	info, err := s.describe(ctx)
	if err != nil {
		return err
	}
	if !info.exists {
		return s.createTable(ctx)
	}
	if !info.index {
		out, err := s.c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
		if err != nil {
			return s.err(ctx, "describing table "+s.table, err)
		}
		present := false
		for _, g := range out.Table.GlobalSecondaryIndexes {
			present = present || aws.ToString(g.IndexName) == EventsIndex
		}
		if !present {
			if err := s.addEventsIndex(ctx, out.Table); err != nil {
				return err
			}
		}
	}
	if err := s.waitActive(ctx); err != nil {
		return err
	}
	if !info.index {
		if info, err = s.describe(ctx); err != nil {
			return err
		}
		if !info.index {
			return fmt.Errorf("%w: table %s (the endpoint accepted UpdateTable but did not create the index; dynalite cannot add indexes to a table)", ErrNoEventsIndex, s.table)
		}
	}
	return s.enableTTL(ctx)
}

// ErrNoEventsIndex is returned by Migrate when the events index could not
// be added to an existing table. The store works without it, without
// notifications.
var ErrNoEventsIndex = errors.New("dynamo: the events index could not be added")

// addEventsIndex adds the events index to an existing table: without
// throughput on an on-demand table, with the table's own on a provisioned
// one (and on endpoints that insist on it, such as dynalite).
func (s *store) addEventsIndex(ctx context.Context, t *types.TableDescription) error {
	idx := s.eventsIndexDef()
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
		AttributeDefinitions:        attrDefs(),
		GlobalSecondaryIndexUpdates: []types.GlobalSecondaryIndexUpdate{{Create: create}},
	}
	_, err := s.c.UpdateTable(ctx, in)
	if err != nil && create.ProvisionedThroughput == nil && strings.Contains(strings.ToLower(err.Error()), "provisionedthroughput") {
		create.ProvisionedThroughput = throughput()
		_, err = s.c.UpdateTable(ctx, in)
	}
	if err != nil {
		return s.err(ctx, "adding the events index to "+s.table, err)
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
