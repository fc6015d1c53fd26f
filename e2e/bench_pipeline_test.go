package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

// The benchmark path through the real binaries: `fpmbus bench publish --profile` sends a 4-rank run and
// its collection profile; `fpmbus up` merges it (merged artefact + worker-probe sidecar on disk) and seals
// its cells in FPM_DATASETS, which the real `nats kv` CLI lists. Publishing the same run again changes
// nothing: every cell keeps exactly one revision.
func TestBenchPublishMergeAndSealThroughUp(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	out := t.TempDir()
	up := startUp(t, 1, "--merge-bench-output", filepath.Join(out, "merged_{run_id}.json"))
	golden := "../consumers/merge/testdata/golden/protocol_4rank"
	ranks, err := filepath.Glob(filepath.Join(golden, "benchmark_results*.json"))
	if err != nil || len(ranks) != 4 {
		t.Fatalf("rank fixtures: %v %v", ranks, err)
	}
	profile := filepath.Join(out, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e","version":"1","hardware":"H200-SXM","settings":{"clocks":"locked"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	publishRun := func() {
		args := append([]string{"bench", "publish", "--server", up.url, "--profile", profile}, ranks...)
		if o, err := run(t, 60*time.Second, fpmbusBin, args...); err != nil {
			t.Fatalf("bench publish: %v\n%s", err, o)
		}
	}
	publishRun()

	var merged string
	eventually(t, 60*time.Second, func() error {
		m, _ := filepath.Glob(filepath.Join(out, "merged_*.json"))
		for _, p := range m {
			if !strings.HasSuffix(p, "_worker_probe.json") {
				merged = p
			}
		}
		if merged == "" {
			return fmt.Errorf("no merged artefact in %s yet", out)
		}
		return nil
	})
	var doc struct {
		ArtifactType    string `json:"artifact_type"`
		RunID           string `json:"run_id"`
		WorkerProbePath string `json:"worker_probe_path"`
	}
	raw, err := os.ReadFile(merged)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.ArtifactType != "merged" || doc.RunID == "" {
		t.Fatalf("merged artefact %s: %v %+v", merged, err, doc)
	}
	// The merger writes the merged artefact first and its sidecar after it (so that a sidecar never sits
	// next to another run's merged artefact): the sidecar may follow a moment later.
	eventually(t, 30*time.Second, func() error {
		_, err := os.Stat(doc.WorkerProbePath)
		return err
	})

	// The sealer seals the run's cells; the nats CLI sees them in the bucket.
	var cells []string
	eventually(t, 60*time.Second, func() error {
		o, err := run(t, 20*time.Second, natsBin, "--server", up.url, "kv", "ls", streams.BucketDatasets)
		if err != nil {
			return fmt.Errorf("nats kv ls: %v: %s", err, o)
		}
		cells = cells[:0]
		for _, k := range strings.Fields(o) {
			if strings.HasPrefix(k, "cell.") {
				cells = append(cells, k)
			}
		}
		if len(cells) == 0 {
			return fmt.Errorf("no sealed cell yet:\n%s", o)
		}
		return nil
	})
	js := jsClient(t, up.url)
	kv, err := js.KeyValue(context.Background(), streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range cells {
		e, err := kv.Get(context.Background(), k)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		var sc struct {
			Key        string `json:"key"`
			Provenance struct {
				RunID string `json:"run_id"`
			} `json:"provenance"`
			Rows []struct {
				LatencyMS float64 `json:"latency_ms"`
			} `json:"rows"`
		}
		if err := json.Unmarshal(e.Value(), &sc); err != nil || sc.Key != k || sc.Provenance.RunID != doc.RunID || len(sc.Rows) == 0 {
			t.Fatalf("sealed cell %s: %v %s", k, err, e.Value())
		}
	}

	// Publishing the same run again: the merger and the sealer treat it as done; one revision per cell.
	publishRun()
	time.Sleep(2 * time.Second)
	for _, k := range cells {
		h, err := kv.History(context.Background(), k)
		if err != nil || len(h) != 1 {
			t.Fatalf("%s: %d revisions (%v), want 1", k, len(h), err)
		}
	}
}
