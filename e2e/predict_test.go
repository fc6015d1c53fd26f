package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// From `bench publish` to a prediction through the real binaries and the real nats CLI: `fpmbus up`
// merges and seals a 4-rank run; `nats micro ls/info` discover the predict service; `nats req
// fpmpredict.predict` gets measured and interpolated answers computed from the sealed rows; a cell
// sealed afterwards (`fpmbus datasets publish`) is answered without a restart; a second instance
// (`fpmbus predict-service`) joins the queue group and shares the requests; `fpmbus datasets predict`
// exits 0 when every query is answered and 5 when one is refused.
func TestPredictServiceThroughNatsCLI(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	dir := t.TempDir()
	up := startUp(t, 1, "--merge-bench-output", filepath.Join(dir, "merged_{run_id}.json"))
	up.proc.waitOutput("predict service ready", 30*time.Second)
	nats := func(args ...string) string {
		t.Helper()
		out, err := run(t, 20*time.Second, natsBin, append([]string{"--server", up.url}, args...)...)
		if err != nil {
			t.Fatalf("nats %v: %v\n%s", args, err, out)
		}
		return out
	}

	// Seal the golden run's cell.
	golden := "../consumers/merge/testdata/golden/protocol_4rank"
	ranks, _ := filepath.Glob(filepath.Join(golden, "benchmark_results*.json"))
	profile := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e","version":"1","hardware":"H200-SXM"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, 60*time.Second, fpmbusBin, append([]string{"bench", "publish", "--server", up.url, "--profile", profile}, ranks...)...); err != nil {
		t.Fatalf("bench publish: %v\n%s", err, o)
	}
	js := jsClient(t, up.url)
	kv, err := js.KeyValue(context.Background(), streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	var cell schemas.SealedCell
	var cellRev uint64
	eventually(t, 60*time.Second, func() error {
		keys, err := kv.Keys(context.Background())
		if err != nil {
			return err
		}
		for _, k := range keys {
			if strings.HasPrefix(k, schemas.CellKeyPrefix) {
				e, err := kv.Get(context.Background(), k)
				if err != nil {
					return err
				}
				cellRev = e.Revision()
				return json.Unmarshal(e.Value(), &cell)
			}
		}
		return errors.New("no sealed cell yet")
	})

	// Discovery with the real CLI.
	if ls := nats("micro", "ls"); !strings.Contains(ls, service.Name) {
		t.Fatalf("nats micro ls:\n%s", ls)
	}
	var info struct { // `nats micro info --json` wraps the service's info reply in "info"
		Info struct {
			Name      string            `json:"name"`
			Metadata  map[string]string `json:"metadata"`
			Endpoints []struct {
				Name       string `json:"name"`
				Subject    string `json:"subject"`
				QueueGroup string `json:"queue_group"`
			} `json:"endpoints"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(nats("micro", "info", service.Name, "--json")), &info); err != nil {
		t.Fatal(err)
	}
	i := info.Info
	if i.Name != service.Name || len(i.Endpoints) != 2 || i.Endpoints[0].Subject != service.SubjectPredict ||
		i.Endpoints[0].QueueGroup != service.DefaultQueueGroup || i.Endpoints[1].Subject != service.SubjectCells || i.Metadata["bucket"] != streams.BucketDatasets {
		t.Fatalf("nats micro info: %+v", info)
	}

	// Answers through `nats req`, checked against the sealed rows.
	req := func(q string) predict.Answer {
		t.Helper()
		var a predict.Answer
		if err := json.Unmarshal([]byte(nats("req", "--raw", service.SubjectPredict, q)), &a); err != nil {
			t.Fatalf("nats req %s: %v", q, err)
		}
		return a
	}
	var d2, d8, p1 *schemas.Row
	for i, r := range cell.Rows {
		switch {
		case r.Phase == schemas.PhaseDecode && r.NumDecodeRequests == 2 && r.SumDecodeKVTokens == 1024:
			d2 = &cell.Rows[i]
		case r.Phase == schemas.PhaseDecode && r.NumDecodeRequests == 8 && r.SumDecodeKVTokens == 4096:
			d8 = &cell.Rows[i]
		case r.Phase == schemas.PhasePrefill && r.NumPrefillRequests == 1:
			p1 = &cell.Rows[i]
		}
	}
	if d2 == nil || d8 == nil || p1 == nil {
		t.Fatalf("the golden run's rows: %+v", cell.Rows)
	}
	a := req(fmt.Sprintf(`{"key":%q,"step":{"num_prefill_requests":1,"sum_prefill_tokens":%d}}`, cell.Key, p1.SumPrefillTokens))
	if a.Status != predict.StatusMeasured || *a.LatencyMS != p1.LatencyMS || a.Cell.Revision != cellRev || a.Cell.DatasetDigest != cell.Provenance.DatasetDigest {
		t.Fatalf("measured: %+v", a)
	}
	// 4 decode requests reading 2048 tokens: 512 per request like both rows, a third of the way from
	// 2 to 8 requests.
	a = req(fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":4,"sum_decode_kv_tokens":2048}}`, cell.Key))
	if want := d2.LatencyMS*2/3 + d8.LatencyMS/3; a.Status != predict.StatusInterpolated || math.Abs(*a.LatencyMS-want) > 1e-9 || len(a.Parts[0].Points) != 2 {
		t.Fatalf("interpolated: want %v, got %+v", want, a)
	}
	if a := req(fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":16,"sum_decode_kv_tokens":8192}}`, cell.Key)); a.LatencyMS != nil ||
		a.Refusal == nil || a.Refusal.Reason != predict.ReasonOutOfDomain || a.Refusal.Domain.Coordinate != "num_decode_requests" {
		t.Fatalf("out of domain: %+v", a)
	}

	// A cell sealed while the service runs is answered without a restart.
	late := schemas.Cell{Identity: cell.Identity, Provenance: schemas.Provenance{RunID: "e2e-late", GridDigest: "g", ArtefactDigest: strings.Repeat("ef", 32)},
		Rows: []schemas.Row{{Phase: schemas.PhaseDecode, NumDecodeRequests: 4, SumDecodeKVTokens: 4096, LatencyMS: 12.5}}}
	late.Identity.ProfileVersion = "2" // the same deployment collected under a new profile version: a new identity
	late.Finish()
	lateQuery, _ := json.Marshal(predict.Query{Identity: &late.Identity, Step: predict.Step{NumDecodeRequests: 4, SumDecodeKVTokens: 4096}})
	if a := req(string(lateQuery)); a.Refusal == nil || a.Refusal.Reason != predict.ReasonUnknownIdentity ||
		len(a.Refusal.Closest) != 1 || a.Refusal.Closest[0].Key != cell.Key || a.Refusal.Closest[0].Differs[0].Field != "profile_version" {
		t.Fatalf("before the seal: %+v", a.Refusal)
	}
	dsPath := filepath.Join(dir, "late.json")
	ds, _ := json.Marshal(schemas.Dataset{SchemaVersion: schemas.DatasetSchemaVersion, Kind: schemas.DatasetKind, RunID: "e2e-late", Cells: []schemas.Cell{late}})
	if err := os.WriteFile(dsPath, ds, 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, 30*time.Second, fpmbusBin, "datasets", "publish", "--server", up.url, dsPath); err != nil {
		t.Fatalf("datasets publish: %v\n%s", err, o)
	}
	eventually(t, 10*time.Second, func() error {
		if a := req(string(lateQuery)); a.Status != predict.StatusMeasured || *a.LatencyMS != 12.5 || a.Cell.Key != late.Key {
			return fmt.Errorf("%s %+v", a.Status, a.Refusal)
		}
		return nil
	})

	// A second instance joins the queue group; the requests are shared.
	second := fpmbus(t, "fpmbus predict-service", "predict-service", "--server", up.url)
	second.waitOutput("predict service ready", 30*time.Second)
	nats("req", "--count", "40", service.SubjectPredict, string(lateQuery))
	var stats []struct {
		ID        string `json:"id"`
		Endpoints []struct {
			Subject     string `json:"subject"`
			NumRequests int    `json:"num_requests"`
			NumErrors   int    `json:"num_errors"`
			Data        struct {
				Cells   int              `json:"cells"`
				Answers map[string]int64 `json:"answers"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(nats("micro", "stats", service.Name, "--json")), &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats) != 2 {
		t.Fatalf("nats micro stats: %d instances", len(stats))
	}
	total := 0
	for _, s := range stats {
		e := s.Endpoints[0]
		if e.Subject != service.SubjectPredict || e.NumRequests == 0 || e.NumErrors != 0 || e.Data.Cells != 2 {
			t.Fatalf("instance %s: %+v", s.ID, e)
		}
		total += e.NumRequests
	}
	if total < 40 {
		t.Fatalf("%d requests counted", total)
	}

	// The command: exit 0 when every query is answered, 5 when one is refused.
	qs := filepath.Join(dir, "queries.jsonl")
	good := fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":4,"sum_decode_kv_tokens":2048}}`, cell.Key)
	if err := os.WriteFile(qs, []byte(good+"\n"+string(lateQuery)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, 30*time.Second, fpmbusBin, "datasets", "predict", "--server", up.url, "--queries", qs); err != nil ||
		!strings.Contains(o, "interpolated") || !strings.Contains(o, "measured") {
		t.Fatalf("datasets predict: %v\n%s", err, o)
	}
	bad := fmt.Sprintf(`{"key":%q,"step":{"num_decode_requests":16,"sum_decode_kv_tokens":8192}}`, cell.Key)
	if err := os.WriteFile(qs, []byte(good+"\n"+bad+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := run(t, 30*time.Second, fpmbusBin, "datasets", "predict", "--server", up.url, "--queries", qs, "--json")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 || !strings.Contains(o, `"reason":"out_of_domain"`) {
		t.Fatalf("datasets predict with a refusal: %v\n%s", err, o)
	}
}
