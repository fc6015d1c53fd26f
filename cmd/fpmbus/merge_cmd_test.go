package main

import (
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
)

// --merge-partition I/N is a deprecated alias: it sets the partition count N unless
// --merge-partitions is given, and a malformed value is still a usage error naming it.
func TestMergeDeprecatedPartitionFlag(t *testing.T) {
	for name, tc := range map[string]struct {
		prefix string
		args   []string
		want   int
		err    bool
	}{
		"default":                         {args: nil, want: 1},
		"partitions":                      {args: []string{"--merge-partitions", "4"}, want: 4},
		"deprecated I/N sets N":           {args: []string{"--merge-partition", "1/3"}, want: 3},
		"explicit partitions win":         {args: []string{"--merge-partitions", "2", "--merge-partition", "1/3"}, want: 2},
		"deprecated in up":                {prefix: flagprefix.Merge, args: []string{"--merge-partition", "0/5"}, want: 5},
		"malformed deprecated value":      {args: []string{"--merge-partition", "x"}, err: true},
		"index out of range":              {args: []string{"--merge-partition", "3/3"}, err: true},
		"zero partitions":                 {args: []string{"--merge-partitions", "0"}, err: true},
		"pinned ttl below the minimum":    {args: []string{"--merge-pinned-ttl", "1s"}, err: true},
		"member id is an option, not cfg": {args: []string{"--merge-member-id", "m7"}, want: 1},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("merge", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o := mergeFlags(fs, tc.prefix)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.config()
			switch {
			case tc.err && !errors.Is(err, errUsage):
				t.Fatalf("got %v, want a usage error", err)
			case !tc.err && err != nil:
				t.Fatal(err)
			case !tc.err && cfg.Partitions != tc.want:
				t.Fatalf("partitions %d, want %d", cfg.Partitions, tc.want)
			}
		})
	}
}

// `bench merge` names its output as Dynamo's self-benchmark does, from the configured output path (rank
// 0's file) and the first rank merged: the whole run writes <stem>_merged<ext>, a node-local merge of
// the ranks from 2 writes <stem>_dp2_merged<ext>; the sidecar is the merged stem + _worker_probe.
func TestBenchMergeDefaultOutputIsDynamos(t *testing.T) {
	src := filepath.Join("..", "..", "consumers", "merge", "testdata", "golden", "protocol_4rank")
	for name, tc := range map[string]struct {
		files  []string
		args   []string
		merged string
	}{
		"whole run": {files: []string{"benchmark_results.json", "benchmark_results_dp1.json", "benchmark_results_dp2.json", "benchmark_results_dp3.json"},
			merged: "benchmark_results_merged.json"},
		"ranks 2 and 3 of a node": {files: []string{"benchmark_results_dp3.json", "benchmark_results_dp2.json"}, args: []string{"--partial-ranks"},
			merged: "benchmark_results_dp2_merged.json"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			args := append([]string{"bench", "merge"}, tc.args...)
			for _, f := range tc.files {
				body, err := os.ReadFile(filepath.Join(src, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), body, 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, filepath.Join(dir, f))
			}
			if code, out := run(t, args...); code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			want := filepath.Join(dir, tc.merged)
			body, err := os.ReadFile(want)
			if err != nil {
				t.Fatalf("no merged artefact at Dynamo's path: %v", err)
			}
			var doc struct {
				MergedOutputPath string `json:"merged_output_path"`
				WorkerProbePath  string `json:"worker_probe_path"`
			}
			if err := json.Unmarshal(body, &doc); err != nil {
				t.Fatal(err)
			}
			probe := strings.TrimSuffix(want, ".json") + "_worker_probe.json"
			if doc.MergedOutputPath != want || doc.WorkerProbePath != probe {
				t.Fatalf("merged_output_path %q, worker_probe_path %q; want %q, %q", doc.MergedOutputPath, doc.WorkerProbePath, want, probe)
			}
			if _, err := os.Stat(probe); err != nil {
				t.Fatalf("sidecar: %v", err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != len(tc.files)+2 {
				t.Fatalf("%d files in the output directory, want the ranks, the merged artefact and its sidecar", len(entries))
			}
		})
	}
}
