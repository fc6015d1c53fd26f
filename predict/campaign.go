package predict

import (
	"encoding/json"
	"fmt"

	"github.com/fpmbus/fpmbus/schemas"
)

// campaign is one loaded campaign record (key "campaign.<id>" in FPM_DATASETS): the state of a
// frozen plan. Only require_complete consults it.
type campaign struct {
	ID       string
	Revision uint64
	Value    *schemas.Campaign // nil when the record does not decode
	Problem  string            // why the record is unusable ("" when it is usable)
}

// loadCampaign decodes the record of campaign id stored at revision. A record that does not decode,
// or names another campaign, loads with a Problem: it never counts as complete.
func loadCampaign(id string, revision uint64, value []byte) *campaign {
	c := &campaign{ID: id, Revision: revision}
	var v schemas.Campaign
	if err := json.Unmarshal(value, &v); err != nil {
		c.Problem = "campaign record does not decode: " + err.Error()
		return c
	}
	c.Value = &v
	if v.CampaignID != id {
		c.Problem = fmt.Sprintf("campaign record names campaign %q but is stored under %q", v.CampaignID, id)
	}
	return c
}

// completeness returns nil when the campaign is complete, else its state for the refusal.
func (c *campaign) completeness() *campaignState {
	st := &campaignState{ID: c.ID, Revision: c.Revision}
	if c.Problem != "" || c.Value == nil {
		st.State = "unreadable"
		return st
	}
	st.State = c.Value.State
	for _, cc := range c.Value.Cells {
		if cc.State != schemas.CellSealed {
			st.Missing = append(st.Missing, cc.Key)
		}
	}
	if c.Value.State == schemas.CampaignComplete && len(st.Missing) == 0 && len(c.Value.Cells) > 0 {
		return nil
	}
	return st
}
