package schemas

import (
	"encoding/json"
	"errors"
	"testing"
)

// A campaign record's history folds to what its legitimate revisions make it: a frozen plan first,
// then revisions that keep the plan, the cells and every seal; anything else (a delete marker, a value
// that does not decode, a rewritten or dropped seal, another plan, a state its cells do not give) is
// skipped with ErrTampered and the record stays as it was.
func TestNextCampaignFollowsOnlyLegitimateRevisions(t *testing.T) {
	t.Parallel()
	frozen := &Campaign{SchemaVersion: DatasetSchemaVersion, CampaignID: "c1", PlanDigest: "p1", State: CampaignOpen,
		Cells: []CampaignCell{{Key: "cell.a", State: CellPending}, {Key: "cell.b", State: CellPending}}}
	sealedA := *frozen
	sealedA.Cells = []CampaignCell{{Key: "cell.a", State: CellSealed, RunID: "r1", DatasetDigest: "d1"}, {Key: "cell.b", State: CellMissing}}
	sealedA.State = CampaignPartial
	enc := func(c Campaign) []byte { b, _ := json.Marshal(c); return b }
	with := func(f func(c *Campaign)) []byte {
		c := sealedA
		c.Cells = append([]CampaignCell(nil), sealedA.Cells...)
		f(&c)
		return enc(c)
	}

	cur, err := nextCampaign(nil, enc(*frozen), false)
	if err != nil || cur.PlanDigest != "p1" {
		t.Fatalf("the frozen plan as first revision: %v", err)
	}
	if cur, err = nextCampaign(cur, enc(sealedA), false); err != nil || cur.Cells[0].State != CellSealed {
		t.Fatalf("a seal recorded: %v", err)
	}
	both := with(func(c *Campaign) {
		c.Cells[1] = CampaignCell{Key: "cell.b", State: CellSealed, RunID: "r2", DatasetDigest: "d2"}
		c.State = CampaignComplete
	})
	if next, err := nextCampaign(cur, both, false); err != nil || next.State != CampaignComplete {
		t.Fatalf("the second cell sealed later: %v", err)
	}

	for name, tc := range map[string]struct {
		value   []byte
		deleted bool
	}{
		"a delete marker":              {nil, true},
		"not JSON":                     {[]byte("forged"), false},
		"a seal given to another run":  {with(func(c *Campaign) { c.Cells[0].RunID = "evil" }), false},
		"a seal undone":                {with(func(c *Campaign) { c.Cells[0] = CampaignCell{Key: "cell.a", State: CellMissing} }), false},
		"another plan":                 {with(func(c *Campaign) { c.PlanDigest = "p2" }), false},
		"another campaign":             {with(func(c *Campaign) { c.CampaignID = "c2" }), false},
		"a cell dropped":               {with(func(c *Campaign) { c.Cells = c.Cells[:1] }), false},
		"cells reordered":              {with(func(c *Campaign) { c.Cells[0], c.Cells[1] = c.Cells[1], c.Cells[0] }), false},
		"complete with a cell missing": {with(func(c *Campaign) { c.State = CampaignComplete }), false},
	} {
		next, err := nextCampaign(cur, tc.value, tc.deleted)
		if !errors.Is(err, ErrTampered) || next != cur {
			t.Errorf("%s: %v (record changed: %v), want ErrTampered and the record unchanged", name, err, next != cur)
		}
	}

	// A first revision that is not a frozen plan leaves the record without a legitimate start.
	if next, err := nextCampaign(nil, enc(sealedA), false); !errors.Is(err, ErrTampered) || next != nil {
		t.Fatalf("a first revision with a sealed cell: %v", err)
	}
}

