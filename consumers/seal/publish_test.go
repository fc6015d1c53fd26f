package seal

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func singleNode(t *testing.T) (*natsservertest.Env, jetstream.KeyValue) {
	t.Helper()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := OpenBucket(ctx, env.JS, streams.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return env, kv
}

func keys(t *testing.T, kv jetstream.KeyValue) []string {
	t.Helper()
	ks, err := kv.ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for k := range ks.Keys() {
		out = append(out, k)
	}
	return out
}

func TestPublishIdempotentAndConflict(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	ctx := context.Background()
	s, _ := NewSealer(kv, WithSource("test"))
	ds := testDataset("run-A", testCell(1, "run-A", 1, 4), testCell(2, "run-A", 1, 4))
	rep, err := s.PublishDataset(ctx, ds, PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Campaign != schemas.CampaignComplete || rep.Cells[0].State != "sealed" {
		t.Fatalf("first publication: %+v", rep)
	}
	before, rev, _ := get(ctx, kv, ds.Cells[0].Key)

	t.Run("the same attempt again is an idempotent success", func(t *testing.T) {
		rep, err := s.PublishDataset(ctx, testDataset("run-A", testCell(1, "run-A", 1, 4), testCell(2, "run-A", 1, 4)), PublishOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rep.Cells {
			if c.State != alreadySealed.String() {
				t.Fatalf("%s: state %s", c.Key, c.State)
			}
		}
	})
	t.Run("a different attempt is a conflict naming both and leaves the value untouched", func(t *testing.T) {
		other := testDataset("run-B", testCell(1, "run-B", 2, 4))
		_, err := s.PublishDataset(ctx, other, PublishOptions{})
		var ce *conflictsError
		if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.ExitCode() != exitConflict {
			t.Fatalf("want ConflictsError, got %v", err)
		}
		c := ce.Conflicts[0]
		if c.Sealed.RunID != "run-A" || c.Refused.RunID != "run-B" || c.Sealed.DatasetDigest == c.Refused.DatasetDigest {
			t.Fatalf("conflict does not name both identities: %v", c)
		}
		after, rev2, _ := get(ctx, kv, ds.Cells[0].Key)
		if rev2 != rev || after.AttemptID != before.AttemptID {
			t.Fatal("sealed value changed")
		}
	})
}

func TestPublishRejectsBeforeAnyWrite(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	s, _ := NewSealer(kv)
	bad := testCell(2, "run-A", 1, 4)
	bad.Rows[1].LatencyMS = -1
	bad.Finish()
	_, err := s.PublishDataset(context.Background(), testDataset("run-A", testCell(1, "run-A", 1, 4), bad), PublishOptions{})
	var verr schemas.ValidationErrors
	if !errors.As(err, &verr) || verr[0].Rule != schemas.RuleLatency || verr[0].Row != 1 {
		t.Fatalf("want a latency rejection on row 1, got %v", err)
	}
	if ks := keys(t, kv); len(ks) != 0 {
		t.Fatalf("rejected publication wrote %v", ks)
	}
}

func TestPublishIncompleteWithoutAllowPartialWritesNothing(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	s, _ := NewSealer(kv)
	plan := &schemas.DatasetPlan{SchemaVersion: 1, CampaignID: "camp-1", Cells: []schemas.PlanCell{
		{Identity: testIdentity(1), ExpectedRows: 4, EstimatedGPUHours: 1}, {Identity: testIdentity(2), ExpectedRows: 4, EstimatedGPUHours: 1}}}
	_, err := s.PublishDataset(context.Background(), testDataset("run-A", testCell(1, "run-A", 1, 4)), PublishOptions{Plan: plan})
	if !errors.Is(err, errIncomplete) {
		t.Fatalf("want ErrIncomplete, got %v", err)
	}
	if ks := keys(t, kv); len(ks) != 0 {
		t.Fatalf("incomplete publication wrote %v", ks)
	}
}

func TestPartialPublication(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	ctx := context.Background()
	s, _ := NewSealer(kv)
	plan := &schemas.DatasetPlan{SchemaVersion: 1, CampaignID: "camp-1", Cells: []schemas.PlanCell{
		{Identity: testIdentity(1), ExpectedRows: 4, EstimatedGPUHours: 1},
		{Identity: testIdentity(2), ExpectedRows: 4, EstimatedGPUHours: 2},
		{Identity: testIdentity(3), ExpectedRows: 4, EstimatedGPUHours: 4}}}
	bad := testCell(2, "run-A", 1, 4)
	bad.Rows[0].NumDecodeRequests = 3 // phase-invalid
	bad.Finish()
	ds := testDataset("run-A", testCell(1, "run-A", 1, 4), bad) // cell 3 never produced
	rep, err := s.PublishDataset(ctx, ds, PublishOptions{AllowPartial: true, Plan: plan})
	var pe *partialError
	if !errors.As(err, &pe) || !errors.Is(err, errPartial) {
		t.Fatalf("want PartialError, got %v", err)
	}
	if pe.ExitCode() != exitPartial || pe.Sealed != 1 || len(pe.Missing) != 2 {
		t.Fatalf("partial error: %+v", pe)
	}
	if rep.Campaign != schemas.CampaignPartial {
		t.Fatalf("campaign state %s", rep.Campaign)
	}
	camp, _, err := getCampaignKV(ctx, kv, "camp-1")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]schemas.CampaignCell{}
	for _, c := range camp.Cells {
		states[c.Key] = c
	}
	if states[testIdentity(1).Key()].State != schemas.CellSealed ||
		states[testIdentity(2).Key()].State != schemas.CellMissing || states[testIdentity(2).Key()].Reason == "" ||
		states[testIdentity(3).Key()].State != schemas.CellMissing {
		t.Fatalf("campaign record: %+v", camp.Cells)
	}
	if _, _, err := get(ctx, kv, testIdentity(2).Key()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("rejected cell was sealed: %v", err)
	}
	cov, err := Coverage(ctx, kv, plan)
	if err != nil {
		t.Fatal(err)
	}
	if cov.State != partial {
		t.Fatalf("coverage %s, want partial", cov.State)
	}
	// A later run fills the missing cells: the campaign completes; the sealed cell stays sealed.
	rep, err = s.PublishDataset(ctx, testDataset("run-B", testCell(2, "run-B", 1, 4), testCell(3, "run-B", 1, 4)),
		PublishOptions{AllowPartial: true, Plan: plan})
	if err != nil || rep.Campaign != schemas.CampaignComplete {
		t.Fatalf("second run: %v, campaign %s", err, rep.Campaign)
	}
}

func TestCampaignUpdateRetriesOnConflict(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	ctx := context.Background()
	plan := &schemas.DatasetPlan{SchemaVersion: 1, CampaignID: "camp-2"}
	for i := range 20 {
		plan.Cells = append(plan.Cells, schemas.PlanCell{Identity: testIdentity(i), ExpectedRows: 1})
	}
	if _, err := freezePlanKV(ctx, kv, plan); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 20)
	for i := range 20 {
		go func() {
			k := testIdentity(i).Key()
			_, err := recordCellsKV(ctx, kv, "camp-2", map[string]schemas.CampaignCell{k: {Key: k, State: schemas.CellSealed}})
			errc <- err
		}()
	}
	for range 20 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	camp, _, _ := getCampaignKV(ctx, kv, "camp-2")
	if camp.State != schemas.CampaignComplete {
		t.Fatalf("lost updates: %+v", camp)
	}
	other := *plan
	other.Cells = plan.Cells[:1]
	if _, err := freezePlanKV(ctx, kv, &other); !errors.Is(err, errPlanMismatch) {
		t.Fatalf("want ErrPlanMismatch, got %v", err)
	}
}

func TestCoverageReport(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	ctx := context.Background()
	s, _ := NewSealer(kv, WithSource("fpmbus datasets publish"))
	if _, err := s.PublishDataset(ctx, testDataset("run-A", testCell(1, "run-A", 1, 4), testCell(2, "run-A", 1, 2)), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	newer := testIdentity(4)
	newer.BackendVersion = "0.30.0" // only 0.29.0 data exists for model-4: it does not count
	if _, err := s.PublishDataset(ctx, testDataset("run-C", testCell(4, "run-C", 1, 4)), PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	plan := &schemas.DatasetPlan{SchemaVersion: 1, CampaignID: "camp-3", BudgetGPUHours: 5,
		UnsupportedSettings: []string{"speculative decoding"},
		Cells: []schemas.PlanCell{
			{Identity: testIdentity(1), ExpectedRows: 4, EstimatedGPUHours: 2},
			{Identity: testIdentity(2), ExpectedRows: 4, EstimatedGPUHours: 2},
			{Identity: testIdentity(3), ExpectedRows: 4, EstimatedGPUHours: 3},
			{Identity: newer, ExpectedRows: 4, EstimatedGPUHours: 1},
		}}
	rep, err := Coverage(ctx, kv, plan)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Covered != 1 || rep.Partial != 1 || rep.Missing != 2 || rep.State != partial {
		t.Fatalf("coverage: %+v", rep)
	}
	if rep.EstimatedGPUHours != 1+3+1 || rep.OverBudget {
		t.Fatalf("cost %v (over budget %v), want 5", rep.EstimatedGPUHours, rep.OverBudget)
	}
	c0 := rep.Cells[0]
	if c0.State != covered || c0.Source != "fpmbus datasets publish" || c0.DatasetDigest == "" || c0.RunID != "run-A" {
		t.Fatalf("covered cell lacks source/digest: %+v", c0)
	}
	if len(rep.UnsupportedSettings) != 1 {
		t.Fatal("unsupported settings not reported")
	}
}

// lostAckKV performs Create on the server and then reports a timeout, as a leader change after the
// write but before the ack does.
type lostAckKV struct {
	jetstream.KeyValue
	lost int
}

// Update loses the ack of a seal (an update at revision 0, revisions.go).
func (k *lostAckKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := k.KeyValue.Update(ctx, key, value, revision)
	if err == nil && revision == 0 && k.lost > 0 {
		k.lost--
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

func TestUnknownOutcomeSettledByReadBack(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	s, _ := NewSealer(&lostAckKV{KeyValue: kv, lost: 1}, withRetries(5, time.Millisecond))
	c := testCell(1, "run-A", 1, 4)
	out, err := s.Seal(context.Background(), &c, "")
	if err != nil || out.Result != sealed || !out.Settled {
		t.Fatalf("want Sealed settled by read-back, got %+v %v", out, err)
	}
	// A different sealer whose ack was lost after someone else won sees a conflict, not a win.
	s2, _ := NewSealer(&lostAckKV{KeyValue: kv, lost: 1}, withRetries(5, time.Millisecond))
	c2 := testCell(1, "run-B", 3, 4)
	if _, err := s2.Seal(context.Background(), &c2, ""); !errors.Is(err, ErrConflict) {
		t.Fatalf("want conflict, got %v", err)
	}
}

// A cell larger than the server's max_payload can never be stored: the publication ends at once with
// ErrTooLarge naming the cell and its size (the consumer dead-letters it), not after the retries of an
// unknown outcome, and nothing is sealed.
func TestPublishOfACellOverMaxPayloadIsFinal(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	s, _ := NewSealer(kv, WithSource("test"), withRetries(20, time.Second))
	ds := testDataset("run-big", testCell(1, "run-big", 1, 100_000))
	_, err := s.PublishDataset(context.Background(), ds, PublishOptions{})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), ds.Cells[0].Key) {
		t.Fatalf("publish of a %d-row cell: %v, want ErrTooLarge naming the cell", len(ds.Cells[0].Rows), err)
	}
	if _, _, err := get(context.Background(), kv, ds.Cells[0].Key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the cell: %v, want not sealed", err)
	}
}

// A publication reports each settled cell, ending at every cell it seals; a listing reports the
// bucket's revisions it reads, ending at all of them.
func TestPublishAndListReportProgress(t *testing.T) {
	t.Parallel()
	_, kv := singleNode(t)
	ctx := context.Background()
	s, _ := NewSealer(kv, WithSource("test"))
	var cells []schemas.Cell
	for i := range 20 {
		cells = append(cells, testCell(i+1, "run-P", 1, 4))
	}
	var calls, last, total int
	_, err := s.PublishDataset(ctx, testDataset("run-P", cells...), PublishOptions{Progress: func(done, t int) {
		calls, last, total = calls+1, done, t
	}})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 20 || last != 20 || total != 20 {
		t.Fatalf("%d progress calls, last %d of %d; want 20, 20 of 20", calls, last, total)
	}
	var read, of uint64
	entries, err := ListProgress(ctx, kv, func(r, n uint64) { read, of = r, n })
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 21 || of == 0 || read != of { // the cells and the campaign record
		t.Fatalf("%d entries; progress %d of %d", len(entries), read, of)
	}
}
