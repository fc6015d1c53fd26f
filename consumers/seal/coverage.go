package seal

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// Coverage states of a planned cell.
const (
	covered = "covered" // sealed with at least the planned number of rows
	partial = "partial" // sealed, but with fewer rows than planned (a run that stopped early)
	missing = "missing" // nothing sealed under the exact identity
)

// coverageCell is one planned cell's coverage, with its source, dataset digest and identity.
type coverageCell struct {
	Key               string               `json:"key"`
	State             string               `json:"state"`
	Identity          schemas.CellIdentity `json:"identity"`
	Source            string               `json:"source,omitempty"`
	RunID             string               `json:"run_id,omitempty"`
	DatasetDigest     string               `json:"dataset_digest,omitempty"`
	Rows              int                  `json:"rows"`
	ExpectedRows      int                  `json:"expected_rows"`
	EstimatedGPUHours float64              `json:"estimated_gpu_hours"`
}

// coverageReport is a plan's coverage before collection: covered, partial and missing cells, the
// settings the plan cannot cover, and the estimated GPU-hours (against the budget) to collect the rest.
type coverageReport struct {
	CampaignID          string         `json:"campaign_id"`
	State               string         `json:"state"` // covered (all), partial, missing (none)
	Covered             int            `json:"covered"`
	Partial             int            `json:"partial"`
	Missing             int            `json:"missing"`
	UnsupportedSettings []string       `json:"unsupported_settings"`
	EstimatedGPUHours   float64        `json:"estimated_gpu_hours"` // to collect what is not covered
	BudgetGPUHours      float64        `json:"budget_gpu_hours,omitempty"`
	OverBudget          bool           `json:"over_budget"`
	Cells               []coverageCell `json:"cells"`
}

// Coverage reads every planned cell's exact key. A partially covered cell costs the uncovered share of
// its estimate; a missing one all of it. Only exact identities count: data sealed under another backend,
// profile or schema version is a different key and leaves the cell missing until data of the new
// identity is sealed.
func Coverage(ctx context.Context, kv jetstream.KeyValue, plan *schemas.DatasetPlan) (*coverageReport, error) {
	rep := &coverageReport{CampaignID: plan.CampaignID, UnsupportedSettings: plan.UnsupportedSettings, BudgetGPUHours: plan.BudgetGPUHours}
	if rep.UnsupportedSettings == nil {
		rep.UnsupportedSettings = []string{}
	}
	for _, pc := range plan.Cells {
		cc := coverageCell{Key: pc.Identity.Key(), Identity: pc.Identity, ExpectedRows: pc.ExpectedRows, State: missing,
			EstimatedGPUHours: pc.EstimatedGPUHours}
		v, _, err := get(ctx, kv, cc.Key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, fmt.Errorf("seal: coverage of %s: %w", cc.Key, err)
		default:
			cc.Source, cc.RunID, cc.DatasetDigest, cc.Rows = v.Source, v.Provenance.RunID, v.Provenance.DatasetDigest, len(v.Rows)
			if cc.Rows >= pc.ExpectedRows {
				cc.State, cc.EstimatedGPUHours = covered, 0
			} else {
				cc.State = partial
				cc.EstimatedGPUHours = pc.EstimatedGPUHours * float64(pc.ExpectedRows-cc.Rows) / float64(pc.ExpectedRows)
			}
		}
		switch cc.State {
		case covered:
			rep.Covered++
		case partial:
			rep.Partial++
		default:
			rep.Missing++
		}
		rep.EstimatedGPUHours += cc.EstimatedGPUHours
		rep.Cells = append(rep.Cells, cc)
	}
	switch {
	case rep.Covered == len(plan.Cells):
		rep.State = covered
	case rep.Covered+rep.Partial > 0:
		rep.State = partial
	default:
		rep.State = missing
	}
	rep.OverBudget = plan.BudgetGPUHours > 0 && rep.EstimatedGPUHours > plan.BudgetGPUHours
	return rep, nil
}
