package streams_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestApplyIsIdempotentAndDefinesStreams(t *testing.T) {
	env := natsservertest.Start(t) // applies once
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	if err := streams.Apply(ctx, env.JS, cfg); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	for _, want := range cfg.All() {
		s, err := env.JS.Stream(ctx, want.Name)
		if err != nil {
			t.Fatalf("stream %s: %v", want.Name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Duplicates != cfg.DuplicateWindow || info.Config.Subjects[0] != want.Subjects[0] {
			t.Fatalf("%s: got duplicates %v subjects %v", want.Name, info.Config.Duplicates, info.Config.Subjects)
		}
	}
	// Changing a limit updates in place.
	cfg.MaxAge = time.Hour
	if err := streams.Apply(ctx, env.JS, cfg); err != nil {
		t.Fatalf("apply with new max age: %v", err)
	}
	s, _ := env.JS.Stream(ctx, streams.StreamFPM)
	info, _ := s.Info(ctx)
	if info.Config.MaxAge != time.Hour {
		t.Fatalf("max age not updated: %v", info.Config.MaxAge)
	}
}

func TestApplyRejectsBadConfig(t *testing.T) {
	cfg := streams.DefaultConfig()
	cfg.Replicas = 0
	if err := streams.Apply(context.Background(), nil, cfg); err == nil {
		t.Fatal("replicas 0 must be rejected before any server call")
	}
}

func TestDedupWithinWindowAndServerRestartKeepsData(t *testing.T) {
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w1", DPRank: 1}
	for i := 0; i < 2; i++ {
		ack, err := env.JS.Publish(ctx, streams.FPMSubject(k), []byte(`{"version":1}`), jetstream.WithMsgID(streams.MsgID(k, 5, 0)))
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && !ack.Duplicate {
			t.Fatal("second publish with the same id must be a duplicate")
		}
	}
	listen := env.Server.NATS().Addr().String()
	store := env.StoreDir
	env.Stop()
	env2 := natsservertest.StartAt(t, listen, store)
	msgs := natsservertest.Messages(t, env2.JS, streams.StreamFPM, "fpm.*.*.*.1")
	if len(msgs) != 1 || msgs[0].Subject() != "fpm.dynamo.backend.w1.1" {
		t.Fatalf("after restart got %d messages", len(msgs))
	}
}

// A plan that would delete stored messages is refused as a whole unless forced: the operator's stream
// keeps its limits and messages, and not even a missing stream is created.
func TestPlanRefusesDestructiveChangesUnlessForced(t *testing.T) {
	const stored = 7599
	env := natsservertest.Start(t)
	ctx := t.Context()
	before := operatorStream(t, env, stored, func(sc *jetstream.StreamConfig) {
		sc.MaxBytes, sc.MaxAge = 2_000_000, time.Hour
		sc.Description, sc.Compression = "operator's FPM", jetstream.S2Compression
	})
	if err := env.JS.DeleteStream(ctx, streams.StreamBench); err != nil {
		t.Fatal(err)
	}
	cfg := streams.DefaultConfig()
	cfg.MaxBytes = 100_000 // lower: deletes most of the stream
	// max age stays the default 168h: longer than the operator's hour, a change that deletes nothing

	plan, err := streams.NewPlan(ctx, env.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wantLines := []string{
		"FPM max_bytes 2000000 -> 100000 (can delete stored messages)",
		"FPM max_age 1h0m0s -> 168h0m0s",
		"FPM_EVENTS unchanged",
		"FPM_BENCH does not exist: create",
	}
	if got := plan.Lines(); !reflect.DeepEqual(got, wantLines) {
		t.Fatalf("plan lines:\n got %q\nwant %q", got, wantLines)
	}
	if d := plan.Destructive(); len(d) != 1 || d[0].Setting != "max_bytes" {
		t.Fatalf("destructive changes %+v, want max_bytes only", d)
	}

	err = plan.Execute(ctx, env.JS, false)
	if !errors.Is(err, streams.ErrDestructive) || !strings.Contains(err.Error(), "FPM max_bytes 2000000 -> 100000") {
		t.Fatalf("Execute without force: %v, want ErrDestructive naming FPM max_bytes", err)
	}
	after := info(t, env.JS, streams.StreamFPM)
	if !reflect.DeepEqual(after.Config, before) || after.State.Msgs != stored {
		t.Fatalf("refused plan changed FPM: %+v, %d messages", after.Config, after.State.Msgs)
	}
	if _, err := env.JS.Stream(ctx, streams.StreamBench); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("refused plan created %s: %v", streams.StreamBench, err)
	}

	if err := plan.Execute(ctx, env.JS, true); err != nil {
		t.Fatalf("Execute with force: %v", err)
	}
	after = info(t, env.JS, streams.StreamFPM)
	if after.Config.MaxBytes != 100_000 || after.Config.MaxAge != 168*time.Hour {
		t.Fatalf("forced plan left max_bytes %d max_age %v", after.Config.MaxBytes, after.Config.MaxAge)
	}
	if after.State.Bytes > 100_000 || after.State.Msgs >= stored || after.State.Msgs == 0 {
		t.Fatalf("forced plan: %d messages, %d bytes; want the oldest discarded down to 100000 bytes", after.State.Msgs, after.State.Bytes)
	}
	// Settings fpmbus does not define stay the operator's.
	if after.Config.Description != "operator's FPM" || after.Config.Compression != jetstream.S2Compression {
		t.Fatalf("forced plan reset description %q compression %v", after.Config.Description, after.Config.Compression)
	}
	if d := streams.Diff(info(t, env.JS, streams.StreamBench).Config, cfg.BenchStream()); len(d) != 0 {
		t.Fatalf("%s created with differences %v", streams.StreamBench, d)
	}
	// Now the server matches: a new plan changes nothing.
	plan, err = streams.NewPlan(ctx, env.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range plan.Steps {
		if st.Create || len(st.Changes) != 0 {
			t.Fatalf("plan after apply: %+v", plan.Steps)
		}
	}
}

// Changes that delete nothing are applied without force.
func TestPlanAppliesSafeChanges(t *testing.T) {
	env := natsservertest.Start(t)
	ctx := t.Context()
	operatorStream(t, env, 100, func(sc *jetstream.StreamConfig) {
		sc.MaxBytes, sc.MaxAge, sc.Duplicates, sc.Discard = 2_000_000, time.Hour, 10*time.Second, jetstream.DiscardOld
	})
	cfg := streams.DefaultConfig()
	cfg.MaxBytes, cfg.MaxAge, cfg.DuplicateWindow = 4_000_000, 2*time.Hour, 20*time.Second
	plan, err := streams.NewPlan(ctx, env.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Execute(ctx, env.JS, false); err != nil {
		t.Fatalf("safe plan refused: %v", err)
	}
	after := info(t, env.JS, streams.StreamFPM)
	if after.Config.MaxBytes != 4_000_000 || after.Config.MaxAge != 2*time.Hour || after.Config.Duplicates != 20*time.Second || after.State.Msgs != 100 {
		t.Fatalf("after safe plan: %+v, %d messages", after.Config, after.State.Msgs)
	}
}

// FPM_EVENTS is bounded in bytes as well as age: a flood of dead letters (each up to max_payload of raw
// input) can not fill the disk; the oldest events go first.
func TestEventsStreamIsBoundedInBytes(t *testing.T) {
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events := func() jetstream.StreamInfo {
		s, err := env.JS.Stream(ctx, streams.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return *info
	}
	if got := events().Config; got.MaxBytes != streams.DefaultEventsMaxBytes || got.MaxAge != streams.DefaultConfig().EventsMaxAge {
		t.Fatalf("default FPM_EVENTS limits: max bytes %d, max age %v", got.MaxBytes, got.MaxAge)
	}
	cfg := streams.DefaultConfig()
	cfg.EventsMaxBytes = 8 << 10
	if err := streams.Apply(ctx, env.JS, cfg); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1<<10)
	for i := range 20 {
		if _, err := env.JS.Publish(ctx, streams.DeadLetterSubject("ns", "comp", i), body); err != nil {
			t.Fatal(err)
		}
	}
	st := events().State
	if st.Bytes > 8<<10 || st.Msgs == 0 || st.FirstSeq == 1 || st.LastSeq != 20 {
		t.Fatalf("FPM_EVENTS holds %d bytes in %d messages (seq %d..%d), want at most 8 KiB of the newest",
			st.Bytes, st.Msgs, st.FirstSeq, st.LastSeq)
	}
	for _, bad := range []int64{0, -2} {
		cfg.EventsMaxBytes = bad
		if err := cfg.Validate(); err == nil {
			t.Fatalf("events max bytes %d accepted", bad)
		}
	}
}
