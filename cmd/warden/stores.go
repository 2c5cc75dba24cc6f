package main

// The stores this build of warden can open: each blank import registers its
// URL schemes with warden.Open. Adding a store to the CLI is one line here
// (and its module in go.mod).
import (
	"context"

	goredis "github.com/redis/go-redis/v9"
	_ "github.com/warden-go/warden/store/dynamo"   // registers dynamodb://
	_ "github.com/warden-go/warden/store/memory"   // registers memory://
	_ "github.com/warden-go/warden/store/mongo"    // registers mongodb:// and mongodb+srv://
	_ "github.com/warden-go/warden/store/mysql"    // registers mysql://
	_ "github.com/warden-go/warden/store/postgres" // registers postgres:// and postgresql://
	_ "github.com/warden-go/warden/store/redis"    // registers redis://, rediss:// and unix://
	_ "github.com/warden-go/warden/store/sqlite"   // registers sqlite://
)

// quietRedis drops go-redis's own log lines ("connection pool: failed to
// dial …"): the CLI reports a store's failure once, as its error message,
// as it does for every other store (whose logs it discards too).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { goredis.SetLogger(quietRedis{}) }
