package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// ErrPlanMismatch: a campaign record exists for the id but for a different frozen plan.
var ErrPlanMismatch = errors.New("seal: campaign record belongs to a different plan")

// CampaignKey is the FPM_DATASETS key of campaign id's record.
func CampaignKey(id string) string { return schemas.CampaignKeyPrefix + id }

// GetCampaign reads a campaign record and its revision.
func GetCampaign(ctx context.Context, kv jetstream.KeyValue, id string) (*schemas.Campaign, uint64, error) {
	return getRecord[schemas.Campaign](ctx, kv, CampaignKey(id), "campaign "+id)
}

// FreezePlan creates the campaign record of plan (every cell pending) with Create. An existing record
// of the same plan is kept as it is; one of another plan is ErrPlanMismatch.
func FreezePlan(ctx context.Context, kv jetstream.KeyValue, plan *schemas.DatasetPlan) (*schemas.Campaign, error) {
	c := plan.NewCampaign()
	c.UpdatedAtUnixMS = time.Now().UnixMilli()
	body, _ := json.Marshal(c)
	_, err := kv.Create(ctx, CampaignKey(plan.CampaignID), body)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return nil, tooLarge(err, "campaign record "+CampaignKey(plan.CampaignID), len(body))
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, fmt.Errorf("seal: freeze campaign %s: %w", plan.CampaignID, err)
	}
	old, _, err := GetCampaign(ctx, kv, plan.CampaignID)
	if err != nil {
		return nil, err
	}
	if old.PlanDigest != c.PlanDigest {
		return nil, fmt.Errorf("%w: campaign %s has plan %s, this plan is %s", ErrPlanMismatch, plan.CampaignID, old.PlanDigest, c.PlanDigest)
	}
	return old, nil
}

// UpdateCampaign applies fn to the current record and writes it with Update on the revision it was
// read at; on a revision conflict (another writer got there first) it re-reads and re-applies fn, up
// to 50 times. fn must be a pure function of the record it is given.
func UpdateCampaign(ctx context.Context, kv jetstream.KeyValue, id string, fn func(*schemas.Campaign) error) (*schemas.Campaign, error) {
	for try := 0; try < 50; try++ {
		c, rev, err := GetCampaign(ctx, kv, id)
		if err != nil {
			return nil, fmt.Errorf("seal: read campaign %s: %w", id, err)
		}
		if err := fn(c); err != nil {
			return nil, err
		}
		c.Recompute()
		c.UpdatedAtUnixMS = time.Now().UnixMilli()
		body, _ := json.Marshal(c)
		_, err = kv.Update(ctx, CampaignKey(id), body, rev)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, tooLarge(err, "campaign record "+CampaignKey(id), len(body))
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("seal: update campaign %s: %w", id, err)
		}
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
	return nil, fmt.Errorf("seal: update campaign %s: too many concurrent writers", id)
}

// RecordCells sets the states of the given cells in campaign id. A cell sealed earlier stays sealed.
func RecordCells(ctx context.Context, kv jetstream.KeyValue, id string, cells map[string]schemas.CampaignCell) (*schemas.Campaign, error) {
	return UpdateCampaign(ctx, kv, id, func(c *schemas.Campaign) error {
		for i := range c.Cells {
			if upd, ok := cells[c.Cells[i].Key]; ok && c.Cells[i].State != schemas.CellSealed {
				c.Cells[i] = upd
			}
		}
		return nil
	})
}
