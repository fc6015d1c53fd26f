package seal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// loseKey removes key's value from the bucket's stream behind the sealer's back, leaving no delete
// marker: what a power cut before the server's fsync, or a damaged block, does to it.
// loseKey makes the server lose key as a damaged block file or a power cut before the fsync would:
// FPM_DATASETS is rebuilt with every other message it held, in order (a protected bucket denies the
// deletes and purges that could remove it otherwise).
func loseKey(t testing.TB, js jetstream.JetStream, kv jetstream.KeyValue, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lost := "$KV." + streams.BucketDatasets + "." + key
	var keep []*nats.Msg
	for _, m := range natsservertest.Messages(t, js, "KV_"+streams.BucketDatasets, ">") {
		if m.Subject() != lost {
			keep = append(keep, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		}
	}
	s, err := js.Stream(ctx, "KV_"+streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := js.DeleteStream(ctx, cfg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, m := range keep {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("%s still readable after the loss: %v", key, err)
	}
}

// datasetEvents returns the dataset events stored on FPM_EVENTS.
func datasetEvents(t testing.TB, js jetstream.JetStream) []streams.DatasetEvent {
	t.Helper()
	var out []streams.DatasetEvent
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.DatasetEventWildcard) {
		var ev streams.DatasetEvent
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		if m.Subject() != streams.DatasetEventSubject(ev.CampaignID) || m.Headers().Get(streams.HeaderEventType) != ev.Type ||
			m.Headers().Get(streams.HeaderMsgID) != ev.ID || ev.Schema != streams.DatasetEventSchema {
			t.Fatalf("dataset event on %s, headers %v: %s", m.Subject(), m.Headers(), m.Data())
		}
		out = append(out, ev)
	}
	return out
}

func gaugeValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestPublishRefusesAMissingCellAnotherRunWouldTake: a sealed cell vanishes from FPM_DATASETS; the
// audit finds it from the campaign record; a different run's publication is refused (naming both runs)
// and does not take the key; the run that sealed it may seal it again, which restores it.
func TestPublishRefusesAMissingCellAnotherRunWouldTake(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx := context.Background()
	// The first sealer reads from the bucket stream's leader, the second through the bucket.
	first, _ := NewSealer(kv, WithSource("first"), withJetStream(env.JS))
	dsA := testDataset("run-A", testCell(0, "run-A", 1, 4), testCell(1, "run-A", 1, 4))
	if _, err := first.PublishDataset(ctx, dsA, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	campaignA := CampaignIDFor(dsA)
	lost := dsA.Cells[0]
	loseKey(t, env.JS, kv, lost.Key)

	second, _ := NewSealer(kv, WithSource("second"))
	for _, s := range []*Sealer{first, second} {
		rep, err := s.Audit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Checked != 2 || len(rep.Findings) != 1 || rep.Missing() != 1 {
			t.Fatalf("audit by %s: %+v", s.source, rep)
		}
		if f := rep.Findings[0]; f.Cell != lost.Key || f.CampaignID != campaignA || f.RunID != "run-A" || f.DatasetDigest != lost.Provenance.DatasetDigest {
			t.Fatalf("finding by %s: %+v", s.source, f)
		}
	}

	cellB := testCell(0, "run-B", 1.5, 4)
	repB, err := second.PublishDataset(ctx, testDataset("run-B", cellB), PublishOptions{})
	var cs *conflictsError
	if !errors.As(err, &cs) || !errors.Is(err, ErrConflict) || !errors.Is(err, ErrSealMissing) || len(cs.Conflicts) != 1 {
		t.Fatalf("competing run: %v", err)
	}
	c := cs.Conflicts[0]
	if !c.Missing || c.Key != lost.Key || c.CampaignID != campaignA || c.Sealed.RunID != "run-A" || c.Sealed.DatasetDigest != lost.Provenance.DatasetDigest ||
		c.Refused.RunID != "run-B" || c.Refused.DatasetDigest != cellB.Provenance.DatasetDigest || c.Refused.Source != "second" ||
		!strings.Contains(c.Error(), `"run-A"`) || !strings.Contains(c.Error(), `"run-B"`) {
		t.Fatalf("refusal %+v: %v", c, c)
	}
	if len(repB.Cells) != 1 || repB.Cells[0].State != conflict.String() {
		t.Fatalf("report %+v", repB)
	}
	if _, err := kv.Get(ctx, lost.Key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the refused run took the key: %v", err)
	}
	campB, _, err := getCampaignKV(ctx, kv, CampaignIDFor(testDataset("run-B")))
	if err != nil || len(campB.Cells) != 1 || campB.Cells[0].State != schemas.CellConflict {
		t.Fatalf("campaign of run-B: %+v %v", campB, err)
	}

	// The run that sealed it publishes again: the cell is sealed again, and the audit finds nothing.
	if _, err := first.PublishDataset(ctx, dsA, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	v, _, err := get(ctx, kv, lost.Key)
	if err != nil || v.Provenance.RunID != "run-A" || v.Provenance.DatasetDigest != lost.Provenance.DatasetDigest {
		t.Fatalf("restored cell %+v: %v", v, err)
	}
	for _, s := range []*Sealer{first, second} {
		if rep, err := s.Audit(ctx); err != nil || len(rep.Findings) != 0 || rep.Checked != 2 {
			t.Fatalf("audit by %s after the restore: %+v %v", s.source, rep, err)
		}
	}
}

// TestConsumerReportsAMissingSealAndRefusesACompetingRun: the sealer consumer, restarted after a
// sealed cell vanished, reports it (log, gauge, cell_missing event); a different run's merged artefact
// for the same cell is then refused and reported (counter, seal_refused event naming both runs), and
// the key stays empty.
func TestConsumerReportsAMissingSealAndRefusesACompetingRun(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	doc, runA := goldenRun(t)
	profile, _ := json.Marshal(testProfile)
	outcomes := make(chan error, 4)
	hook := func(_ string, _ *report, err error) { outcomes <- err }
	outcome := func() error {
		select {
		case err := <-outcomes:
			return err
		case <-ctx.Done():
			t.Fatal("no outcome")
			return nil
		}
	}
	if _, err := benchstore.PublishProfile(ctx, env.JS, runA, profile); err != nil {
		t.Fatal(err)
	}
	publishMergedBody(t, env.JS, runA, doc)
	s, _ := NewSealer(kv, WithSource("fpmbus seal"))
	rc := startSealer(t, env, Config{Sealer: s, OutcomeHook: hook})
	if err := outcome(); err != nil {
		t.Fatalf("run %s: %v", runA, err)
	}
	if err := rc.stop(t); err != nil {
		t.Fatal(err)
	}
	var cell string
	for _, k := range keys(t, kv) {
		if strings.HasPrefix(k, schemas.CellKeyPrefix) {
			cell = k
		}
	}
	sealed, _, err := get(ctx, kv, cell)
	if err != nil {
		t.Fatal(err)
	}
	loseKey(t, env.JS, kv, cell)

	reg := prometheus.NewRegistry()
	startSealer(t, env, Config{Sealer: s, OutcomeHook: hook, Registerer: reg}, durable.WithMemberID("sealer-2"))
	evs := datasetEvents(t, env.JS)
	if len(evs) != 1 {
		t.Fatalf("dataset events %+v, want one cell_missing", evs)
	}
	if ev := evs[0]; ev.Type != streams.DatasetCellMissing || ev.Cell != cell || ev.SealedRunID != runA ||
		ev.SealedDatasetDigest != sealed.Provenance.DatasetDigest || ev.CampaignID != sealed.CampaignID || ev.DetectedBy != "sealer-2" {
		t.Fatalf("event %+v (sealed %+v)", ev, sealed)
	}
	if v := gaugeValue(t, reg, "fpmbus_seal_sealed_cells_missing"); v != 1 {
		t.Fatalf("fpmbus_seal_sealed_cells_missing %v, want 1", v)
	}

	// A different run measuring the same cell.
	runB := runA + "-b"
	docB := bytes.ReplaceAll(doc, []byte(runA), []byte(runB))
	if _, err := benchstore.PublishProfile(ctx, env.JS, runB, profile); err != nil {
		t.Fatal(err)
	}
	publishMergedBody(t, env.JS, runB, docB)
	if err := outcome(); !errors.Is(err, ErrSealMissing) {
		t.Fatalf("run %s: %v, want a refusal of the missing cell", runB, err)
	}
	if _, err := kv.Get(ctx, cell); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the refused run took the key: %v", err)
	}
	evs = datasetEvents(t, env.JS)
	if len(evs) != 2 {
		t.Fatalf("dataset events %+v, want cell_missing and seal_refused", evs)
	}
	if ev := evs[1]; ev.Type != streams.DatasetSealRefused || ev.Cell != cell || ev.SealedRunID != runA || ev.RefusedRunID != runB ||
		ev.CampaignID != sealed.CampaignID || ev.RefusedDatasetDigest == "" || ev.RefusedAttemptID == "" {
		t.Fatalf("event %+v", ev)
	}
	if v := gaugeValue(t, reg, "fpmbus_seal_missing_cell_refusals_total"); v != 1 {
		t.Fatalf("fpmbus_seal_missing_cell_refusals_total %v, want 1", v)
	}
}

// The audit's reads wait out a cluster electing a leader (a 503 right after nodes restarted) within
// the sealer's retries, and give up at once on anything else.
func TestLeaderReadsWaitOutAnUnavailableCluster(t *testing.T) {
	t.Parallel()
	unavailable := &jetstream.APIError{Code: 503, ErrorCode: natsconn.ErrCodeJetStreamUnavailable, Description: "JetStream system temporarily unavailable"}
	notFound := &jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}
	tests := map[string]struct {
		fail      int   // calls that fail before one succeeds
		failWith  error // what they fail with
		wantCalls int
		wantErr   error
	}{
		"answers at once":                {fail: 0, wantCalls: 1},
		"a leader elected after 3 tries": {fail: 3, failWith: unavailable, wantCalls: 4},
		"unavailable past the retries":   {fail: 99, failWith: unavailable, wantCalls: 5, wantErr: unavailable},
		"not found is final":             {fail: 99, failWith: notFound, wantCalls: 1, wantErr: notFound},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := &Sealer{retries: 5, backoff: time.Millisecond, opTimeout: time.Second}
			calls := 0
			err := s.untilAvailable(context.Background(), func(ctx context.Context) error {
				if _, ok := ctx.Deadline(); !ok {
					t.Fatal("a call without the operation timeout")
				}
				if calls++; calls <= tc.fail {
					return fmt.Errorf("streams: leader get: %w", tc.failWith)
				}
				return nil
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("calls %d, err %v; want %d calls, err %v", calls, err, tc.wantCalls, tc.wantErr)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := &Sealer{retries: 5, backoff: time.Millisecond, opTimeout: time.Second}
	calls := 0
	if err := s.untilAvailable(ctx, func(context.Context) error { calls++; return unavailable }); calls != 1 || !errors.Is(err, unavailable) {
		t.Fatalf("after the caller's context ended: calls %d, err %v; want 1 call", calls, err)
	}
}
