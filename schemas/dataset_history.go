package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// The history of FPM_DATASETS keys. The bucket keeps every revision of a key (streams.DatasetsBucket:
// no delete, purge or rollup), and a credential that may write the bucket may still store revisions
// before and after the honest ones. What every reader takes from a key's history (KeyHistory, the one
// fold of the sealer, its audit, `fpmbus datasets` and the predict service):
//
//   - a sealed cell is its key's first revision that is a seal (sealedValue). A delete marker or a
//     value that is no seal stored before it seals nothing, so it cannot take the cell from the first
//     honest seal that follows: it is tampering, ignored and reported, and the sealer seals on top of
//     it. Every revision after the seal (an overwrite, a delete marker) is tampering too. A forged
//     value that looks like a seal and is stored first is the cell: first writer wins, against a leaked
//     credential as against an honest racer.
//   - a campaign record starts with its first revision that is a frozen plan of its key (every cell
//     pending: Campaign.CheckFirst), and each later revision must be a legitimate successor of the
//     record so far (CheckSuccessor): the same campaign, plan and cells, every sealed cell still sealed
//     by the same run and dataset, a state that follows from the cells. A revision that is not (a
//     delete marker, a value that does not decode, a rewrite of a seal, anything before the plan) is
//     tampering: ignored, so the record stays what its legitimate revisions make it, and reported.

// ErrTampered: a revision of an FPM_DATASETS key that no fpmbus writer stores.
var ErrTampered = errors.New("schemas: a revision no fpmbus writer stores")

// sealedValue decodes value, a revision of cell key key (deleted: a delete or purge marker), as a seal:
// what a sealer stores, a SealedCell naming key, with its schema version, attempt, run and dataset
// digest. Anything else is no seal (errors.Is ErrTampered), whatever came before or after it. It checks
// the shape every sealer has written, not the data rules (schemas.ValidateCell), which may tighten in a
// later version: a cell sealed under earlier rules stays sealed (a reader that applies the rules
// refuses to use it, the predict service for one), and is never sealed a second time.
func sealedValue(key string, value []byte, deleted bool) (*SealedCell, error) {
	if deleted {
		return nil, fmt.Errorf("%w: a delete marker, not a sealed value", ErrTampered)
	}
	var v SealedCell
	if err := json.Unmarshal(value, &v); err != nil {
		return nil, fmt.Errorf("%w: no sealed value: it does not decode: %v", ErrTampered, err)
	}
	switch {
	case v.Key != key:
		return nil, fmt.Errorf("%w: no sealed value: it names key %q", ErrTampered, v.Key)
	case v.SchemaVersion < 1:
		return nil, fmt.Errorf("%w: no sealed value: schema_version %d", ErrTampered, v.SchemaVersion)
	case v.AttemptID == "" || v.Provenance.RunID == "" || v.Provenance.DatasetDigest == "":
		return nil, fmt.Errorf("%w: no sealed value: it names no attempt, run or dataset digest", ErrTampered)
	}
	return &v, nil
}

// KeyHistory reads one FPM_DATASETS key's revisions, oldest first, as every reader does (see above).
// The zero value with Key set is a key before its first revision. A KeyHistory is a value: a copy is
// an independent reading (Add replaces Cell and Campaign, it never changes what they point to).
type KeyHistory struct {
	Key string
	// Revision is the record's revision: a cell's seal, a campaign record's last legitimate revision;
	// 0 while the key holds no record.
	Revision uint64
	// Cell is a cell key's sealed value, Campaign a campaign key's record; nil while it holds none.
	Cell     *SealedCell
	Campaign *Campaign
	// Last is the key's last revision read, taken or ignored: what a write that must follow the key's
	// whole history expects.
	Last uint64
	// NoRecord says why the key holds no record yet: why its last revision is none ("" once it holds
	// one, and before its first revision).
	NoRecord string
}

// Add reads the key's next revision (deleted: a delete or purge marker). It returns nil when the
// revision is the record or its legitimate successor, else why it is ignored (errors.Is ErrTampered).
func (h *KeyHistory) Add(revision uint64, value []byte, deleted bool) error {
	h.Last = revision
	var err error
	switch {
	case strings.HasPrefix(h.Key, CellKeyPrefix) && h.Cell != nil:
		return fmt.Errorf("%w: stored after the sealed value (revision %d), which stands", ErrTampered, h.Revision)
	case strings.HasPrefix(h.Key, CellKeyPrefix):
		var v *SealedCell
		if v, err = sealedValue(h.Key, value, deleted); err == nil {
			h.Cell = v
		}
	case strings.HasPrefix(h.Key, CampaignKeyPrefix):
		var next *Campaign
		next, err = nextCampaign(h.Campaign, value, deleted)
		if err == nil && h.Campaign == nil && CampaignKeyPrefix+next.CampaignID != h.Key {
			next, err = nil, fmt.Errorf("%w: the first revision names campaign %q, not the key's", ErrTampered, next.CampaignID)
		}
		if err == nil {
			h.Campaign = next
		}
	default:
		return fmt.Errorf("%w: %s is neither a cell nor a campaign record", ErrTampered, h.Key)
	}
	if err != nil {
		if h.Revision == 0 {
			h.NoRecord = err.Error()
		}
		return err
	}
	h.Revision, h.NoRecord = revision, ""
	return nil
}

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

// nextCampaign is one step of reading a campaign record's history: the record after revision value
// (deleted: a delete or purge marker) given the record so far (nil before the first revision). A
// revision that cannot follow returns cur unchanged and the reason (errors.Is ErrTampered); a first
// revision that is not a frozen plan returns nil and the reason: the record has no legitimate start
// yet (a later frozen plan starts it, KeyHistory).
func nextCampaign(cur *Campaign, value []byte, deleted bool) (*Campaign, error) {
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
