package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// A bucket of an earlier deployment (as nats.go creates one: history 64, rollups allowed) gets the
// protection from the plan of `fpmbus streams apply`, as changes none of which is destructive, and
// keeps every key; afterwards a purge of a key is refused, the first revision of a key outlives more
// writes than the old history held, and a second plan has nothing to change.
func TestApplyProtectsAnExistingDatasetsBucketKeepingItsCells(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, History: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Create(ctx, "cell.a", []byte(`{"sealed":"first"}`)); err != nil {
		t.Fatal(err)
	}
	plan, err := streams.NewPlan(ctx, env.JS, streams.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.AddDatasets(ctx, env.JS, streams.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Join(plan.Lines(), "\n")
	for _, want := range []string{"KV_FPM_DATASETS deny_purge false -> true", "KV_FPM_DATASETS allow_rollup_hdrs true -> false",
		"KV_FPM_DATASETS discard_new_per_subject false -> true", "KV_FPM_DATASETS max_msgs_per_subject 64 -> 65536"} {
		if !strings.Contains(lines, want) {
			t.Fatalf("plan does not say %q:\n%s", want, lines)
		}
	}
	if d := plan.Destructive(); len(d) != 0 {
		t.Fatalf("destructive changes %v", d)
	}
	if err := plan.Execute(ctx, env.JS, false); err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx, streams.DatasetsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !streams.ProtectedDatasets(info.Config) || info.State.Msgs != 1 {
		t.Fatalf("after apply: %+v, %d messages", info.Config, info.State.Msgs)
	}
	kv, err := env.JS.KeyValue(ctx, streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "cell.a"); err == nil {
		t.Fatal("kv purge stored on the protected bucket")
	}
	for i := range 70 {
		if _, err := kv.Put(ctx, "cell.a", []byte{byte('a' + i%26)}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := s.GetMsg(ctx, 1)
	if err != nil || string(first.Data) != `{"sealed":"first"}` {
		t.Fatalf("the first revision after 70 more: %v %q", err, first.Data)
	}
	if changes, err := streams.ProtectDatasets(ctx, env.JS, time.Second, nil); err != nil || changes != nil {
		t.Fatalf("protecting a protected bucket: %v %v", changes, err)
	}
	again, err := streams.NewPlan(ctx, env.JS, streams.DefaultConfig())
	if err == nil {
		err = again.AddDatasets(ctx, env.JS, streams.DefaultConfig())
	}
	if err != nil || !strings.Contains(strings.Join(again.Lines(), "\n"), "KV_FPM_DATASETS unchanged") {
		t.Fatalf("second plan: %v %v", again.Lines(), err)
	}
}

// A missing bucket is created protected; one that exists is opened as it is.
func TestEnsureDatasetsCreatesTheBucketProtected(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := streams.EnsureDatasets(ctx, env.JS, streams.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil || st.History() != streams.DatasetsMaxRevisions {
		t.Fatalf("status %v %v", st, err)
	}
	s, _ := env.JS.Stream(ctx, streams.DatasetsStream)
	if cfg := s.CachedInfo().Config; !streams.ProtectedDatasets(cfg) || !cfg.DenyDelete || !cfg.DenyPurge || cfg.AllowRollup || !cfg.DiscardNewPerSubject {
		t.Fatalf("created %+v", cfg)
	}
	if _, err := streams.EnsureDatasets(ctx, env.JS, streams.DefaultConfig()); err != nil {
		t.Fatalf("opening it again: %v", err)
	}
	if err := s.Purge(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stream purge: %v, want the server's refusal", err)
	}
}

// At start, a credential that may update the stream protects an earlier bucket (the changes are
// returned, its keys kept); one that may not is told what is missing (errUnprotected) within the
// timeout and the bucket is left as it is.
func TestProtectDatasetsAddsWhatAnEarlierBucketLacks(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	old, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, History: 64})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, "cell.a", []byte("v")); err != nil {
		t.Fatal(err)
	}
	changes, err := streams.ProtectDatasets(ctx, env.JS, 5*time.Second, nil)
	if err != nil || len(changes) == 0 {
		t.Fatalf("protect: %v %v", changes, err)
	}
	for _, ch := range changes {
		if ch.Destructive {
			t.Fatalf("destructive %v", ch)
		}
	}
	s, _ := env.JS.Stream(ctx, streams.DatasetsStream)
	info, _ := s.Info(ctx)
	if !streams.ProtectedDatasets(info.Config) || info.State.Msgs != 1 {
		t.Fatalf("after protect: %+v, %d messages", info.Config, info.State.Msgs)
	}
}
