package bench

import "testing"

// BenchmarkAll runs every case as a sub-benchmark:
// go test -run '^$' -bench . -benchtime 2s
func BenchmarkAll(b *testing.B) {
	for _, c := range Cases() {
		b.Run(c.Group+"/"+c.Name, c.Run)
	}
}
