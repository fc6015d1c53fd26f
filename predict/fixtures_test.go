package predict

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

var update = flag.Bool("update", false, "rewrite testdata/fpm_datasets.jsonl and testdata/answers.golden.jsonl")

// The fixture bucket (testdata/fpm_datasets.jsonl) is a dump of FPM_DATASETS, one entry a line:
// {"key", "revision", "value"} with the value's bytes as the sealer stores them (json.Marshal of a
// schemas.SealedCell, of a schemas.Campaign). fixtureEntries below is its source; TestFixtureFileIsTheSource
// keeps the two equal, and `go test ./predict -run TestFixtureFileIsTheSource -update` rewrites it.
const fixturePath = "testdata/fpm_datasets.jsonl"

// Fixture cells.
//
// gridA (model-a, tp4): prefill at 1, 2 and 4 requests × 128 and 512 tokens per request × 0 and 1024
// cached KV tokens per request (a full tensor grid per request); decode at 1, 8 and 32 requests × 1024
// and 4096 KV tokens per request. Latencies are a table, not a formula, so that interpolation between
// them is not trivially the formula.
var (
	prefillA = map[[3]int64]float64{ // (requests, tokens/request, kv/request) -> ms
		{1, 128, 0}: 10, {1, 512, 0}: 22, {1, 128, 1024}: 14, {1, 512, 1024}: 30,
		{2, 128, 0}: 12, {2, 512, 0}: 34, {2, 128, 1024}: 20, {2, 512, 1024}: 50,
		{4, 128, 0}: 16, {4, 512, 0}: 58, {4, 128, 1024}: 30, {4, 512, 1024}: 90,
	}
	decodeA = map[[2]int64]float64{ // (requests, kv/request) -> ms
		{1, 1024}: 6, {1, 4096}: 8,
		{8, 1024}: 7, {8, 4096}: 12,
		{32, 1024}: 10, {32, 4096}: 26,
	}
)

