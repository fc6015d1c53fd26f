package seal

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

const goldenMerged = "../merge/testdata/golden/protocol_4rank/merged.golden.json"

var testProfile = &schemas.CollectionProfile{SchemaVersion: 1, Name: "default", Version: "1", Hardware: "H200-SXM",
	Settings: map[string]any{"clocks": "locked", "exclusive": true}}

func TestFromMergedGolden(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(goldenMerged)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := FromMerged(doc, schemas.SHA256Hex(doc), testProfile)
	if err != nil {
		t.Fatal(err)
	}
	if errs := ds.Validate(); errs != nil {
		t.Fatal(errs)
	}
	var m struct {
		RunID  string `json:"run_id"`
		Groups []struct {
			Point struct {
				Type string `json:"point_type"`
			} `json:"point"`
			WallTime float64 `json:"wall_time"`
		} `json:"iteration_groups"`
	}
	_ = json.Unmarshal(doc, &m)
	c := ds.Cells[0]
	if ds.RunID != m.RunID || len(c.Rows) != len(m.Groups) || c.Provenance.RowCount != len(m.Groups) {
		t.Fatalf("run %s rows %d, want %s and %d", ds.RunID, len(c.Rows), m.RunID, len(m.Groups))
	}
	// Latency is the max positive rank wall time, which the merger also records as the group wall time.
	var sumGroups, sumRows float64
	for _, g := range m.Groups {
		sumGroups += g.WallTime * 1000
	}
	for _, r := range c.Rows {
		sumRows += r.LatencyMS
	}
	if d := sumGroups - sumRows; d > 1e-6 || d < -1e-6 {
		t.Fatalf("latencies sum %v, group wall times sum %v", sumRows, sumGroups)
	}
	id := c.Identity
	if id.Model != "deepseek-ai/DeepSeek-V3" || id.Backend != "vllm" || id.BackendVersion != "0.29.0" || id.Quantization != "fp8" ||
		id.Parallelism.DP != 4 || id.Parallelism.MoEEP != 4 || id.BackendSelections["all2all_backend"] != "deepep_high_throughput" {
		t.Fatalf("identity: %+v", id)
	}
	// A new profile version is a new identity, which data sealed under the old one does not cover.
	p2 := *testProfile
	p2.Version = "2"
	ds2, _ := FromMerged(doc, schemas.SHA256Hex(doc), &p2)
	if ds2.Cells[0].Key == c.Key {
		t.Fatal("profile version did not change the key")
	}
	// No engine block: no identity, nothing to seal.
	legacy, _ := os.ReadFile("../merge/testdata/golden/legacy_2rank/merged.golden.json")
	if _, err := FromMerged(legacy, schemas.SHA256Hex(legacy), testProfile); !errors.Is(err, errNotSealable) {
		t.Fatalf("want ErrNotSealable, got %v", err)
	}
}

func TestConsumerSealsMergedArtefacts(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	doc, _ := os.ReadFile(goldenMerged)
	var hdr struct {
		RunID string `json:"run_id"`
	}
	_ = json.Unmarshal(doc, &hdr)
	profile, _ := json.Marshal(testProfile)
	if _, err := benchstore.PublishProfile(ctx, env.JS, hdr.RunID, profile); err != nil {
		t.Fatal(err)
	}
	publishMerged := func() {
		msg := nats.NewMsg(streams.BenchMergedSubject(hdr.RunID))
		msg.Data = doc
		msg.Header.Set(streams.HeaderBenchKind, streams.BenchKindMerged)
		msg.Header.Set(streams.HeaderBenchRun, hdr.RunID)
		msg.Header.Set(streams.HeaderBenchSHA256, schemas.SHA256Hex(doc))
		msg.Header.Set(streams.HeaderBenchSize, strconv.Itoa(len(doc)))
		if _, err := env.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	publishMerged()
	publishMerged() // a second copy (e.g. a re-merge): idempotent
	type res struct {
		rep *report
		err error
	}
	outcomes := make(chan res, 4)
	s, _ := NewSealer(kv, WithSource("fpmbus seal"))
	rc := startSealer(t, env, Config{Sealer: s, OutcomeHook: func(_ string, rep *report, err error) { outcomes <- res{rep, err} }})
	want := []string{sealed.String(), alreadySealed.String()}
	for i := range 2 {
		select {
		case r := <-outcomes:
			if r.err != nil || len(r.rep.Cells) != 1 || r.rep.Cells[0].State != want[i] {
				t.Fatalf("outcome %d: %+v %v", i, r.rep, r.err)
			}
		case <-ctx.Done():
			t.Fatal("no outcome")
		}
	}
	if err := rc.stop(t); err != nil {
		t.Fatal(err)
	}
	ks := keys(t, kv)
	if len(ks) != 2 { // the cell and the run's campaign record
		t.Fatalf("keys %v", ks)
	}
}
