package seal

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// A credential that may write FPM_DATASETS (the sealer's own) tries to rewrite sealed history: the
// server refuses a purge of the key (no rollups), a purge of the stream and a message delete; an
// overwrite and a delete marker are stored as later revisions, which change nothing a reader sees: the
// sealed cell is its first revision, the campaign record keeps its seal, a re-publication of the run
// is idempotent and another run's is a conflict. The audit reports each later revision as tampering.
func TestTamperingCannotDisplaceASealedCell(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx := context.Background()
	s, _ := NewSealer(kv, WithSource("test"), withJetStream(env.JS))
	dsA := testDataset("run-A", testCell(1, "run-A", 1, 4))
	if _, err := s.PublishDataset(ctx, dsA, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	key, campaign := dsA.Cells[0].Key, CampaignKey(CampaignIDFor(dsA))
	sealed, rev, err := get(ctx, kv, key)
	if err != nil {
		t.Fatal(err)
	}

	// What the server refuses on the protected bucket.
	if err := kv.Purge(ctx, key); err == nil {
		t.Fatal("kv purge of a sealed cell was stored")
	}
	st, err := env.JS.Stream(ctx, streams.DatasetsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+streams.BucketDatasets+"."+key)); err == nil {
		t.Fatal("a stream purge of the cell's subject succeeded")
	}
	if err := st.DeleteMsg(ctx, rev); err == nil {
		t.Fatal("deleting the sealed revision succeeded")
	}
	// What it stores as later revisions: an overwrite, a delete marker; a rewritten campaign record.
	forged := *sealed
	forged.Provenance.RunID = "run-forged"
	body, _ := json.Marshal(forged)
	if _, err := kv.Put(ctx, key, body); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	c, _, err := getCampaignKV(ctx, kv, CampaignIDFor(dsA))
	if err != nil {
		t.Fatal(err)
	}
	c.Cells[0].RunID = "run-forged"
	cbody, _ := json.Marshal(c)
	if _, err := kv.Put(ctx, campaign, cbody); err != nil {
		t.Fatal(err)
	}

	for name, sl := range map[string]*Sealer{"through the bucket": mustSealer(t, kv), "from the leader": s} {
		got, grev, err := get(ctx, kv, key)
		if name == "from the leader" {
			var kh *schemas.KeyHistory
			if kh, err = sl.history().sealed(ctx, key); err == nil {
				got, grev = kh.Cell, kh.Revision
			}
		}
		if err != nil || grev != rev || got.Provenance.RunID != "run-A" || got.AttemptID != sealed.AttemptID {
			t.Fatalf("%s: the sealed cell reads as %+v revision %d (%v), want run-A at %d", name, got, grev, err, rev)
		}
		rc, _, err := getCampaign(ctx, sl.history(), CampaignIDFor(dsA))
		if err != nil || rc.Cells[0].State != schemas.CellSealed || rc.Cells[0].RunID != "run-A" {
			t.Fatalf("%s: the campaign record reads as %+v (%v)", name, rc, err)
		}
		rep, err := sl.Audit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Findings) != 0 || rep.TamperedKeys(schemas.CellKeyPrefix) != 1 || rep.TamperedKeys(schemas.CampaignKeyPrefix) != 1 || len(rep.Tampered) != 3 {
			t.Fatalf("%s: audit %+v, want no finding and three tampered revisions of one cell and one campaign", name, rep)
		}
		if rep.Tampered[0].Key != key || rep.Tampered[0].Op != "PUT" || rep.Tampered[1].Op != "DEL" || rep.Tampered[2].Key != campaign {
			t.Fatalf("%s: tampered %+v", name, rep.Tampered)
		}
	}

	// Sealing goes on: the same run is idempotent, another run is a conflict naming run-A.
	if rep, err := s.PublishDataset(ctx, testDataset("run-A", testCell(1, "run-A", 1, 4)), PublishOptions{}); err != nil || rep.Cells[0].State != alreadySealed.String() {
		t.Fatalf("re-publication of run-A: %+v %v", rep, err)
	}
	var ce *conflictError
	if _, err := s.PublishDataset(ctx, testDataset("run-B", testCell(1, "run-B", 2, 4)), PublishOptions{}); !errors.As(err, &ce) || ce.Sealed.RunID != "run-A" {
		t.Fatalf("run-B: %v, want a conflict with run-A", err)
	}
}

