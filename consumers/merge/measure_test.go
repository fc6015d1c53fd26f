package merge

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

// TestBenchGenerateLarge writes the size-measurement run (8 ranks x 2,000 points, 4 raw samples per
// rank-point, protocol, execution evidence, warmup ledgers, engine blocks) and probe replies for every
// rank to $FPMBUS_BENCH_GEN_DIR. It is skipped unless that variable is set:
//
//	FPMBUS_BENCH_GEN_DIR=/tmp/bench8x2000 go test ./consumers/merge -run TestBenchGenerateLarge
//	/usr/bin/time -v fpmbus bench merge /tmp/bench8x2000/benchmark_results*.json --probe /tmp/bench8x2000/probe.json
func TestBenchGenerateLarge(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("FPMBUS_BENCH_GEN_DIR")
	if dir == "" {
		t.Skip("set FPMBUS_BENCH_GEN_DIR to generate the 8 x 2,000-point run")
	}
	spec := runSpec{runID: "9e1d3c5b7a9f1e3d5c7b9a1f3e5d7c9b", grid: "grid-large-8x2000", size: 8, points: 2000, raw: 4,
		protocol: true, exec: true, engine: true}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var total int64
	for r, rf := range spec.rankFiles() {
		path := filepath.Join(dir, filepath.Base(spec.path(r)))
		if err := os.WriteFile(path, rf.Data, 0o644); err != nil {
			t.Fatal(err)
		}
		total += int64(len(rf.Data))
	}
	var replies []any
	for r := range spec.size {
		replies = append(replies, workerReply(r, 0, 0, 0, 0, mla(""), layers))
	}
	p := v(replies)
	if err := os.WriteFile(filepath.Join(dir, "probe.json"), schemas.AppendBenchJSON(nil, &p), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d rank files, %d bytes in all, to %s", spec.size, total, dir)
}

// TestBenchMergeLarge merges the run in $FPMBUS_BENCH_GEN_DIR in-process (for profiling:
// -cpuprofile/-memprofile). Skipped unless the variable is set.
func TestBenchMergeLarge(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("FPMBUS_BENCH_GEN_DIR")
	if dir == "" {
		t.Skip("set FPMBUS_BENCH_GEN_DIR")
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "benchmark_results*.json"))
	var ranks []RankFile
	for _, p := range paths {
		p := p
		ranks = append(ranks, RankFile{Rank: rankFromPath(p), Path: p, Load: func() ([]byte, error) { return os.ReadFile(p) }})
	}
	res, err := Merge(ranks, nil, Options{MergedPath: filepath.Join(t.TempDir(), "merged.json"), RequireAllRanks: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := WriteResult(res); err != nil {
		t.Fatal(err)
	}
}
