package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The history of FPM_DATASETS keys. The bucket keeps every revision of a key (streams.DatasetsBucket:
// no delete, purge or rollup), and a credential that may write the bucket may still store revisions
// after the honest ones. What every reader takes from a key's history:
//
//   - a sealed cell is its key's first revision; every later one (an overwrite, a delete marker) is
//     tampering, ignored and reported;
//   - a campaign record starts with its frozen plan (every cell pending, the first revision) and each
//     later revision must be a legitimate successor of the record so far (CheckSuccessor): the same
//     campaign, plan and cells, every sealed cell still sealed by the same run and dataset, a state
//     that follows from the cells. A revision that is not (a delete marker, a value that does not
//     decode, a rewrite of a seal) is tampering: ignored, so the record stays what its legitimate
//     revisions make it, and reported.

// ErrTampered: a revision of an FPM_DATASETS key that no fpmbus writer stores.
var ErrTampered = errors.New("schemas: revision is not a legitimate successor")

// CheckFirst reports why c cannot be a campaign record's first revision, which freezes its plan with
// every cell pending (DatasetPlan.NewCampaign); nil when it can.
func (c *Campaign) CheckFirst() error {
	if c.CampaignID == "" || c.PlanDigest == "" {
		return fmt.Errorf("%w: the first revision names no campaign or plan", ErrTampered)
	}
	for _, cc := range c.Cells {
		if cc.State != CellPending {
			return fmt.Errorf("%w: the first revision (the frozen plan) has cell %s %s, not pending", ErrTampered, cc.Key, cc.State)
		}
	}
	if c.State != CampaignOpen {
		return fmt.Errorf("%w: the first revision (the frozen plan) is %s, not open", ErrTampered, c.State)
	}
	return nil
}

// CheckSuccessor reports why next cannot follow c in a campaign record's history; nil when it can: the
// same schema version, campaign, plan digest and cells (keys, in order), every cell sealed in c sealed
// in next by the same run and dataset, and next's state the one its cells give.
func (c *Campaign) CheckSuccessor(next *Campaign) error {
	switch {
	case next.SchemaVersion != c.SchemaVersion:
		return fmt.Errorf("%w: schema_version %d after %d", ErrTampered, next.SchemaVersion, c.SchemaVersion)
	case next.CampaignID != c.CampaignID:
		return fmt.Errorf("%w: campaign %q after %q", ErrTampered, next.CampaignID, c.CampaignID)
	case next.PlanDigest != c.PlanDigest:
		return fmt.Errorf("%w: plan %s after the frozen plan %s", ErrTampered, next.PlanDigest, c.PlanDigest)
	case len(next.Cells) != len(c.Cells):
		return fmt.Errorf("%w: %d cells after the plan's %d", ErrTampered, len(next.Cells), len(c.Cells))
	}
	for i, cc := range c.Cells {
		nc := next.Cells[i]
		if nc.Key != cc.Key {
			return fmt.Errorf("%w: cell %d is %s, the plan's is %s", ErrTampered, i, nc.Key, cc.Key)
		}
		if cc.State == CellSealed && (nc.State != CellSealed || nc.RunID != cc.RunID || nc.DatasetDigest != cc.DatasetDigest) {
			return fmt.Errorf("%w: cell %s, sealed by run %q (dataset %s), is %s by run %q (dataset %s)",
				ErrTampered, cc.Key, cc.RunID, cc.DatasetDigest, nc.State, nc.RunID, nc.DatasetDigest)
		}
	}
	want := *next
	want.Recompute()
	if want.State != next.State {
		return fmt.Errorf("%w: state %s, its cells make it %s", ErrTampered, next.State, want.State)
	}
	return nil
}

// NextCampaign is one step of reading a campaign record's history: the record after revision value
// (deleted: a delete or purge marker) given the record so far (nil before the first revision). A
// revision that cannot follow returns cur unchanged and the reason (errors.Is ErrTampered); a first
// revision that is not a frozen plan returns nil and the reason: the record has no legitimate start.
func NextCampaign(cur *Campaign, value []byte, deleted bool) (*Campaign, error) {
	if deleted {
		return cur, fmt.Errorf("%w: a delete marker", ErrTampered)
	}
	var next Campaign
	if err := json.Unmarshal(value, &next); err != nil {
		return cur, fmt.Errorf("%w: the value does not decode: %v", ErrTampered, err)
	}
	if cur == nil {
		if err := next.CheckFirst(); err != nil {
			return nil, err
		}
		return &next, nil
	}
	if err := cur.CheckSuccessor(&next); err != nil {
		return cur, err
	}
	return &next, nil
}
