package merge

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

// FuzzBenchArtifact feeds arbitrary bytes to the artefact parser and the merge rules, as a run's only
// rank, as rank 1 next to a valid rank 0, and as probe replies. Whatever the input, the merge returns a
// result or an error (a *RejectError for anything that parses as JSON), never panics, and a result is
// always a valid merged document. Seeded with the generator's own artefacts and testdata/golden.
func FuzzBenchArtifact(f *testing.F) {
	// Small seeds (compact JSON, one or two points): Go's fuzzing engine slows to a crawl on inputs of
	// tens of kilobytes, and the golden tests cover full-size artefacts.
	small := runSpec{runID: "fuzz-run", grid: "g", size: 2, points: 1, raw: 2, protocol: true, exec: true, engine: true}
	base := compactFiles(small.rankFiles())
	for _, rf := range base {
		f.Add(rf.Data)
	}
	legacy := compactFiles(runSpec{runID: "fuzz-run", grid: "g", size: 2, points: 2}.rankFiles())
	f.Add(legacy[1].Data)
	if b, err := os.ReadFile(filepath.Join("testdata", "golden", "probe_rank0_only", "probe.json")); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"schema_version":2,"run_id":"r","grid_digest":"g","dp":{"rank":0,"size":1}}`))
	f.Add([]byte(`[{"dp_rank":0,"worker_rank":0,"tp_rank":0,"attention_backends":{"l":"X"},"cudagraph_capture_sizes_resolved":[1]}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(res *result, err error) {
			if err != nil {
				var rej *RejectError
				if _, perr := schemas.ParseBenchJSON(data); perr == nil && !errors.As(err, &rej) {
					t.Fatalf("a JSON input was refused without a rule: %v", err)
				}
				return
			}
			if !res.Merged.IsObject() {
				t.Fatalf("merged artefact is not an object")
			}
			if _, perr := schemas.ParseBenchJSON(schemas.AppendBenchJSON(nil, res.Merged)); perr != nil {
				t.Fatalf("merged output does not parse: %v", perr)
			}
		}
		check(Merge([]RankFile{{Rank: -1, Path: "fuzz.json", Data: data}}, nil, Options{}))
		check(Merge([]RankFile{base[0], {Rank: 1, Path: "fuzz_dp1.json", Data: data}}, nil, Options{RequireAllRanks: true}))
		if pr, err := parseProbeReplies(data, "fuzz"); err == nil {
			res, err := Merge(base, []ProbeReplies{pr}, Options{RequireAllRanks: true})
			if err != nil {
				t.Fatalf("base run no longer merges: %v", err)
			}
			if _, perr := schemas.ParseBenchJSON(schemas.AppendBenchJSON(nil, res.Sidecar)); perr != nil {
				t.Fatalf("sidecar output does not parse: %v", perr)
			}
		}
	})
}

// compactFiles re-renders rank files as compact JSON.
func compactFiles(files []RankFile) []RankFile {
	for i := range files {
		doc, err := schemas.ParseBenchJSON(files[i].Data)
		if err != nil {
			panic(err)
		}
		files[i].Data = schemas.AppendBenchCompact(nil, doc)
	}
	return files
}
