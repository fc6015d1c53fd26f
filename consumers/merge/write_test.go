package merge

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func TestBenchWriteResultOrderAndStaleSidecar(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	merged := filepath.Join(dir, "benchmark_results_merged.json")
	sidecar := SidecarPathFor(merged)
	stale := []byte(`{"schema":"dynamo.fpm.benchmark_worker_probe","run_id":"an-earlier-run"}`)

	// A legacy run has no engine block: the earlier run's sidecar is removed and none is written.
	if err := os.WriteFile(sidecar, stale, 0o644); err != nil {
		t.Fatal(err)
	}
	legacy, err := Merge(runSpec{runID: "legacy", grid: "g", size: 2, points: 2}.rankFiles(), nil, Options{MergedPath: merged, RequireAllRanks: true})
	if err != nil {
		t.Fatal(err)
	}
	digest, size, err := WriteResult(legacy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sidecar); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the earlier run's sidecar survived: %v", err)
	}
	b, _ := os.ReadFile(merged)
	if schemas.SHA256Hex(b) != digest || int64(len(b)) != size {
		t.Fatalf("digest/size do not describe the file")
	}

	// A run with an engine block: the sidecar is written after the merged artefact, same run_id.
	if err := os.WriteFile(sidecar, stale, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Merge(ruleBase.rankFiles(), nil, Options{MergedPath: merged, RequireAllRanks: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := WriteResult(res); err != nil {
		t.Fatal(err)
	}
	var side schemas.WorkerProbeSidecar
	sb, _ := os.ReadFile(sidecar)
	if err := json.Unmarshal(sb, &side); err != nil || side.RunID != ruleBase.runID || side.MergedOutputPath != merged {
		t.Fatalf("sidecar %+v (%v)", side, err)
	}
	mi, _ := os.Stat(merged)
	si, _ := os.Stat(sidecar)
	if si.ModTime().Before(mi.ModTime()) {
		t.Fatalf("sidecar written before the merged artefact")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Fatalf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestBenchPathsAndPartitions(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{
		"/tmp/benchmark_results.json": -1, "/tmp/benchmark_results_dp3.json": 3, "b_dp12.json": 12, "x_dpx.json": -1,
	} {
		if got := RankFromPath(in); got != want {
			t.Errorf("RankFromPath(%s) = %d, want %d", in, got, want)
		}
	}
	if got := MergedPathFor("/tmp/benchmark_results.json"); got != DefaultMergedPath {
		t.Errorf("MergedPathFor: %s", got)
	}
	if got := MergedPathFor("/tmp/benchmark_results_dp4.json"); got != "/tmp/benchmark_results_merged.json" {
		t.Errorf("MergedPathFor dp4: %s", got)
	}
	if got := SidecarPathFor(DefaultMergedPath); got != "/tmp/benchmark_results_merged_worker_probe.json" {
		t.Errorf("SidecarPathFor: %s", got)
	}
	if got := ExpandPath("/o/r_{run_id}_merged.json", "a/b c"); got != "/o/r_a%2Fb%20c_merged.json" {
		t.Errorf("ExpandPath: %s", got)
	}
	// Runs spread evenly over the merger group's partitions, a run's ranks and probe replies together.
	var cfg Config
	cfg.Partitions = 4
	group := cfg.Group()
	counts := [4]int{}
	for i := range 4000 {
		run := "3f6a0c1e-run-" + strconv.Itoa(i)
		p, err := group.PartitionOf(streams.BenchRankSubject(run, i%8))
		if err != nil {
			t.Fatal(err)
		}
		if pp, _ := group.PartitionOf(streams.BenchProbeSubject(run)); pp != p {
			t.Fatalf("run %s: rank %d in partition %d, probe replies in %d", run, i%8, p, pp)
		}
		counts[p]++
	}
	for p, n := range counts {
		if n < 800 || n > 1200 {
			t.Errorf("partition %d owns %d of 4000 runs", p, n)
		}
	}
}

// The output template leaves room for every run_id streams.CheckRunID accepts: a template whose file
// name (or whose sidecar's temporary file name, or whose path) a longest run_id would push over the
// file system's limits is refused, naming the template.
func TestCheckOutputTemplateLeavesRoomForTheLongestRunID(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		template string
		ok       bool
	}{
		"the default":            {DefaultOutputTemplate, true},
		"the run in a directory": {"/var/lib/fpmbus/bench/" + RunIDPlaceholder + "/merged.json", true},
		// The sidecar's temporary name: x… + 128 + "_merged_worker_probe.json" + ".tmp-" + 10 digits.
		"255 bytes in the longest name":     {"/out/" + strings.Repeat("x", 255-128-25-15) + RunIDPlaceholder + "_merged.json", true},
		"256 bytes in the longest name":     {"/out/" + strings.Repeat("x", 256-128-25-15) + RunIDPlaceholder + "_merged.json", false},
		"a path over PATH_MAX":              {strings.Repeat("/d", 2000) + "/" + RunIDPlaceholder + ".json", false},
		"a long directory of its own is ok": {"/" + strings.Repeat("d", 255) + "/" + RunIDPlaceholder + ".json", true},
	} {
		err := CheckOutputTemplate(tc.template)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok %v", name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.template) {
			t.Errorf("%s: %v does not name the template", name, err)
		}
	}
}

// A name too long for the file system is the one write failure classed permanent: what the atomic
// write of such a name returns is recognised, and a missing directory (which may be created) is not.
func TestPermanentIsANameTooLong(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	err := fsutil.WriteFileAtomic(filepath.Join(dir, strings.Repeat("n", 300)+".json"), []byte("{}"), 0o644)
	if err == nil || !permanent(err) {
		t.Fatalf("writing a 305-byte name: %v, want a permanent error", err)
	}
	if err := fmt.Errorf("merge: write merged artefact: %w", os.ErrNotExist); permanent(err) {
		t.Fatalf("%v is not permanent", err)
	}
}
