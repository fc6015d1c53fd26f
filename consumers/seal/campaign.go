package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// errPlanMismatch: a campaign record exists for the id but for a different frozen plan.
var errPlanMismatch = errors.New("seal: campaign record belongs to a different plan")

// CampaignKey is the FPM_DATASETS key of campaign id's record.
func CampaignKey(id string) string { return schemas.CampaignKeyPrefix + id }

// getCampaignKV reads a campaign record and the revision a write must expect: its history folded
// (revisions.go: the first frozen plan and each revision that legitimately follows; tampered ones are
// skipped). jetstream.ErrKeyNotFound when it has none: no revision, or none that is a frozen plan of
// the campaign (the revision returned is then the key's last, on which the plan is written).
func getCampaignKV(ctx context.Context, kv jetstream.KeyValue, id string) (*schemas.Campaign, uint64, error) {
	return getCampaign(ctx, bucketHistory(kv), id)
}

func getCampaign(ctx context.Context, h history, id string) (*schemas.Campaign, uint64, error) {
	revs, err := h.all(ctx, CampaignKey(id))
	if err != nil {
		return nil, 0, err
	}
	f := foldAll(CampaignKey(id), revs)
	if f.h.Campaign == nil {
		return nil, f.h.Last, jetstream.ErrKeyNotFound
	}
	return f.h.Campaign, f.h.Last, nil
}

// isKeyTaken reports a write refused because the key already has a revision (or another than the one
// expected).
func isKeyTaken(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// freezePlanKV creates the campaign record of plan (every cell pending) on a key that holds no record:
// one that never had a revision, or whose revisions are none a frozen plan of the campaign (tampering,
// which the plan goes on top of). An existing record of the same plan is kept as it is; one of another
// plan is errPlanMismatch.
func freezePlanKV(ctx context.Context, kv jetstream.KeyValue, plan *schemas.DatasetPlan) (*schemas.Campaign, error) {
	return freezePlan(ctx, bucketHistory(kv), plan)
}

func freezePlan(ctx context.Context, h history, plan *schemas.DatasetPlan) (*schemas.Campaign, error) {
	c := plan.NewCampaign()
	c.UpdatedAtUnixMS = time.Now().UnixMilli()
	body, _ := json.Marshal(c)
	last := uint64(0)
	for try := 0; try < 50; try++ {
		_, err := h.kv.Update(ctx, CampaignKey(plan.CampaignID), body, last)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, tooLarge(err, "campaign record "+CampaignKey(plan.CampaignID), len(body))
		}
		if !isKeyTaken(err) {
			return nil, fmt.Errorf("seal: freeze campaign %s: %w", plan.CampaignID, err)
		}
		old, rev, err := getCampaign(ctx, h, plan.CampaignID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			last = rev // revisions but no plan: the plan goes on top of them
			continue
		}
		if err != nil {
			return nil, err
		}
		if old.PlanDigest != c.PlanDigest {
			return nil, fmt.Errorf("%w: campaign %s has plan %s, this plan is %s", errPlanMismatch, plan.CampaignID, old.PlanDigest, c.PlanDigest)
		}
		return old, nil
	}
	return nil, fmt.Errorf("seal: freeze campaign %s: too many concurrent writers", plan.CampaignID)
}

// updateCampaignKV applies fn to the current record and writes it with Update on the key's last
// revision; on a revision conflict (another writer got there first) it re-reads and re-applies fn, up
// to 50 times. fn must be a pure function of the record it is given. A result equal to the record
// (but for its time) is not written.
func updateCampaignKV(ctx context.Context, kv jetstream.KeyValue, id string, fn func(*schemas.Campaign) error) (*schemas.Campaign, error) {
	return updateCampaign(ctx, bucketHistory(kv), id, fn)
}

func updateCampaign(ctx context.Context, h history, id string, fn func(*schemas.Campaign) error) (*schemas.Campaign, error) {
	for try := 0; try < 50; try++ {
		c, rev, err := getCampaign(ctx, h, id)
		if err != nil {
			return nil, fmt.Errorf("seal: read campaign %s: %w", id, err)
		}
		before := *c
		before.Cells = append([]schemas.CampaignCell(nil), c.Cells...)
		if err := fn(c); err != nil {
			return nil, err
		}
		c.Recompute()
		if c.State == before.State && reflect.DeepEqual(c.Cells, before.Cells) {
			return c, nil
		}
		c.UpdatedAtUnixMS = time.Now().UnixMilli()
		body, _ := json.Marshal(c)
		_, err = h.kv.Update(ctx, CampaignKey(id), body, rev)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, nats.ErrMaxPayload) {
			return nil, tooLarge(err, "campaign record "+CampaignKey(id), len(body))
		}
		if !isKeyTaken(err) {
			return nil, fmt.Errorf("seal: update campaign %s: %w", id, err)
		}
		time.Sleep(time.Duration(try+1) * 5 * time.Millisecond)
	}
	return nil, fmt.Errorf("seal: update campaign %s: too many concurrent writers", id)
}

// recordCellsKV sets the states of the given cells in campaign id. A cell sealed earlier stays sealed.
func recordCellsKV(ctx context.Context, kv jetstream.KeyValue, id string, cells map[string]schemas.CampaignCell) (*schemas.Campaign, error) {
	return recordCells(ctx, bucketHistory(kv), id, cells)
}

func recordCells(ctx context.Context, h history, id string, cells map[string]schemas.CampaignCell) (*schemas.Campaign, error) {
	return updateCampaign(ctx, h, id, func(c *schemas.Campaign) error {
		for i := range c.Cells {
			if upd, ok := cells[c.Cells[i].Key]; ok && c.Cells[i].State != schemas.CellSealed {
				c.Cells[i] = upd
			}
		}
		return nil
	})
}
