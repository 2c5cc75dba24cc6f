// Package dynamo is warden's DynamoDB store.
//
// All of warden's records live in one table with a string partition key
// pk and a string sort key sk (the single-table layout of the go-go-scope
// DynamoDB adapter): locks under pk "LOCK#…", circuits under "CB#…", cache
// entries under "CACHE#…", idempotency records under "IDEM#…", each with sk
// "METADATA"; a task's checkpoints under pk "CHECKPOINT#…" with the
// sequence, zero-padded, as sk, next to the task's fence item (sk "FENCE").
// The partition key carries the store's namespace: kind + prefix + kind tag
// + key, so namespaces never meet.
//
// DynamoDB has no clock inside its expressions: the client's clock decides
// expiry, in milliseconds (attribute expiresAtMs). The epoch-seconds
// attribute expiresAt is the table's TTL attribute and only collects
// garbage. Clients sharing a table must keep their clocks close (NTP); a
// client whose clock runs ahead by d takes over lapsed locks up to d early.
//
// Every lock and circuit write also stamps the item with the keys of a
// sparse global secondary index ([EventsIndex]); a watcher goroutine polls
// that index to deliver lock and circuit events to every process. A table
// without the index still works, without notifications.
//
// Every item warden writes also carries lpk, the key of a second sparse
// index ([ListIndex], keys only): listings (Keys, List, Tasks, Clear,
// Purge) Query their namespace in it and read the records with
// BatchGetItem, instead of scanning the table. On a table without it they
// Scan; Migrate adds it and tags older items.
//
// Open a store with [Open], with [New] on an existing *dynamodb.Client, or
// with warden.Open and a URL:
//
//	dynamodb://TABLE?region=eu-west-1&prefix=billing:
//	dynamodb://TABLE?endpoint=http://127.0.0.1:8000   (DynamoDB Local, dynalite)
//
// URL parameters: region, endpoint, prefix, max_value_bytes, auto_create
// (default true), events (default true), event_poll, event_lookback,
// lock_retention. Credentials come from the AWS SDK's default chain;
// for an endpoint on the loopback interface without credentials in the
// environment, fixed dummy credentials are used.
package dynamo