func mustSealer(t *testing.T, kv jetstream.KeyValue) *Sealer {
	t.Helper()
	s, err := NewSealer(kv, WithSource("test"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// At start, a sealer whose credential may update the stream protects an earlier deployment's bucket
// (rollups allowed, 64 revisions a key), keeping what it holds, and reports it protected (gauge 0).
func TestConsumerProtectsAnEarlierBucketAtStart(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	old, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, History: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Create(ctx, "cell.earlier", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	startSealer(t, env, Config{Registerer: reg})
	s, err := env.JS.Stream(ctx, streams.DatasetsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || !streams.ProtectedDatasets(info.Config) || info.State.Msgs != 1 {
		t.Fatalf("after the sealer started: %+v, %d messages (%v)", info.Config, info.State.Msgs, err)
	}
	if v := gaugeValue(t, reg, "fpmbus_seal_bucket_unprotected"); v != 0 {
		t.Fatalf("fpmbus_seal_bucket_unprotected %v", v)
	}
}

// A credential that may write FPM_DATASETS (the sealer's own, leaked or buggy) stores a delete marker
// and junk as the first revisions of cell keys nobody sealed yet, and junk as the first revision of
// the campaign record: none of them is a seal or a frozen plan, so none takes the cell or the record.
// The honest publication that follows seals both cells and freezes its plan on top of them; every
// reader reads the honest seals (the bucket, the leader, the listing), the audit reports each junk
// revision as tampering, and a later run is a conflict with the honest one.
func TestJunkStoredBeforeTheSealCannotPreemptIt(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx := context.Background()
	dsA := testDataset("run-A", testCell(1, "run-A", 1, 4), testCell(2, "run-A", 1, 4))
	deleted, junk, campaign := dsA.Cells[0].Key, dsA.Cells[1].Key, CampaignKey(CampaignIDFor(dsA))
	if err := kv.Delete(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, junk, []byte(`{"forged":true}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, campaign, []byte(`not a campaign`)); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{deleted, junk} {
		if _, _, err := get(ctx, kv, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s before the seal: %v, want not sealed", key, err)
		}
	}

	s, _ := NewSealer(kv, WithSource("test"), withJetStream(env.JS))
	rep, err := s.PublishDataset(ctx, dsA, PublishOptions{})
	if err != nil {
		t.Fatalf("the honest publication after the junk: %v", err)
	}
	for _, c := range rep.Cells {
		if c.State != sealed.String() {
			t.Fatalf("cell %s: %s, want sealed", c.Key, c.State)
		}
	}
	for name, sl := range map[string]*Sealer{"through the bucket": mustSealer(t, kv), "from the leader": s} {
		for _, key := range []string{deleted, junk} {
			kh, err := sl.history().sealed(ctx, key)
			if err != nil || kh.Cell == nil || kh.Cell.Provenance.RunID != "run-A" || kh.Revision <= 3 {
				t.Fatalf("%s: %s reads as %+v (%v), want run-A's seal after the junk", name, key, kh, err)
			}
		}
		c, _, err := getCampaign(ctx, sl.history(), CampaignIDFor(dsA))
		if err != nil || c.State != schemas.CampaignComplete {
			t.Fatalf("%s: the campaign record reads as %+v (%v)", name, c, err)
		}
		audit, err := sl.Audit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(audit.Findings) != 0 || len(audit.CorruptCampaigns) != 0 || len(audit.Tampered) != 3 {
			t.Fatalf("%s: audit %+v, want no finding and the three junk revisions as tampering", name, audit)
		}
		want := map[string]string{deleted: "DEL", junk: "PUT", campaign: "PUT"}
		for _, got := range audit.Tampered {
			if got.Op != want[got.Key] || got.CampaignID != CampaignIDFor(dsA) {
				t.Fatalf("%s: tampered revision %+v, want %v", name, got, want)
			}
			delete(want, got.Key)
		}
	}
	entries, err := list(ctx, kv)
	if err != nil || len(entries) != 3 {
		t.Fatalf("listing: %+v (%v)", entries, err)
	}
	for _, e := range entries {
		if e.Problem != "" || len(e.Ignored) != 1 || (e.Cell == nil) == (e.Campaign == nil) {
			t.Fatalf("listed %s: %+v, want its record and one ignored revision", e.Key, e)
		}
	}
	var ce *conflictError
	if _, err := s.PublishDataset(ctx, testDataset("run-B", testCell(1, "run-B", 2, 4)), PublishOptions{}); !errors.As(err, &ce) || ce.Sealed.RunID != "run-A" {
		t.Fatalf("run-B: %v, want a conflict with run-A", err)
	}
}
