package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func testIdentity(model string) CellIdentity {
	return CellIdentity{SchemaVersion: DatasetSchemaVersion, Model: model, Hardware: "H200-SXM", Backend: "vllm",
		BackendVersion: "0.29.0", Quantization: "fp8", KVCacheDType: "auto",
		Parallelism:       Parallelism{TP: 4, PP: 1, DP: 1, MoETP: 4, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{"attention_backend": "auto"}, ProfileName: "default", ProfileVersion: "1",
		SettingsDigest: strings.Repeat("ab", 32)}
}

func testDataset() *Dataset {
	d := &Dataset{SchemaVersion: DatasetSchemaVersion, Kind: DatasetKind, RunID: "run-1"}
	for _, m := range []string{"m/a", "m/b"} {
		c := Cell{Identity: testIdentity(m), Provenance: Provenance{RunID: "run-1", GridDigest: "g", ArtefactDigest: strings.Repeat("0f", 32)},
			Rows: []Row{
				{Phase: PhasePrefill, NumPrefillRequests: 1, SumPrefillTokens: 128, LatencyMS: 20},
				{Phase: PhasePrefill, NumPrefillRequests: 2, SumPrefillTokens: 256, SumPrefillKVTokens: 64, LatencyMS: 30},
				{Phase: PhaseDecode, NumDecodeRequests: 8, SumDecodeKVTokens: 4096, LatencyMS: 10},
			}}
		c.Finish()
		d.Cells = append(d.Cells, c)
	}
	return d
}

func TestDatasetValidPasses(t *testing.T) {
	if errs := testDataset().Validate(); errs != nil {
		t.Fatal(errs)
	}
}

// Scenarios for every dataset validation rule (forbidden content in an identity included): each mutation
// must be rejected with exactly the named rule, on the named cell and row.
func TestDatasetValidationRules(t *testing.T) {
	type want struct {
		rule Rule
		cell int // -1: dataset level
		row  int
	}
	cases := map[string]struct {
		mutate func(d *Dataset)
		want   want
	}{
		"schema version of the file differs": {func(d *Dataset) { d.SchemaVersion = 2 }, want{RuleSchema, -1, -1}},
		"identity schema version differs": {func(d *Dataset) {
			d.Cells[1].Identity.SchemaVersion = 2
			d.Cells[1].Finish()
		}, want{RuleSchema, 1, -1}},
		"key is not the identity's key": {func(d *Dataset) { d.Cells[0].Key = d.Cells[1].Key + "x" }, want{RuleIdentity, 0, -1}},
		"identity lacks hardware": {func(d *Dataset) {
			d.Cells[0].Identity.Hardware = ""
			d.Cells[0].Finish()
		}, want{RuleIdentity, 0, -1}},
		"dataset digest does not match rows": {func(d *Dataset) { d.Cells[1].Rows[0].LatencyMS = 21 }, want{RuleDigest, 1, -1}},
		"artefact digest is not a sha256":    {func(d *Dataset) { d.Cells[0].Provenance.ArtefactDigest = "xyz" }, want{RuleDigest, 0, -1}},
		"row count differs":                  {func(d *Dataset) { d.Cells[0].Provenance.RowCount = 4 }, want{RuleRowCount, 0, -1}},
		"cell run id differs":                {func(d *Dataset) { d.Cells[1].Provenance.RunID = "run-2" }, want{ruleRunID, 1, -1}},
		"duplicate row coordinates": {func(d *Dataset) {
			d.Cells[0].Rows[1] = d.Cells[0].Rows[0]
			d.Cells[0].Rows[1].LatencyMS = 25
			d.Cells[0].Finish()
		}, want{ruleDuplicateKey, 0, 1}},
		"duplicate cell key": {func(d *Dataset) { d.Cells[1] = d.Cells[0] }, want{ruleDuplicateKey, 1, -1}},
		"NaN latency":        {func(d *Dataset) { setLatency(d, 0, 2, math.NaN()) }, want{RuleLatency, 0, 2}},
		"infinite latency":   {func(d *Dataset) { setLatency(d, 0, 2, math.Inf(1)) }, want{RuleLatency, 0, 2}},
		"zero latency":       {func(d *Dataset) { setLatency(d, 1, 0, 0) }, want{RuleLatency, 1, 0}},
		"negative latency":   {func(d *Dataset) { setLatency(d, 1, 1, -3) }, want{RuleLatency, 1, 1}},
		"prefill row with decode coordinates": {func(d *Dataset) {
			d.Cells[0].Rows[0].NumDecodeRequests = 1
			d.Cells[0].Finish()
		}, want{rulePhase, 0, 0}},
		"decode row with zero requests": {func(d *Dataset) {
			d.Cells[0].Rows[2].NumDecodeRequests = 0
			d.Cells[0].Finish()
		}, want{rulePhase, 0, 2}},
		"prefill tokens fewer than requests": {func(d *Dataset) {
			d.Cells[1].Rows[1].SumPrefillTokens = 1
			d.Cells[1].Finish()
		}, want{rulePhase, 1, 1}},
		"unknown phase": {func(d *Dataset) {
			d.Cells[1].Rows[2].Phase = "mixed"
			d.Cells[1].Finish()
		}, want{rulePhase, 1, 2}},
		"mixed backend versions": {func(d *Dataset) {
			d.Cells[1].Identity.BackendVersion = "0.30.0"
			d.Cells[1].Finish()
		}, want{ruleMixedVersions, 1, -1}},
		"hardware names a host": {func(d *Dataset) {
			d.Cells[0].Identity.Hardware = "gpu-node-7.local"
			d.Cells[0].Finish()
		}, want{RuleForbiddenContent, 0, -1}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d := testDataset()
			tc.mutate(d)
			errs := d.Validate()
			if len(errs) == 0 {
				t.Fatal("dataset passed")
			}
			if !errors.Is(errs, errDatasetInvalid) {
				t.Fatalf("errors.Is(ErrDatasetInvalid) false: %v", errs)
			}
			label := ""
			if tc.want.cell >= 0 {
				label = d.CellLabel(tc.want.cell)
			}
			for _, e := range errs {
				if e.Rule == tc.want.rule && e.Cell == label && e.Row == tc.want.row {
					return
				}
			}
			t.Fatalf("no %s rejection on cell %q row %d; got %v", tc.want.rule, label, tc.want.row, errs)
		})
	}
}

