package predict

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// Update is one entry of FPM_DATASETS as a watcher of its whole history sees it: a value stored under
// Key at Revision, or a delete (or purge) marker.
type Update struct {
	Key      string
	Revision uint64
	Value    []byte
	Deleted  bool
}

// Snapshot is the loaded bucket at one point of its history: the cells and campaign records by key,
// and the highest revision applied. It is immutable; Apply returns a new one. The zero value (and nil)
// is the empty bucket. Safe for concurrent use.
type Snapshot struct {
	cells     map[string]*Cell
	campaigns map[string]*Campaign
	revision  uint64
	ignored   []Ignored
}

// Ignored is an update Apply did not take: a revision no fpmbus writer stores (tampering).
type Ignored struct {
	Key      string
	Revision uint64
	Reason   string
}

// Apply returns the snapshot with updates applied in order; they are a key's history in stream order
// (a watch with history), and Apply reads it as every reader of FPM_DATASETS does (schemas'
// dataset_history.go): a cell is its key's first revision, and a later one (an overwrite, a delete
// marker) is ignored; a campaign record is its frozen plan and each revision that legitimately
// follows it (schemas.NextCampaign), and any other is ignored. What it ignored is the new snapshot's
// Ignored. An update of a key at the revision already loaded changes nothing and re-parses nothing (a
// re-watch replays keys). Keys that are neither cells nor campaign records are ignored. s itself is
// unchanged.
func (s *Snapshot) Apply(updates ...Update) *Snapshot {
	n := &Snapshot{cells: map[string]*Cell{}, campaigns: map[string]*Campaign{}}
	if s != nil {
		for k, c := range s.cells {
			n.cells[k] = c
		}
		for k, c := range s.campaigns {
			n.campaigns[k] = c
		}
		n.revision = s.revision
	}
	ignore := func(u Update, why string) {
		n.ignored = append(n.ignored, Ignored{Key: u.Key, Revision: u.Revision, Reason: why})
	}
	for _, u := range updates {
		n.revision = max(n.revision, u.Revision)
		switch {
		case strings.HasPrefix(u.Key, schemas.CellKeyPrefix):
			old := n.cells[u.Key]
			switch {
			case old != nil && old.Revision == u.Revision:
			case old != nil:
				ignore(u, fmt.Sprintf("a revision after the sealed value (revision %d), which stands", old.Revision))
			case u.Deleted:
				c := &Cell{Key: u.Key, Revision: u.Revision}
				c.addProblem(schemas.RuleSchema, "the key's first revision is a delete marker, not a sealed value")
				n.cells[u.Key] = c
			default:
				n.cells[u.Key] = LoadCell(u.Key, u.Revision, u.Value)
			}
		case strings.HasPrefix(u.Key, schemas.CampaignKeyPrefix):
			id := strings.TrimPrefix(u.Key, schemas.CampaignKeyPrefix)
			old := n.campaigns[id]
			if old != nil && old.Revision == u.Revision {
				continue
			}
			var cur *schemas.Campaign
			if old != nil {
				if old.Value == nil || old.Problem != "" {
					ignore(u, "the record has no legitimate first revision")
					continue
				}
				cur = old.Value
			}
			if old == nil {
				// The first revision is the record's start (require_complete reads its state; the
				// sealer's audit reports one that is not a frozen plan).
				if u.Deleted {
					n.campaigns[id] = &Campaign{ID: id, Revision: u.Revision, Problem: "the campaign record's first revision is a delete marker"}
				} else {
					n.campaigns[id] = LoadCampaign(id, u.Revision, u.Value)
				}
				continue
			}
			next, err := schemas.NextCampaign(cur, u.Value, u.Deleted)
			if err != nil {
				ignore(u, err.Error())
				continue
			}
			c := LoadCampaign(id, u.Revision, u.Value)
			c.Value = next
			n.campaigns[id] = c
		}
	}
	return n
}

// Ignored are the updates the Apply that made s did not take (tampering), in order.
func (s *Snapshot) Ignored() []Ignored {
	if s == nil {
		return nil
	}
	return s.ignored
}

// Revision is the highest KV revision applied (0 for the empty bucket).
func (s *Snapshot) Revision() uint64 {
	if s == nil {
		return 0
	}
	return s.revision
}

// Cell returns the loaded cell under key, or nil.
func (s *Snapshot) Cell(key string) *Cell {
	if s == nil {
		return nil
	}
	return s.cells[key]
}

// Campaign returns the loaded record of campaign id, or nil.
func (s *Snapshot) Campaign(id string) *Campaign {
	if s == nil {
		return nil
	}
	return s.campaigns[id]
}

// Cells returns every loaded cell, valid or corrupt, by key.
func (s *Snapshot) Cells() []*Cell {
	if s == nil {
		return nil
	}
	out := make([]*Cell, 0, len(s.cells))
	for _, c := range s.cells {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// CellSummary describes one loaded cell (the service's cells endpoint, `fpmbus datasets predict`).
type CellSummary struct {
	Key           string                `json:"key"`
	Revision      uint64                `json:"revision"`
	Valid         bool                  `json:"valid"`
	Problems      []string              `json:"problems,omitempty"`
	DatasetDigest string                `json:"dataset_digest,omitempty"`
	RunID         string                `json:"run_id,omitempty"`
	CampaignID    string                `json:"campaign_id,omitempty"`
	PrefillRows   int                   `json:"prefill_rows"`
	DecodeRows    int                   `json:"decode_rows"`
	Identity      *schemas.CellIdentity `json:"identity,omitempty"`
}

// Summaries describes every loaded cell, by key.
func (s *Snapshot) Summaries() []CellSummary {
	var out []CellSummary
	for _, c := range s.Cells() {
		r := c.Ref()
		p, d := c.Rows()
		out = append(out, CellSummary{Key: c.Key, Revision: c.Revision, Valid: c.Valid(), Problems: c.Problems,
			DatasetDigest: r.DatasetDigest, RunID: r.RunID, CampaignID: r.CampaignID, PrefillRows: p, DecodeRows: d, Identity: r.Identity})
	}
	return out
}
