package merge

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/golden"
	"github.com/fpmbus/fpmbus/schemas"
)

var update = flag.Bool("update", false, "rewrite the golden inputs and outputs under testdata/golden (and schemas/testdata/bench)")

// goldenCase is one directory of testdata/golden: rank artefacts named as Dynamo names them, an optional
// probe.json, and the expected merged.golden.json and worker_probe.golden.json.
type goldenCase struct {
	name      string
	spec      runSpec
	mutate    func(docs []schemas.BenchNode) // applied to the generated artefacts before they are written
	ranks     []int                          // ranks written (default all)
	probe     func() schemas.BenchNode       // probe.json content, nil for none
	partial   bool                           // merge without RequireAllRanks
	noSidecar bool                           // the merged artefact has no engine block
}

var layers = []string{"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}

func mla(string) map[string]string {
	return map[string]string{layers[0]: "FLASH_ATTN_MLA", layers[1]: "FLASH_ATTN_MLA"}
}

var goldenCases = []goldenCase{
	{
		name:      "legacy_2rank",
		spec:      runSpec{runID: "5b1e0c7d9a2f4e6b8c0d1e2f3a4b5c6d", grid: "grid-legacy-7d41", size: 2, points: 3},
		noSidecar: true,
	},
	{
		name: "protocol_4rank",
		spec: runSpec{runID: "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b", grid: "grid-9c1f2e", size: 4, points: 4, raw: 3,
			protocol: true, exec: true, engine: true},
		probe: func() schemas.BenchNode {
			var replies []any
			for r := range 4 {
				replies = append(replies, workerReply(r, 0, 0, 0, 0, mla(""), layers))
			}
			return v(replies)
		},
	},
	{
		name: "engine_capture_failed",
		spec: runSpec{runID: "8d2c4b6a0e1f3a5c7e9b1d3f5a7c9e0b", grid: "grid-9c1f2e", size: 4, points: 2, raw: 2,
			protocol: true, exec: true, engine: true},
		mutate: func(docs []schemas.BenchNode) {
			// Rank 2's capture raised partway: the sub-blocks built so far plus capture_error.
			e := docs[2].Get("engine")
			partial := obj("attention", *e.Get("attention"), "kv_cache", *e.Get("kv_cache"),
				"capture_error", "AttributeError: 'NoneType' object has no attribute 'hf_config'")
			docs[2].Set("engine", partial)
			// Rank 3 ran an older image that captures no engine block at all.
			docs[3].Delete("engine")
		},
	},
	{
		name: "probe_rank0_only",
		spec: runSpec{runID: "1c3e5a7b9d0f2a4c6e8b0d2f4a6c8e0a", grid: "grid-9c1f2e", size: 4, points: 2, raw: 2,
			protocol: true, exec: true, engine: true},
		probe: func() schemas.BenchNode {
			return obj("schema", probeRepliesSchema, "run_id", "1c3e5a7b9d0f2a4c6e8b0d2f4a6c8e0a",
				"replies", []any{workerReply(0, 0, 0, 0, 0, mla(""), layers)}, "error", nil)
		},
	},
	{
		name: "mixed_attention",
		spec: runSpec{runID: "6e8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e", grid: "grid-9c1f2e", size: 2, points: 2, raw: 2,
			protocol: true, exec: true, engine: true},
		probe: func() schemas.BenchNode {
			r0 := map[string]string{layers[0]: "FLASHINFER_MLA", layers[1]: "TRITON_ATTN"}
			r1 := map[string]string{layers[0]: "FLASH_ATTN", layers[1]: "TRITON_ATTN"}
			return v([]any{workerReply(0, 0, 0, 0, 0, r0, layers), workerReply(1, 0, 0, 0, 0, r1, layers)})
		},
	},
	{
		name: "node_local_ranks_0_1",
		spec: runSpec{runID: "0a2c4e6b8d0f1a3c5e7b9d1f3a5c7e9b", grid: "grid-9c1f2e", size: 4, points: 2, raw: 2,
			protocol: true, exec: true, engine: true},
		ranks:   []int{0, 1},
		partial: true,
	},
}

func goldenDir(name string) string { return filepath.Join("testdata", "golden", name) }

func writeGoldenInputs(t *testing.T, c goldenCase) {
	t.Helper()
	dir := goldenDir(c.name)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	docs := c.spec.build()
	if c.mutate != nil {
		c.mutate(docs)
	}
	ranks := c.ranks
	if ranks == nil {
		for r := range docs {
			ranks = append(ranks, r)
		}
	}
	for _, r := range ranks {
		path := filepath.Join(dir, filepath.Base(c.spec.path(r)))
		if err := os.WriteFile(path, schemas.AppendBenchJSON(nil, &docs[r]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if c.probe != nil {
		p := c.probe()
		if err := os.WriteFile(filepath.Join(dir, "probe.json"), schemas.AppendBenchJSON(nil, &p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// loadGoldenInputs reads a case directory as `fpmbus bench merge` would, recording the producer's /tmp
// paths in rank_files.
func loadGoldenInputs(t testing.TB, dir string) ([]RankFile, []ProbeReplies) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ranks []RankFile
	var probes []ProbeReplies
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		switch {
		case name == "probe.json":
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			p, err := parseProbeReplies(b, path)
			if err != nil {
				t.Fatal(err)
			}
			probes = append(probes, p)
		case strings.HasPrefix(name, "benchmark_results") && !strings.Contains(name, "golden"):
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			ranks = append(ranks, RankFile{Rank: rankFromPath(name), Path: "/tmp/" + name, Data: b})
		}
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i].Path < ranks[j].Path })
	return ranks, probes
}

func TestBenchGolden(t *testing.T) {
	t.Parallel()
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			if *update {
				writeGoldenInputs(t, c)
			}
			dir := goldenDir(c.name)
			ranks, probes := loadGoldenInputs(t, dir)
			// Out of order on purpose: the reference is the lowest rank whatever the order.
			for i, j := 0, len(ranks)-1; i < j; i, j = i+1, j-1 {
				ranks[i], ranks[j] = ranks[j], ranks[i]
			}
			res, err := Merge(ranks, probes, Options{RequireAllRanks: !c.partial})
			if err != nil {
				t.Fatalf("merge: %v", err)
			}
			merged := schemas.AppendBenchJSON(nil, res.Merged)
			golden.Check(t, filepath.Join(dir, "merged.golden.json"), merged, *update)
			validateAgainstSchema(t, schemas.BenchMergedSchemaFile, merged)
			if c.noSidecar {
				if res.Sidecar != nil || res.Merged.Has("worker_probe_path") {
					t.Fatalf("a merged artefact without an engine block must have no sidecar and no worker_probe_path")
				}
				return
			}
			if res.Sidecar == nil {
				t.Fatalf("no sidecar for a merged artefact with an engine block")
			}
			side := schemas.AppendBenchJSON(nil, res.Sidecar)
			golden.Check(t, filepath.Join(dir, "worker_probe.golden.json"), side, *update)
			validateAgainstSchema(t, schemas.BenchWorkerProbeSchemaFile, side)
			if got, _ := res.Sidecar.Get("run_id").Text(); got != res.RunID {
				t.Fatalf("sidecar run_id %q, merged %q", got, res.RunID)
			}
			if p, _ := res.Merged.Get("worker_probe_path").Text(); p != res.SidecarPath || p != "/tmp/benchmark_results_merged_worker_probe.json" {
				t.Fatalf("worker_probe_path %q, sidecar path %q", p, res.SidecarPath)
			}
		})
	}
	if *update {
		copySchemaExamples(t)
	}
}

func validateAgainstSchema(t *testing.T, schemaFile string, doc []byte) {
	t.Helper()
	if err := schemas.ValidateBenchDocument(schemaFile, doc); err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
}

// copySchemaExamples refreshes the example documents the schemas package validates.
func copySchemaExamples(t *testing.T) {
	dst := filepath.Join("..", "..", "schemas", "testdata", "bench")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	copies := map[string]string{
		"legacy_2rank/benchmark_results_dp1.json":        "rank-legacy.json",
		"legacy_2rank/merged.golden.json":                "merged-legacy.json",
		"protocol_4rank/benchmark_results_dp1.json":      "rank-protocol.json",
		"protocol_4rank/merged.golden.json":              "merged-protocol.json",
		"protocol_4rank/probe.json":                      "probe-replies.json",
		"probe_rank0_only/worker_probe.golden.json":      "worker-probe-rank0-only.json",
		"engine_capture_failed/merged.golden.json":       "merged-capture-failed.json",
		"engine_capture_failed/worker_probe.golden.json": "worker-probe-no-replies.json",
	}
	for src, name := range copies {
		b, err := os.ReadFile(filepath.Join("testdata", "golden", src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
