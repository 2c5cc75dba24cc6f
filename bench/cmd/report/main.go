// Command report runs warden's benchmarks and prints a markdown table with
// each case's time per operation and its ratio to its group's baseline
// (the raw database primitive), all measured in this one run.
//
//	cd bench && go run ./cmd/report [-count 3]
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"testing"

	"github.com/warden-go/warden/bench"
)

func main() {
	count := flag.Int("count", 3, "runs per case; the median is reported")
	flag.Parse()
	testing.Init()

	type row struct {
		c  bench.Case
		ns float64
	}
	var rows []row
	base := map[string]float64{}
	for _, c := range bench.Cases() {
		var runs []float64
		for i := 0; i < *count; i++ {
			r := testing.Benchmark(c.Run)
			if r.N == 0 {
				fmt.Fprintf(os.Stderr, "report: %s / %s did not run\n", c.Group, c.Name)
				os.Exit(1)
			}
			if c.Metric != "" {
				runs = append(runs, r.Extra[c.Metric]*1000) // µs → ns, like the others
			} else {
				runs = append(runs, float64(r.T.Nanoseconds())/float64(r.N))
			}
		}
		sort.Float64s(runs)
		ns := runs[len(runs)/2]
		rows = append(rows, row{c, ns})
		if c.Baseline {
			base[c.Group] = ns
		}
	}
	fmt.Println("| group | case | µs/op (hand-off: p50 µs) | × baseline |")
	fmt.Println("|---|---|---:|---:|")
	for _, r := range rows {
		ratio := "—"
		if b := base[r.c.Group]; b > 0 && !r.c.Baseline {
			ratio = fmt.Sprintf("%.2f", r.ns/b)
		} else if r.c.Baseline {
			ratio = "1.00 (baseline)"
		}
		fmt.Printf("| %s | %s | %.1f | %s |\n", r.c.Group, r.c.Name, r.ns/1000, ratio)
	}
}
