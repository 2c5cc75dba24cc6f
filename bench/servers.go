package bench

import (
	"context"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ServerVersions names the version of each database server the cases run
// against (those whose WARDEN_TEST_* variable is set), for the report's
// record of the run. A server that cannot be asked shows why instead.
func ServerVersions() map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]string{}
	ask := func(name, env string, f func(base string) (string, error)) {
		base := os.Getenv(env)
		if base == "" {
			return
		}
		v, err := f(base)
		if err != nil {
			v = "unknown (" + err.Error() + ")"
		}
		out[name] = v
	}
	ask("MySQL/MariaDB", mysqlEnv, func(base string) (string, error) {
		db, err := openMySQL(base)
		if err != nil {
			return "", err
		}
		defer db.Close()
		var v string
		return v, db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
	})
	ask("PostgreSQL", postgresEnv, func(base string) (string, error) {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return "", err
		}
		defer c.Close(context.Background())
		var v string
		return v, c.QueryRow(ctx, "SHOW server_version").Scan(&v)
	})
	ask("Redis", redisEnv, func(base string) (string, error) {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		u.RawQuery = ""
		o, err := goredis.ParseURL(u.String())
		if err != nil {
			return "", err
		}
		c := goredis.NewClient(o)
		defer c.Close()
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				return v, nil
			}
		}
		return "", nil
	})
	ask("MongoDB", mongoEnv, func(base string) (string, error) {
		u, _ := mongoBase(base)
		q := u.Query()
		q.Del("database")
		u.RawQuery = q.Encode()
		c, err := mongo.Connect(options.Client().ApplyURI(u.String()))
		if err != nil {
			return "", err
		}
		defer c.Disconnect(context.Background())
		var info bson.M
		if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info); err != nil {
			return "", err
		}
		v, _ := info["version"].(string)
		if f, ok := info["ferretdbVersion"].(string); ok {
			if f == "unknown" { // built from the module, without version stamping
				f = moduleVersion("../testenv/ferretdb/go.mod", "github.com/FerretDB/FerretDB ")
			}
			return "FerretDB " + f + " (MongoDB " + v + " wire protocol)", nil
		}
		return "MongoDB " + v, nil
	})
	ask("DynamoDB", dynamoEnv, func(base string) (string, error) {
		return "dynalite " + moduleVersion("../testenv/dynalite/package.json", `"dynalite": "`) + " (the test server, at " + base + ")", nil
	})
	return out
}

// moduleVersion returns what follows marker in the file at path (relative
// to bench/, where the report runs), up to a space, quote or line end:
// the version a go.mod or package.json pins; "unknown" if not found.
func moduleVersion(path, marker string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		return "unknown"
	}
	if i := strings.IndexAny(rest, " \"\n"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}