// FuzzNextCampaign feeds arbitrary revisions of a campaign record to NextCampaign. It must never
// panic; a revision it refuses leaves the record as it was (with ErrTampered); one it takes keeps the
// frozen plan and every seal of the record so far.
func FuzzNextCampaign(f *testing.F) {
	frozen, _ := json.Marshal(Campaign{SchemaVersion: DatasetSchemaVersion, CampaignID: "c1", PlanDigest: "p1", State: CampaignOpen,
		Cells: []CampaignCell{{Key: "cell.a", State: CellPending}}})
	sealed, _ := json.Marshal(Campaign{SchemaVersion: DatasetSchemaVersion, CampaignID: "c1", PlanDigest: "p1", State: CampaignComplete,
		Cells: []CampaignCell{{Key: "cell.a", State: CellSealed, RunID: "r", DatasetDigest: "d"}}})
	for _, seed := range [][]byte{frozen, sealed, []byte(`{`), []byte(`null`), []byte(`{"cells":[{}]}`)} {
		f.Add(seed, false)
	}
	f.Add([]byte(nil), true)
	f.Fuzz(func(t *testing.T, value []byte, deleted bool) {
		first, _ := nextCampaign(nil, frozen, false)
		cur, err := nextCampaign(first, sealed, false)
		if err != nil {
			t.Fatal(err)
		}
		next, err := nextCampaign(cur, value, deleted)
		if err != nil {
			if !errors.Is(err, ErrTampered) || next != cur {
				t.Fatalf("a refused revision: %v, record changed %v", err, next != cur)
			}
			return
		}
		if next.PlanDigest != "p1" || len(next.Cells) != 1 || next.Cells[0].State != CellSealed || next.Cells[0].RunID != "r" {
			t.Fatalf("a taken revision lost the plan or a seal: %+v", next)
		}
		if _, err := nextCampaign(nil, value, deleted); err == nil && deleted {
			t.Fatal("a delete marker taken as a first revision")
		}
	})
}

// A cell key's history: a delete marker, a value that does not decode and a value that is no seal of
// the key, stored before anyone sealed it, seal nothing (the key holds no record, and says why); the
// first seal after them is the cell, and every revision after it is ignored, a valid-looking one too.
// A campaign key's history: what comes before its first frozen plan (junk, a record of another
// campaign, a record that is not a plan) is ignored, and the plan starts the record.
func TestKeyHistoryTakesTheFirstSealAndTheFirstPlan(t *testing.T) {
	t.Parallel()
	const key = "cell.k"
	seal := func(run string) []byte {
		b, _ := json.Marshal(SealedCell{SchemaVersion: DatasetSchemaVersion, Key: key, AttemptID: "a-" + run,
			Provenance: Provenance{RunID: run, DatasetDigest: "d-" + run}})
		return b
	}
	h := KeyHistory{Key: key}
	for i, junk := range []struct {
		value   []byte
		deleted bool
	}{
		{nil, true},
		{[]byte("forged"), false},
		{[]byte(`null`), false},
		{[]byte(`{"key":"cell.other","schema_version":1,"attempt_id":"x","provenance":{"run_id":"r","dataset_digest":"d"}}`), false},
		{[]byte(`{"key":"cell.k","schema_version":1}`), false},
	} {
		if err := h.Add(uint64(i+1), junk.value, junk.deleted); !errors.Is(err, ErrTampered) || h.Cell != nil || h.Revision != 0 || h.NoRecord == "" {
			t.Fatalf("revision %d before the seal: %v, history %+v", i+1, err, h)
		}
	}
	if err := h.Add(6, seal("honest"), false); err != nil || h.Cell == nil || h.Cell.Provenance.RunID != "honest" || h.Revision != 6 || h.NoRecord != "" {
		t.Fatalf("the first seal: %v, history %+v", err, h)
	}
	for rev, v := range map[uint64][]byte{7: seal("forged"), 8: nil} {
		if err := h.Add(rev, v, v == nil); !errors.Is(err, ErrTampered) || h.Cell.Provenance.RunID != "honest" || h.Revision != 6 || h.Last != rev {
			t.Fatalf("revision %d after the seal: %v, history %+v", rev, err, h)
		}
	}

	enc := func(c Campaign) []byte { b, _ := json.Marshal(c); return b }
	plan := Campaign{SchemaVersion: DatasetSchemaVersion, CampaignID: "c1", PlanDigest: "p1", State: CampaignOpen,
		Cells: []CampaignCell{{Key: "cell.a", State: CellPending}}}
	other, done := plan, plan
	other.CampaignID = "c2"
	done.State, done.Cells = CampaignComplete, []CampaignCell{{Key: "cell.a", State: CellSealed, RunID: "r", DatasetDigest: "d"}}
	c := KeyHistory{Key: CampaignKeyPrefix + "c1"}
	for i, v := range [][]byte{[]byte("forged"), enc(other), enc(done)} {
		if err := c.Add(uint64(i+1), v, false); !errors.Is(err, ErrTampered) || c.Campaign != nil || c.NoRecord == "" {
			t.Fatalf("campaign revision %d before the plan: %v, history %+v", i+1, err, c)
		}
	}
	if err := c.Add(4, enc(plan), false); err != nil || c.Campaign == nil || c.Revision != 4 {
		t.Fatalf("the plan: %v, history %+v", err, c)
	}
	if err := c.Add(5, enc(done), false); err != nil || c.Campaign.State != CampaignComplete || c.Revision != 5 {
		t.Fatalf("the plan's successor: %v, history %+v", err, c)
	}
}