func setLatency(d *Dataset, cell, row int, v float64) {
	d.Cells[cell].Rows[row].LatencyMS = v
	// Keep the digest consistent so that only the latency rule fires (NaN cannot be JSON-encoded: the
	// digest of such a row is left as it was, and the digest rule may fire as well).
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		d.Cells[cell].Finish()
	}
}

func TestDecodeDatasetRejectsUnknownFields(t *testing.T) {
	b, _ := json.Marshal(testDataset())
	b = bytes.Replace(b, []byte(`"latency_ms":20`), []byte(`"latency_ms":20,"prompt":"hello"`), 1)
	_, err := DecodeDataset(bytes.NewReader(b))
	var v ValidationErrors
	if !errors.As(err, &v) || v[0].Rule != RuleSchema || !strings.Contains(err.Error(), "prompt") {
		t.Fatalf("want a schema rejection naming the field, got %v", err)
	}
}

func TestCellKeyChangesWithEveryIdentityField(t *testing.T) {
	base := testIdentity("m/a")
	variants := map[string]func(*CellIdentity){
		"backend version": func(i *CellIdentity) { i.BackendVersion = "0.29.1" },
		"profile version": func(i *CellIdentity) { i.ProfileVersion = "2" },
		"schema version":  func(i *CellIdentity) { i.SchemaVersion = 2 },
		"settings digest": func(i *CellIdentity) { i.SettingsDigest = strings.Repeat("cd", 32) },
		"selection":       func(i *CellIdentity) { i.BackendSelections = map[string]string{"attention_backend": "FLASHINFER"} },
		"parallelism":     func(i *CellIdentity) { i.Parallelism.MoEEP = 4 },
	}
	for name, f := range variants {
		v := base
		v.BackendSelections = map[string]string{"attention_backend": "auto"}
		f(&v)
		if v.Key() == base.Key() {
			t.Errorf("%s: key unchanged", name)
		}
	}
	if k := testIdentity("m/a").Key(); k != base.Key() || !strings.HasPrefix(k, CellKeyPrefix) || len(k) != len(CellKeyPrefix)+64 {
		t.Fatalf("key not stable or malformed: %s", k)
	}
}

func TestDatasetSchemaAcceptsValidFile(t *testing.T) {
	s, err := compileSchema(datasetSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(testDataset(), "", "  ")
	if err := validateSchemaDoc(t, s, b); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(b, []byte(`"phase": "decode"`), []byte(`"phase": "mixed"`), 1)
	if err := validateSchemaDoc(t, s, bad); err == nil {
		t.Fatal("schema accepted phase mixed")
	}
}

func TestDecodePlan(t *testing.T) {
	p := DatasetPlan{SchemaVersion: 1, CampaignID: "c1", Cells: []PlanCell{{Identity: testIdentity("m/a"), ExpectedRows: 3, EstimatedGPUHours: 2}}}
	b, _ := json.Marshal(p)
	got, err := DecodePlan(bytes.NewReader(b))
	if err != nil || got.Cells[0].Identity.Key() != p.Cells[0].Identity.Key() {
		t.Fatal(err)
	}
	p.Cells = append(p.Cells, p.Cells[0])
	b, _ = json.Marshal(p)
	if _, err := DecodePlan(bytes.NewReader(b)); err == nil {
		t.Fatal("duplicate plan cell accepted")
	}
	camp := got.NewCampaign()
	camp.Recompute()
	if camp.State != CampaignOpen {
		t.Fatal(camp.State)
	}
	camp.Cells[0].State = CellSealed
	camp.Recompute()
	if camp.State != CampaignComplete {
		t.Fatal(camp.State)
	}
}
