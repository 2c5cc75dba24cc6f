// Command report runs warden's benchmarks and prints markdown tables:
// each case's time per operation, its ratio to its group's baseline (the
// raw database primitive, or the in-process peer) and, for warden's
// cases, its ratio to the best peer library of the group — all measured
// in this one run. Each of the count rounds runs every case once.
//
//	cd bench && go run ./cmd/report [-count 3] [-run 'redis'] [-write ../docs]
//
// With -write, the run is also recorded in the docs directory given: the
// section of benchmarks.md between the markers
// "<!-- bench-report:begin -->" and "<!-- bench-report:end -->" (added
// after the file's first paragraph if missing) is replaced by the tables,
// the machine, the Go and module versions, the servers' versions and the
// commit; benchmarks.svg gets a chart of hand-off latency and contended
// throughput per store. `make bench` runs it that way, from a checkout's
// root, after starting the servers.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/bench"
)

type row struct {
	c     bench.Case
	runs  []float64
	ns    float64              // median per operation (or of the metric, in ns)
	extra map[string][]float64 // the runs' other metrics
	base  float64              // ratio to the group's baseline; 0: none
	peer  float64              // ratio to the group's best peer (warden's rows); 0: none
	best  string               // the best peer's name
}

func main() {
	count := flag.Int("count", 3, "runs per case; the median is reported")
	run := flag.String("run", "", "only the cases whose \"group/name\" matches this regular expression")
	write := flag.String("write", "", "a docs directory: record the run in its benchmarks.md and benchmarks.svg")
	flag.Parse()
	testing.Init()
	re, err := regexp.Compile(*run)
	if err != nil {
		fmt.Fprintln(os.Stderr, "report: -run:", err)
		os.Exit(2)
	}
	started := time.Now()
	loadBefore := loadavg()

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
			if r.c.Allocs {
				r.extra["allocs/op"] = append(r.extra["allocs/op"], float64(res.AllocsPerOp()))
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
	ratios(rows)

	var out bytes.Buffer
	if *write != "" {
		environment(&out, started, loadBefore, *count, *run)
	}
	summary(&out, rows)
	table(&out, rows)
	os.Stdout.Write(out.Bytes())
	if *write == "" {
		return
	}
	if err := record(*write, out.String(), rows); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "report: wrote %s and %s\n", filepath.Join(*write, "benchmarks.md"), filepath.Join(*write, "benchmarks.svg"))
}

// ratios sets each row's median and its ratios to the group's baseline
// and, for warden's rows, to the group's best (fastest) peer library.
func ratios(rows []*row) {
	base := map[string]float64{}
	best := map[string]*row{}
	for _, r := range rows {
		sort.Float64s(r.runs)
		r.ns = r.runs[len(r.runs)/2]
		if r.c.Baseline {
			base[r.c.Group] = r.ns
		}
		if r.c.Role() == bench.RolePeer {
			if b := best[r.c.Group]; b == nil || r.ns < b.ns {
				best[r.c.Group] = r
			}
		}
	}
	for _, r := range rows {
		if b := base[r.c.Group]; b > 0 && !r.c.Baseline {
			r.base = r.ns / b
		}
		if b := best[r.c.Group]; b != nil && r.c.Role() == bench.RoleWarden {
			r.peer, r.best = r.ns/b.ns, b.c.Name
		}
	}
}

func micro(ns float64) string {
	if ns < 10_000 { // in-process cases: nanoseconds matter
		return fmt.Sprintf("%.3f", ns/1000)
	}
	return fmt.Sprintf("%.1f", ns/1000)
}

func ratio(x float64) string {
	if x == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", x)
}

// summary prints warden's rows with their two ratios: the comparison the
// benchmarks exist for.
func summary(w io.Writer, rows []*row) {
	fmt.Fprintln(w, "### warden beside the raw primitive and the best peer")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Lower is better everywhere: µs per operation (for hand-off, the p50 in µs; for contention, wall time per acquisition). × raw: warden ÷ the group's baseline; × best peer: warden ÷ the fastest peer library of the group, named.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| group | warden case | µs | × raw | × best peer | best peer |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---|")
	for _, r := range rows {
		if r.c.Role() != bench.RoleWarden || r.base == 0 && r.peer == 0 {
			continue
		}
		best := r.best
		if best == "" {
			best = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.c.Group, r.c.Name, micro(r.ns), ratio(r.base), ratio(r.peer), best)
	}
	fmt.Fprintln(w)
}

// table prints every case.
func table(w io.Writer, rows []*row) {
	fmt.Fprintln(w, "### Every case")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| group | case | role | µs/op (hand-off: p50 µs) | × baseline | × best peer | other metrics (medians) |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---|")
	for _, r := range rows {
		b := ratio(r.base)
		if r.c.Baseline {
			b = "1.00 (baseline)"
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
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.c.Group, r.c.Name, r.c.Role(), micro(r.ns), b, ratio(r.peer), strings.Join(other, ", "))
	}
	fmt.Fprintln(w)
}

