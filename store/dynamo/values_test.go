package dynamo

import (
	"bytes"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// TestDataValueSize: a native form larger than the limit (by DynamoDB's
// size rules) is stored as binary, so a value within MaxValueBytes never
// makes an item over DynamoDB's 400 KB.
func TestDataValueSize(t *testing.T) {
	b := []byte("[" + string(bytes.Repeat([]byte("0,"), 499)) + "0]") // 1001 bytes, 500 elements
	v, ok := nativeData(b)
	if !ok {
		t.Fatal("no native form")
	}
	size := avSize(v)
	if size <= len(b) {
		t.Fatalf("native size %d for %d bytes of JSON", size, len(b))
	}
	if _, bin := dataValue(b, size-1).(*types.AttributeValueMemberB); !bin {
		t.Errorf("stored natively with a limit below its native size (%d)", size)
	}
	if _, bin := dataValue(b, size).(*types.AttributeValueMemberB); bin {
		t.Errorf("stored as binary with a limit of its native size (%d)", size)
	}
}
