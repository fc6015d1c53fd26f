package predict

import (
	"sort"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// Update is one entry of FPM_DATASETS as a watcher sees it: a value stored under Key at Revision, or
// the key's deletion (or purge).
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
}

// Apply returns the snapshot with updates applied in order. It is the cache: an update whose key
// already holds a value loaded at the same revision keeps that loaded value (a re-watch after a
// reconnect replays every key and re-parses none), and only a new revision loads and validates
// again. Keys that are neither cells nor campaign records are ignored. s itself is unchanged.
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
	for _, u := range updates {
		n.revision = max(n.revision, u.Revision)
		switch {
		case strings.HasPrefix(u.Key, schemas.CellKeyPrefix):
			if u.Deleted {
				delete(n.cells, u.Key)
			} else if old := n.cells[u.Key]; old == nil || old.Revision != u.Revision {
				n.cells[u.Key] = LoadCell(u.Key, u.Revision, u.Value)
			}
		case strings.HasPrefix(u.Key, schemas.CampaignKeyPrefix):
			id := strings.TrimPrefix(u.Key, schemas.CampaignKeyPrefix)
			if u.Deleted {
				delete(n.campaigns, id)
			} else if old := n.campaigns[id]; old == nil || old.Revision != u.Revision {
				n.campaigns[id] = LoadCampaign(id, u.Revision, u.Value)
			}
		}
	}
	return n
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