// environment records what the run ran on: when, the commit, the command,
// the machine, Go, the modules measured and the servers.
func environment(w io.Writer, started time.Time, loadBefore string, count int, run string) {
	fmt.Fprintf(w, "Run %s (%s of measuring) from commit %s.\n\n", started.UTC().Format("2006-01-02 15:04 UTC"),
		time.Since(started).Round(time.Second), commit())
	cmd := fmt.Sprintf("make bench (cd bench && go run ./cmd/report -count %d -write ../docs)", count)
	if run != "" {
		cmd = fmt.Sprintf("cd bench && go run ./cmd/report -count %d -run %q -write ../docs", count, run)
	}
	fmt.Fprintf(w, "Command: `%s`, with the servers of `testenv/up.sh`.\n\n", cmd)
	fmt.Fprintf(w, "* machine: %s/%s, %d CPUs (%s), %s memory; load average before %s, after %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), cpuModel(), memTotal(), loadBefore, loadavg())
	fmt.Fprintf(w, "* Go: %s\n", runtime.Version())
	if bi, ok := debug.ReadBuildInfo(); ok {
		var mods []string
		for _, d := range bi.Deps {
			for _, want := range []string{"modernc.org/sqlite", "go-sql-driver/mysql", "jackc/pgx", "redis/go-redis",
				"redis/rueidis", "redsync", "bsm/redislock", "go-mysql-lock", "gobreaker", "mongo-driver", "service/dynamodb",
				"go.opentelemetry.io/otel/sdk"} {
				if strings.Contains(d.Path, want) && d.Version != "" {
					mods = append(mods, d.Path+" "+d.Version)
					break
				}
			}
		}
		sort.Strings(mods)
		fmt.Fprintf(w, "* modules: %s\n", strings.Join(mods, ", "))
	}
	servers := bench.ServerVersions()
	var names []string
	for k := range servers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(w, "* %s: %s\n", k, servers[k])
	}
	fmt.Fprintln(w)
}

func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += " with uncommitted changes"
	}
	return c
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "model unknown"
}

func memTotal() string {
	b, _ := os.ReadFile("/proc/meminfo")
	var kb float64
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			fmt.Sscanf(strings.TrimSpace(v), "%f", &kb)
		}
	}
	if kb == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.0f GiB", kb/(1<<20))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

const (
	beginMark = "<!-- bench-report:begin -->"
	endMark   = "<!-- bench-report:end -->"
)

// record writes the run into dir's benchmarks.md, between the markers,
// and the chart into benchmarks.svg.
func record(dir, text string, rows []*row) error {
	path := filepath.Join(dir, "benchmarks.md")
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	section := beginMark + "\n## Latest full run (written by `make bench`)\n\n" +
		"Every number in this section is from the one run it describes; the dated sections below are earlier, partial runs with their analyses.\n\n" +
		"![lock hand-off latency and contended throughput per store](benchmarks.svg)\n\n" +
		text + endMark + "\n"
	doc := string(old)
	if i, j := strings.Index(doc, beginMark), strings.Index(doc, endMark); i >= 0 && j > i {
		doc = doc[:i] + section + strings.TrimPrefix(doc[j+len(endMark):], "\n")
	} else {
		// After the title and the first paragraph.
		at := strings.Index(doc, "\n## ")
		if at < 0 {
			at = len(doc)
		}
		doc = doc[:at+1] + section + "\n" + doc[at+1:]
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "benchmarks.svg"), chart(rows), 0o644)
}

// bar is one bar of the chart.
type bar struct {
	label string
	value float64
	role  string
}

// chart draws two panels of horizontal bars: the lock hand-off p50 of
// every hand-off case (µs, log scale) and the throughput of every
// contention case (acquisitions per second, linear), coloured by role.
func chart(rows []*row) []byte {
	var handoff, contend []bar
	for _, r := range rows {
		g := strings.ToLower(r.c.Group)
		store := strings.Fields(r.c.Group)[0]
		switch {
		case strings.Contains(g, "hand-off") && r.c.Metric == bench.HandoffMetric:
			label := r.c.Name
			if !strings.HasPrefix(g, "lock hand-off") {
				label = store + ": " + r.c.Name
			}
			handoff = append(handoff, bar{label, r.ns / 1000, r.c.Role()})
		case strings.Contains(g, "contention") || strings.Contains(g, "processes ×"):
			label := store + ": " + r.c.Name
			if strings.Contains(g, "processes ×") {
				label = store + " (2 processes): " + r.c.Name
			}
			contend = append(contend, bar{label, 1e9 / r.ns, r.c.Role()})
		}
	}
	const width, labelW, barW, rowH = 1100, 620, 400, 18
	height := 60 + rowH*(len(handoff)+len(contend)) + 80
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	colour := map[string]string{bench.RoleWarden: "#1f6feb", bench.RolePeer: "#d29922", bench.RoleRaw: "#8b949e", bench.RoleOther: "#6e7781"}
	y := 20
	panel := func(title string, bars []bar, logScale bool, unit string) {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold" font-size="13">%s</text>`+"\n", y, esc(title))
		y += 12
		hi := 0.0
		lo := math.Inf(1)
		for _, x := range bars {
			hi = max(hi, x.value)
			if x.value > 0 {
				lo = min(lo, x.value)
			}
		}
		scale := func(v float64) float64 {
			if hi <= 0 || v <= 0 {
				return 0
			}
			if !logScale {
				return barW * v / hi
			}
			l0 := math.Floor(math.Log10(lo))
			return barW * (math.Log10(v) - l0 + 0.2) / (math.Log10(hi) - l0 + 0.2)
		}
		for _, x := range bars {
			label := x.label
			if len(label) > 95 {
				label = label[:92] + "…"
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-6, y+12, esc(label))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y+2, scale(x.value), rowH-4, colour[x.role])
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s %s</text>`+"\n", float64(labelW)+scale(x.value)+4, y+12, num(x.value), unit)
			y += rowH
		}
		y += 24
	}
	panel("Lock hand-off, p50 (µs, log scale; lower is better)", handoff, true, "µs")
	panel("Contention on one key, hold 1 ms (acquisitions/s; higher is better)", contend, false, "/s")
	x := 10
	for _, k := range []string{bench.RoleWarden, bench.RolePeer, bench.RoleRaw} {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y, colour[k], x+16, y+10, k)
		x += 90
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func num(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
