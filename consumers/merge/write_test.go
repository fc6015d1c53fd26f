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
	sidecar := sidecarPathFor(merged)
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
		if got := rankFromPath(in); got != want {
			t.Errorf("RankFromPath(%s) = %d, want %d", in, got, want)
		}
	}
	// Dynamo's _benchmark_merged_path: the configured path split by os.path.splitext, _dp<start> for a
	// worker whose ranks start above 0; the sidecar is the merged stem + _worker_probe.
	for _, c := range []struct {
		base          string
		start         int
		merged, probe string
	}{
		{"/tmp/benchmark_results.json", 0, defaultMergedPath, "/tmp/benchmark_results_merged_worker_probe.json"},
		{"/tmp/benchmark_results.json", 4, "/tmp/benchmark_results_dp4_merged.json", "/tmp/benchmark_results_dp4_merged_worker_probe.json"},
		{"/data/run.v2/bench", 0, "/data/run.v2/bench_merged", "/data/run.v2/bench_merged_worker_probe"},
		{"/data/.bench", 0, "/data/.bench_merged", "/data/.bench_merged_worker_probe"},
		{"/data/..x", 2, "/data/..x_dp2_merged", "/data/..x_dp2_merged_worker_probe"},
		{"/data/.a.json", 0, "/data/.a_merged.json", "/data/.a_merged_worker_probe.json"},
		{"out.tar.gz", 0, "out.tar_merged.gz", "out.tar_merged_worker_probe.gz"},
		{"b.", 0, "b_merged.", "b_merged_worker_probe."},
	} {
		if got := mergedPathFor(c.base, c.start); got != c.merged {
			t.Errorf("MergedPathFor(%s, %d) = %s, want %s", c.base, c.start, got, c.merged)
		}
		if got := sidecarPathFor(c.merged); got != c.probe {
			t.Errorf("SidecarPathFor(%s) = %s, want %s", c.merged, got, c.probe)
		}
	}
	for in, want := range map[string]string{"/tmp/b_dp4.json": "/tmp/b.json", "/tmp/b.json": "/tmp/b.json", "b_dp12": "b", "/x/.b_dp1.json": "/x/.b.json"} {
		if got := basePathOf(in); got != want {
			t.Errorf("BasePathOf(%s) = %s, want %s", in, got, want)
		}
	}
	if got := expandPath("/o/r_{run_id}_merged.json", "a/b c"); got != "/o/r_a%2Fb%20c_merged.json" {
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

// A rank file's name is read one way for its rank and for its base path: split as os.path.splitext
// splits the configured path (a dot file's leading dots start no extension), then the _dpN suffix.
func TestRankFileNamesSplitAsPython(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		path string
		rank int
		base string
	}{
		{".b_dp1", 1, ".b"},
		{"/data/.b_dp1", 1, "/data/.b"},
		{"/data/..b_dp2", 2, "/data/..b"},
		{"/data/.b_dp3.json", 3, "/data/.b.json"},
		{"/data/.b", -1, "/data/.b"},
		{"/data/.b_dp", -1, "/data/.b_dp"},
		{"/data/out.tar_dp1.gz", 1, "/data/out.tar.gz"},
		{"/data/b_dp1.", 1, "/data/b."},
		{"/data/b_dp1.tar.gz", -1, "/data/b_dp1.tar.gz"},
		{"/data/b_dp99999999999999999999.json", -1, "/data/b_dp99999999999999999999.json"},
		{"/data/run_dp1.d/bench.json", -1, "/data/run_dp1.d/bench.json"},
	} {
		if got := rankFromPath(c.path); got != c.rank {
			t.Errorf("RankFromPath(%s) = %d, want %d", c.path, got, c.rank)
		}
		if got := basePathOf(c.path); got != c.base {
			t.Errorf("BasePathOf(%s) = %s, want %s", c.path, got, c.base)
		}
	}
}

// A symbolic link (or other non-regular file) planted where the merger writes its artefact or sidecar,
// or removes a stale sidecar, is refused, naming it; it is neither written through nor replaced.
func TestBenchWriteResultRefusesNonRegularFiles(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"merged artefact", "stale sidecar"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			merged := filepath.Join(dir, "benchmark_results_merged.json")
			planted := merged
			if where == "stale sidecar" {
				planted = sidecarPathFor(merged)
			}
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, planted); err != nil {
				t.Fatal(err)
			}
			res, err := Merge(ruleBase.rankFiles(), nil, Options{MergedPath: merged, RequireAllRanks: true})
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = WriteResult(res)
			if !errors.Is(err, fsutil.ErrNotRegular) || !strings.Contains(err.Error(), planted) {
				t.Fatalf("err %v, want ErrNotRegular naming %s", err, planted)
			}
			if fi, err := os.Lstat(planted); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("the planted link was replaced: %v %v", fi, err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "precious" {
				t.Fatalf("written through the link: %q", b)
			}
		})
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
		err := checkOutputTemplate(tc.template)
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
