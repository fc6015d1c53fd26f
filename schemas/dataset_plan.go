package schemas

import (
	"encoding/json"
	"fmt"
	"io"
)

// DatasetPlan is a frozen collection plan: the cells a campaign must seal, what each is expected to hold
// and cost, and the settings the plan cannot cover. Coverage, with its cost against the GPU-hour budget,
// is reported against the plan before collection; once frozen in its campaign record it never changes.
type DatasetPlan struct {
	SchemaVersion       int        `json:"schema_version"`
	CampaignID          string     `json:"campaign_id"`
	BudgetGPUHours      float64    `json:"budget_gpu_hours,omitempty"`
	Cells               []PlanCell `json:"cells"`
	UnsupportedSettings []string   `json:"unsupported_settings,omitempty"`
}

// PlanCell is one planned cell. ExpectedRows is the number of rows (grid points) a complete cell holds;
// a sealed cell with fewer rows covers it only partially.
type PlanCell struct {
	Identity          CellIdentity `json:"identity"`
	ExpectedRows      int          `json:"expected_rows"`
	EstimatedGPUHours float64      `json:"estimated_gpu_hours"`
}

// DecodePlan parses a plan file strictly and checks it.
func DecodePlan(r io.Reader) (*DatasetPlan, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var p DatasetPlan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("plan: decode: %w", err)
	}
	if p.SchemaVersion != DatasetSchemaVersion {
		return nil, fmt.Errorf("plan: schema_version %d, want %d", p.SchemaVersion, DatasetSchemaVersion)
	}
	if p.CampaignID == "" {
		return nil, fmt.Errorf("plan: campaign_id is empty")
	}
	seen := map[string]int{}
	for i := range p.Cells {
		c := &p.Cells[i]
		if c.Identity.SchemaVersion == 0 {
			c.Identity.SchemaVersion = DatasetSchemaVersion
		}
		k := c.Identity.Key()
		if j, dup := seen[k]; dup {
			return nil, fmt.Errorf("plan: cell #%d has the same identity as cell #%d", i, j)
		}
		seen[k] = i
		if c.ExpectedRows < 1 || c.EstimatedGPUHours < 0 {
			return nil, fmt.Errorf("plan: cell #%d: expected_rows %d must be >= 1 and estimated_gpu_hours %v >= 0", i, c.ExpectedRows, c.EstimatedGPUHours)
		}
	}
	return &p, nil
}

// Campaign cell states.
const (
	CellPending  = "pending"  // planned, nothing sealed yet by this campaign
	CellSealed   = "sealed"   // sealed by this campaign (or the same attempt earlier)
	CellConflict = "conflict" // another run sealed it first; this campaign's data was refused
	CellMissing  = "missing"  // this campaign's data for it was rejected or never produced
)

// Campaign states.
const (
	CampaignOpen     = "open"     // nothing published yet
	CampaignPartial  = "partial"  // some planned cells are not sealed
	CampaignComplete = "complete" // every planned cell is sealed
)

// Campaign is the record of one frozen plan in FPM_DATASETS under "campaign.<id>". It is only ever
// written with Create (first) or Update on the revision it was read at.
type Campaign struct {
	SchemaVersion   int            `json:"schema_version"`
	CampaignID      string         `json:"campaign_id"`
	PlanDigest      string         `json:"plan_digest"`
	State           string         `json:"state"`
	Cells           []CampaignCell `json:"cells"`
	UpdatedAtUnixMS int64          `json:"updated_at_unix_ms"`
}

// CampaignCell is one planned cell's state; Reason says why it is missing or in conflict.
type CampaignCell struct {
	Key           string `json:"key"`
	State         string `json:"state"`
	RunID         string `json:"run_id,omitempty"`
	DatasetDigest string `json:"dataset_digest,omitempty"`
	Reason        string `json:"reason,omitempty"`
}

// PlanDigest is sha256 of the plan's canonical JSON.
func (p *DatasetPlan) PlanDigest() string { return sha256Hex(mustCanonicalJSON(p)) }

// NewCampaign returns the campaign record of a frozen plan: every cell pending.
func (p *DatasetPlan) NewCampaign() *Campaign {
	c := &Campaign{SchemaVersion: DatasetSchemaVersion, CampaignID: p.CampaignID, PlanDigest: p.PlanDigest(), State: CampaignOpen}
	for _, pc := range p.Cells {
		c.Cells = append(c.Cells, CampaignCell{Key: pc.Identity.Key(), State: CellPending})
	}
	return c
}

// Recompute sets State from the cells: complete when every cell is sealed, partial when any is not
// and any has been published or recorded, open otherwise.
func (c *Campaign) Recompute() {
	sealed, touched := 0, 0
	for _, cc := range c.Cells {
		if cc.State == CellSealed {
			sealed++
		}
		if cc.State != CellPending {
			touched++
		}
	}
	switch {
	case len(c.Cells) > 0 && sealed == len(c.Cells):
		c.State = CampaignComplete
	case touched > 0:
		c.State = CampaignPartial
	default:
		c.State = CampaignOpen
	}
}
