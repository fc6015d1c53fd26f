package predict

import (
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
	cells     map[string]*cell
	campaigns map[string]*campaign
	// keys are the histories read so far (schemas.KeyHistory), by key: values, copied on Apply.
	keys     map[string]schemas.KeyHistory
	revision uint64
	ignored  []ignored
}

// ignored is an update Apply did not take: a revision no fpmbus writer stores (tampering).
type ignored struct {
	Key      string
	Revision uint64
	Reason   string
}

// Apply returns the snapshot with updates applied in order; they are a key's history in stream order
// (a watch with history), and Apply reads it as every reader of FPM_DATASETS does, with the one fold
// of them all (schemas.KeyHistory): a cell is its key's first revision that is a seal, and every other
// revision (a delete marker or junk before it, an overwrite or a delete marker after it) is ignored; a
// campaign record is its first frozen plan and each revision that legitimately follows it
// (schemas.NextCampaign), and any other is ignored. What it ignored is the new snapshot's Ignored. A
// key that holds no record yet loads as unusable (a corrupt cell, an unreadable campaign) until its
// record comes. An update of a key at or before a revision already applied changes nothing and
// re-parses nothing (a re-watch replays keys). Keys that are neither cells nor campaign records are
// ignored. s itself is unchanged.
func (s *Snapshot) Apply(updates ...Update) *Snapshot {
	n := &Snapshot{cells: map[string]*cell{}, campaigns: map[string]*campaign{}, keys: map[string]schemas.KeyHistory{}}
	if s != nil {
		for k, c := range s.cells {
			n.cells[k] = c
		}
		for k, c := range s.campaigns {
			n.campaigns[k] = c
		}
		for k, h := range s.keys {
			n.keys[k] = h
		}
		n.revision = s.revision
	}
	for _, u := range updates {
		n.revision = max(n.revision, u.Revision)
		cell := strings.HasPrefix(u.Key, schemas.CellKeyPrefix)
		if !cell && !strings.HasPrefix(u.Key, schemas.CampaignKeyPrefix) {
			continue
		}
		h, seen := n.keys[u.Key]
		if !seen {
			h.Key = u.Key
		}
		if seen && u.Revision <= h.Last {
			continue
		}
		err := h.Add(u.Revision, u.Value, u.Deleted)
		if h.Cell != nil && h.Cell.Rows != nil {
			c := *h.Cell // the fold needs only to know the key is sealed; the loaded Cell holds the rows
			c.Rows = nil
			h.Cell = &c
		}
		n.keys[u.Key] = h
		if err != nil {
			n.ignored = append(n.ignored, ignored{Key: u.Key, Revision: u.Revision, Reason: err.Error()})
			if h.Revision == 0 {
				n.unusable(u, h.NoRecord)
			}
			continue
		}
		if cell {
			n.cells[u.Key] = loadCell(u.Key, u.Revision, u.Value)
			continue
		}
		id := strings.TrimPrefix(u.Key, schemas.CampaignKeyPrefix)
		c := loadCampaign(id, u.Revision, u.Value)
		c.Value, c.Problem = h.Campaign, ""
		n.campaigns[id] = c
	}
	return n
}

// unusable loads key u.Key, which holds no record yet (why), as its last revision u: a cell that
// refuses every query, or a campaign record that is never complete.
func (n *Snapshot) unusable(u Update, why string) {
	if strings.HasPrefix(u.Key, schemas.CellKeyPrefix) {
		c := &cell{Key: u.Key, Revision: u.Revision}
		if !u.Deleted {
			c = loadCell(u.Key, u.Revision, u.Value) // what is wrong with it, in the rules' terms
		}
		c.addProblem(schemas.RuleSchema, "no revision of the key is a sealed value: "+why)
		c.prefill, c.decode = nil, nil
		sort.Strings(c.Problems)
		sort.Strings(c.Rules)
		n.cells[u.Key] = c
		return
	}
	id := strings.TrimPrefix(u.Key, schemas.CampaignKeyPrefix)
	n.campaigns[id] = &campaign{ID: id, Revision: u.Revision, Problem: "no revision of the campaign record is its frozen plan: " + why}
}

// Ignored are the updates the Apply that made s did not take (tampering), in order.
func (s *Snapshot) Ignored() []ignored {
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
func (s *Snapshot) Cell(key string) *cell {
	if s == nil {
		return nil
	}
	return s.cells[key]
}

// Campaign returns the loaded record of campaign id, or nil.
func (s *Snapshot) Campaign(id string) *campaign {
	if s == nil {
		return nil
	}
	return s.campaigns[id]
}

// Cells returns every loaded cell, valid or corrupt, by key.
func (s *Snapshot) Cells() []*cell {
	if s == nil {
		return nil
	}
	out := make([]*cell, 0, len(s.cells))
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
