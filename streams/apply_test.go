package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestApplyIsIdempotentAndDefinesStreams(t *testing.T) {
	env := streamstest.Start(t) // applies once
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
	env := streamstest.Start(t)
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
	env2 := streamstest.StartAt(t, listen, store)
	msgs := streamstest.Messages(t, env2.JS, streams.StreamFPM, "fpm.*.*.*.1")
	if len(msgs) != 1 || msgs[0].Subject() != "fpm.dynamo.backend.w1.1" {
		t.Fatalf("after restart got %d messages", len(msgs))
	}
}

// FPM_EVENTS is bounded in bytes as well as age: a flood of dead letters (each up to max_payload of raw
// input) can not fill the disk; the oldest events go first.
func TestEventsStreamIsBoundedInBytes(t *testing.T) {
	env := streamstest.Start(t)
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
