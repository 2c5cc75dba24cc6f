// Command report runs warden's benchmarks and prints a markdown table with
// each case's time per operation and its ratio to its group's baseline
// (the raw database primitive), all measured in this one run. Each of the
// count rounds runs every case once.
//
//	cd bench && go run ./cmd/report [-count 3] [-run 'redis']
package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/warden-go/warden/bench"
)

func main() {
	count := flag.Int("count", 3, "runs per case; the median is reported")
	run := flag.String("run", "", "only the cases whose \"group/name\" matches this regular expression")
	flag.Parse()
	testing.Init()
	re, err := regexp.Compile(*run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report: -run:", err)
		os.Exit(2)
	}

	type row struct {
		c     bench.Case
		runs  []float64
		ns    float64
		extra map[string][]float64 // the runs' other metrics
	}
	var rows []*row
	for _, c := range bench.Cases() {
		if re.MatchString(c.Group + "/" + c.Name) {
			rows = append(rows, &row{c: c, extra: map[string][]float64{}})
		}
	}
	// Rounds run every case once, so that a burst of load on the machine
	// hits one run of several cases rather than every run of one.
	for i := 0; i < *count; i++ {
		for _, r := range rows {
			fmt.Fprintf(os.Stderr, "report: round %d/%d: %s / %s\n", i+1, *count, r.c.Group, r.c.Name)
			res := testing.Benchmark(r.c.Run)
			if res.N == 0 {
				fmt.Fprintf(os.Stderr, "report: %s / %s did not run\n", r.c.Group, r.c.Name)
				os.Exit(1)
			}
			for k, v := range res.Extra {
				if k != r.c.Metric {
					r.extra[k] = append(r.extra[k], v)
				}
			}
			if r.c.Metric != "" {
				r.runs = append(r.runs, res.Extra[r.c.Metric]*1000) // µs → ns, like the others
			} else {
				r.runs = append(r.runs, float64(res.T.Nanoseconds())/float64(res.N))
			}
		}
	}
	base := map[string]float64{}
	for _, r := range rows {
		sort.Float64s(r.runs)
		r.ns = r.runs[len(r.runs)/2]
		if r.c.Baseline {
			base[r.c.Group] = r.ns
		}
	}
	fmt.Println("| group | case | µs/op (hand-off: p50 µs) | × baseline | other metrics (medians) |")
	fmt.Println("|---|---|---:|---:|---|")
	for _, r := range rows {
		ratio := "—"
		if b := base[r.c.Group]; b > 0 && !r.c.Baseline {
			ratio = fmt.Sprintf("%.2f", r.ns/b)
		} else if r.c.Baseline {
			ratio = "1.00 (baseline)"
		}
		var names []string
		for k := range r.extra {
			names = append(names, k)
		}
		sort.Strings(names)
		var other []string
		for _, k := range names {
			v := r.extra[k]
			sort.Float64s(v)
			other = append(other, fmt.Sprintf("%s %.4g", k, v[len(v)/2]))
		}
		if len(other) == 0 {
			other = []string{"—"}
		}
		fmt.Printf("| %s | %s | %.1f | %s | %s |\n", r.c.Group, r.c.Name, r.ns/1000, ratio, strings.Join(other, ", "))
	}
}
