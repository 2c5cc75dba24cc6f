// Command torture is warden's multi-process torture run. For each store it
// starts worker processes (this program re-executed with -worker), each
// with goroutines taking a few keys with short TTLs and writing their
// fencing tokens to a fenced resource inside their leases, while it
// injects faults: network faults on each worker's own fault proxy between
// the worker and the server (delay, blackhole, cut, reset, reset in the
// middle of a reply) and process faults (SIGKILL then a restart, SIGSTOP
// for longer than the TTL then SIGCONT). Then it stops the workers with
// SIGTERM and checks their logs and the resource's record (see Check),
// printing one summary line per store; it exits 1 if any store failed.
//
//	go run ./testenv/torture -store all -duration 60s
//	go run ./testenv/torture -store postgres,redis -long
//
// The stores run concurrently. A server is found through the variables
// testenv/up.sh exports (WARDEN_TEST_POSTGRES_URL, …); a store whose
// variable is unset is skipped, or fails with WARDEN_TEST_REQUIRE=all.
// testenv/torture.sh starts the servers and runs the short form.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/warden-go/warden/store/dynamo"   // registers dynamodb://
	_ "github.com/warden-go/warden/store/memory"   // registers memory://
	_ "github.com/warden-go/warden/store/mongo"    // registers mongodb://
	_ "github.com/warden-go/warden/store/mysql"    // registers mysql://
	_ "github.com/warden-go/warden/store/postgres" // registers postgres://
	_ "github.com/warden-go/warden/store/redis"    // registers redis://
	_ "github.com/warden-go/warden/store/sqlite"   // registers sqlite://
)

// allStores are the stores -store all runs, in the order of the summary.
var allStores = []string{"memory", "sqlite", "postgres", "mysql", "redis", "mongodb", "dynamodb"}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-worker" {
		if err := runWorker(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "torture worker:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(orchestrate(os.Args[1:]))
}

// options are the orchestrator's flags.
type options struct {
	stores     []string
	duration   time.Duration
	procs      int
	goroutines int
	keys       int
	ttls       []time.Duration
	ttlsSet    bool // -ttls was given: every store uses it
	dir        string
	keep       bool
	require    bool
}

// orchestrate runs the torture for the stores asked and returns the exit
// status.
func orchestrate(args []string) int {
	fs := flag.NewFlagSet("torture", flag.ContinueOnError)
	var o options
	store := fs.String("store", "all", "stores: all, or a comma-separated list of "+strings.Join(allStores, ", "))
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long faults are injected, per store (the stores run concurrently)")
	long := fs.Bool("long", false, "the long form: -duration 10m")
	fs.IntVar(&o.procs, "procs", 3, "worker processes per store")
	fs.IntVar(&o.goroutines, "goroutines", 4, "goroutines per worker, each with a Locker of its own")
	fs.IntVar(&o.keys, "keys", 3, "keys per store")
	ttls := fs.String("ttls", "300ms,500ms,800ms", "lease TTLs; goroutine g uses TTL g mod len (default for MongoDB and DynamoDB: 800ms,1.2s,1.6s)")
	fs.StringVar(&o.dir, "dir", "", "directory for the logs (default: a new one under the temporary directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the logs of stores that passed (a failed store's are always kept)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fs.Visit(func(f *flag.Flag) { o.ttlsSet = o.ttlsSet || f.Name == "ttls" })
	if *long {
		o.duration = 10 * time.Minute
	}
	for _, s := range strings.Split(*ttls, ",") {
		d, err := time.ParseDuration(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "torture: -ttls:", err)
			return 2
		}
		o.ttls = append(o.ttls, d)
	}
	if *store == "all" {
		o.stores = allStores
	} else {
		for _, s := range strings.Split(*store, ",") {
			if !slices.Contains(allStores, s) {
				fmt.Fprintf(os.Stderr, "torture: unknown store %q (have %s)\n", s, strings.Join(allStores, ", "))
				return 2
			}
			o.stores = append(o.stores, s)
		}
	}
	o.require = os.Getenv("WARDEN_TEST_REQUIRE") == "all"
	if o.dir == "" {
		d, err := os.MkdirTemp("", "warden-torture-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "torture:", err)
			return 1
		}
		o.dir = d
	}
	runID := strconv.FormatInt(time.Now().UnixMilli(), 36)
	lines := make([]string, len(o.stores))
	failed := make([]bool, len(o.stores))
	var wg sync.WaitGroup
	for i, name := range o.stores {
		wg.Go(func() {
			lines[i], failed[i] = runStore(name, runID, &o)
		})
	}
	wg.Wait()
	status := 0
	for i, l := range lines {
		fmt.Println(l)
		if failed[i] {
			status = 1
		}
	}
	if status == 0 && !o.keep {
		os.RemoveAll(o.dir)
	} else {
		fmt.Fprintln(os.Stderr, "torture: logs in", o.dir)
	}
	return status
}