func fixtureIdentity(model string, tp int) schemas.CellIdentity {
	return schemas.CellIdentity{SchemaVersion: schemas.DatasetSchemaVersion, Model: model, Hardware: "H200-SXM",
		Backend: "vllm", BackendVersion: "0.29.0", Quantization: "fp8", KVCacheDType: "auto",
		Parallelism:       schemas.Parallelism{TP: tp, PP: 1, DP: 1, MoETP: tp, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{"attention_backend": "auto", "cudagraph_mode": "FULL_AND_PIECEWISE"},
		ProfileName:       "fixture", ProfileVersion: "1", SettingsDigest: strings.Repeat("5e", 32)}
}

func prefillRow(n, perTok, perKV int64, ms float64) schemas.Row {
	return schemas.Row{Phase: schemas.PhasePrefill, NumPrefillRequests: n, SumPrefillTokens: n * perTok, SumPrefillKVTokens: n * perKV, LatencyMS: ms}
}

func decodeRow(n, perKV int64, ms float64) schemas.Row {
	return schemas.Row{Phase: schemas.PhaseDecode, NumDecodeRequests: n, SumDecodeKVTokens: n * perKV, LatencyMS: ms}
}

// sealed builds the value the sealer stores for a cell of rows.
func sealed(id schemas.CellIdentity, runID, campaign string, rows []schemas.Row) schemas.SealedCell {
	c := schemas.Cell{Identity: id, Rows: rows, Provenance: schemas.Provenance{RunID: runID, GridDigest: "grid-" + runID,
		ArtefactDigest: schemas.SHA256Hex([]byte(runID))}}
	schemas.SortRows(c.Rows)
	c.Finish()
	return schemas.SealedCell{SchemaVersion: schemas.DatasetSchemaVersion, Key: c.Key, Identity: c.Identity, Provenance: c.Provenance,
		Rows: c.Rows, AttemptID: schemas.SHA256Hex([]byte("attempt-" + runID))[:32], CampaignID: campaign,
		Source: "fpmbus seal", SealedAtUnixMS: 1767225600000}
}

type fixtureEntry struct {
	Key      string          `json:"key"`
	Revision uint64          `json:"revision"`
	Value    json.RawMessage `json:"value"`
}

// Fixture keys, set by fixtureEntries.
var keyA, keyB, keyCorrupt, keyClamp string

func fixtureEntries(t testing.TB) []fixtureEntry {
	var rowsA []schemas.Row
	for k, ms := range prefillA {
		rowsA = append(rowsA, prefillRow(k[0], k[1], k[2], ms))
	}
	for k, ms := range decodeA {
		rowsA = append(rowsA, decodeRow(k[0], k[1], ms))
	}
	cellA := sealed(fixtureIdentity("fixture/model-a", 4), "run-a", "camp-complete", rowsA)
	// model-a at tp8: prefill only (its decode surface is absent), in a partial campaign.
	cellB := sealed(fixtureIdentity("fixture/model-a", 8), "run-b", "camp-partial",
		[]schemas.Row{prefillRow(1, 128, 0, 9), prefillRow(1, 512, 0, 19)})
	// model-c: a sealed value altered after sealing (one latency changed): its digest no longer matches.
	cellC := sealed(fixtureIdentity("fixture/model-c", 4), "run-c", "camp-complete",
		[]schemas.Row{prefillRow(1, 128, 0, 10), decodeRow(1, 1024, 6)})
	cellC.Rows[0].LatencyMS = 11
	// model-d: a decode surface that dips with context at 4 requests (noise): the marginal clamps.
	cellD := sealed(fixtureIdentity("fixture/model-d", 4), "run-d", "camp-complete",
		[]schemas.Row{prefillRow(1, 128, 0, 10), decodeRow(4, 1024, 9), decodeRow(4, 2048, 8)})
	keyA, keyB, keyCorrupt, keyClamp = cellA.Key, cellB.Key, cellC.Key, cellD.Key
	complete := schemas.Campaign{SchemaVersion: 1, CampaignID: "camp-complete", PlanDigest: strings.Repeat("c1", 32), State: schemas.CampaignComplete,
		UpdatedAtUnixMS: 1767225600000, Cells: []schemas.CampaignCell{
			{Key: cellA.Key, State: schemas.CellSealed, RunID: "run-a", DatasetDigest: cellA.Provenance.DatasetDigest},
			{Key: cellC.Key, State: schemas.CellSealed, RunID: "run-c", DatasetDigest: schemas.SHA256Hex([]byte("run-c"))},
			{Key: cellD.Key, State: schemas.CellSealed, RunID: "run-d", DatasetDigest: cellD.Provenance.DatasetDigest}}}
	partial := schemas.Campaign{SchemaVersion: 1, CampaignID: "camp-partial", PlanDigest: strings.Repeat("p1", 32), State: schemas.CampaignPartial,
		UpdatedAtUnixMS: 1767225600000, Cells: []schemas.CampaignCell{
			{Key: cellB.Key, State: schemas.CellSealed, RunID: "run-b", DatasetDigest: cellB.Provenance.DatasetDigest},
			{Key: "cell." + strings.Repeat("0", 64), State: schemas.CellMissing, Reason: "latency_invalid"}}}
	// Each campaign record as the sealer writes it: its frozen plan (every cell pending), then the
	// record the seals made of it.
	frozen := func(c schemas.Campaign) schemas.Campaign {
		c.State, c.Cells = schemas.CampaignOpen, slices.Clone(c.Cells)
		for i := range c.Cells {
			c.Cells[i] = schemas.CampaignCell{Key: c.Cells[i].Key, State: schemas.CellPending}
		}
		return c
	}
	var out []fixtureEntry
	for i, v := range []any{cellA, cellB, cellC, cellD, frozen(complete), complete, frozen(partial), partial} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		key := ""
		switch x := v.(type) {
		case schemas.SealedCell:
			key = x.Key
		case schemas.Campaign:
			key = schemas.CampaignKeyPrefix + x.CampaignID
		}
		out = append(out, fixtureEntry{Key: key, Revision: uint64(i + 1), Value: b})
	}
	return out
}

func encodeEntries(t testing.TB, es []fixtureEntry) []byte {
	var b bytes.Buffer
	for _, e := range es {
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// readFixture reads the bucket dump at path as Updates.
func readFixture(t testing.TB, path string) []Update {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var us []Update
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e fixtureEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		us = append(us, Update{Key: e.Key, Revision: e.Revision, Value: e.Value})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return us
}

// fixture is the snapshot of the fixture bucket.
func fixture(t testing.TB) *Snapshot {
	t.Helper()
	fixtureEntries(t) // sets the keys
	return (*Snapshot)(nil).Apply(readFixture(t, fixturePath)...)
}

func TestFixtureFileIsTheSource(t *testing.T) {
	want := encodeEntries(t, fixtureEntries(t))
	if *update {
		if err := os.MkdirAll(filepath.Dir(fixturePath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fixturePath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from fixtureEntries: run go test ./predict -run TestFixtureFileIsTheSource -update", fixturePath)
	}
	// The valid cells pass the sealer's own validation; the altered one fails only on its digest.
	for _, u := range readFixture(t, fixturePath) {
		if !strings.HasPrefix(u.Key, schemas.CellKeyPrefix) {
			continue
		}
		var v schemas.SealedCell
		if err := json.Unmarshal(u.Value, &v); err != nil {
			t.Fatal(err)
		}
		errs := schemas.ValidateCell(&schemas.Cell{Key: v.Key, Identity: v.Identity, Provenance: v.Provenance, Rows: v.Rows}, v.SchemaVersion)
		switch {
		case u.Key == keyCorrupt && (len(errs) != 1 || errs[0].Rule != schemas.RuleDigest):
			t.Fatalf("corrupt fixture: want exactly a digest mismatch, got %v", errs)
		case u.Key != keyCorrupt && len(errs) != 0:
			t.Fatalf("fixture %s: %v", u.Key, errs)
		}
	}
}
