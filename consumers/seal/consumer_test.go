package seal

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// runningSealer is a sealer consumer under test.
type runningSealer struct {
	c      *Consumer
	cancel context.CancelFunc
	errc   chan error
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("FPMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startSealer(t *testing.T, env *natsservertest.Env, cfg Config, opts ...durable.Option) *runningSealer {
	t.Helper()
	if cfg.PinnedTTL == 0 {
		cfg.PinnedTTL = durable.MinPinnedTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	c, err := New(cfg, env.JS, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningSealer{c: c, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop(t) })
	select {
	case <-c.Ready():
	case err := <-r.errc:
		t.Fatalf("sealer ended before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("sealer not ready")
	}
	return r
}

// stop stops the sealer gracefully and returns Run's error (idempotent).
func (r *runningSealer) stop(t *testing.T) error {
	r.cancel()
	select {
	case err := <-r.errc:
		r.errc <- nil
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("sealer did not stop")
		return nil
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sealerConsumer(t *testing.T, env *natsservertest.Env) jetstream.PushConsumer {
	t.Helper()
	c, err := env.JS.PushConsumer(context.Background(), streams.StreamBench, DefaultDurable)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func consumerInfo(t *testing.T, c jetstream.PushConsumer) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ci
}

// publishMergedBody publishes doc on run's merged subject with the headers the merger sets.
func publishMergedBody(t *testing.T, js jetstream.JetStream, run string, doc []byte) *jetstream.PubAck {
	t.Helper()
	msg := nats.NewMsg(streams.BenchMergedSubject(run))
	msg.Data = doc
	msg.Header.Set(streams.HeaderBenchKind, streams.BenchKindMerged)
	msg.Header.Set(streams.HeaderBenchRun, run)
	msg.Header.Set(streams.HeaderBenchSHA256, schemas.SHA256Hex(doc))
	msg.Header.Set(streams.HeaderBenchSize, strconv.Itoa(len(doc)))
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func goldenRun(t *testing.T) (doc []byte, runID string) {
	t.Helper()
	doc, err := os.ReadFile(goldenMerged)
	if err != nil {
		t.Fatal(err)
	}
	var hdr struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(doc, &hdr); err != nil {
		t.Fatal(err)
	}
	return doc, hdr.RunID
}

// A merged artefact that can never be sealed is dead-lettered at once, naming the consumer, subject,
// stream sequence and reason, and is never delivered again (it used to come back every 5 s forever).
func TestConsumerRejectsUnsealableArtefacts(t *testing.T) {
	t.Parallel()
	legacy, err := os.ReadFile("../merge/testdata/golden/legacy_2rank/merged.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	rank := []byte(`{"schema_version":2,"artifact_type":"rank","run_id":"run4"}`)
	for name, tc := range map[string]struct {
		publish func(js jetstream.JetStream) (*jetstream.PubAck, []byte)
		profile bool
	}{
		"nats pub fpmbench.merged.run4 garbage": {publish: func(js jetstream.JetStream) (*jetstream.PubAck, []byte) {
			ack, err := js.Publish(context.Background(), streams.BenchMergedSubject("run4"), []byte("garbage"))
			if err != nil {
				t.Fatal(err)
			}
			return ack, []byte("garbage")
		}},
		"a rank artefact on the merged subject": {publish: func(js jetstream.JetStream) (*jetstream.PubAck, []byte) {
			return publishMergedBody(t, js, "run4", rank), rank
		}},
		"body that does not match its digest": {publish: func(js jetstream.JetStream) (*jetstream.PubAck, []byte) {
			msg := nats.NewMsg(streams.BenchMergedSubject("run4"))
			msg.Data = legacy
			msg.Header.Set(streams.HeaderBenchSHA256, schemas.SHA256Hex([]byte("other bytes")))
			msg.Header.Set(streams.HeaderBenchSize, strconv.Itoa(len(legacy)))
			ack, err := js.PublishMsg(context.Background(), msg)
			if err != nil {
				t.Fatal(err)
			}
			return ack, legacy
		}},
		"merged artefact without an engine block": {profile: true, publish: func(js jetstream.JetStream) (*jetstream.PubAck, []byte) {
			return publishMergedBody(t, js, "run4", legacy), legacy
		}},
	} {
		t.Run(name, func(t *testing.T) {
			env, kv := singleNode(t)
			if tc.profile {
				profile, _ := json.Marshal(testProfile)
				if _, err := benchstore.PublishProfile(context.Background(), env.JS, "run4", profile); err != nil {
					t.Fatal(err)
				}
			}
			outcomes := make(chan error, 4)
			startSealer(t, env, Config{OutcomeHook: func(_ string, _ *report, err error) { outcomes <- err }})
			ack, body := tc.publish(env.JS)
			select {
			case err := <-outcomes:
				if !errors.Is(err, errNotSealable) {
					t.Fatalf("outcome %v, want ErrNotSealable", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no outcome")
			}
			cons := sealerConsumer(t, env)
			waitFor(t, "the message settled", 10*time.Second, func() bool {
				ci := consumerInfo(t, cons)
				return ci.AckFloor.Stream >= ack.Sequence && ci.NumAckPending == 0
			})
			time.Sleep(1500 * time.Millisecond) // a redelivery would come now: none may
			select {
			case err := <-outcomes:
				t.Fatalf("a second outcome: %v", err)
			default:
			}
			if ci := consumerInfo(t, cons); ci.Delivered.Consumer != 1 || ci.NumRedelivered != 0 {
				t.Fatalf("delivered %d times (%d redelivered), want once", ci.Delivered.Consumer, ci.NumRedelivered)
			}
			dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(ConsumerName))
			if len(dl) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dl))
			}
			h := dl[0].Headers()
			if string(dl[0].Data()) != string(body) || h.Get(streams.HeaderConsumer) != ConsumerName ||
				h.Get(streams.HeaderSubject) != streams.BenchMergedSubject("run4") || h.Get(streams.HeaderStream) != streams.StreamBench ||
				h.Get(streams.HeaderStreamSeq) != strconv.FormatUint(ack.Sequence, 10) || h.Get(streams.HeaderError) == "" {
				t.Fatalf("dead letter headers %v", h)
			}
			if ks := keys(t, kv); len(ks) != 0 {
				t.Fatalf("an unsealable artefact wrote %v", ks)
			}
		})
	}
}

// A merged artefact whose profile has not arrived is held, not handed back: it stays unacked, is not
// redelivered, and is sealed on a tick once the profile is there.
func TestConsumerHoldsArtefactUntilProfileArrives(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	doc, runID := goldenRun(t)
	type res struct {
		rep *report
		err error
	}
	outcomes := make(chan res, 4)
	g := Config{HoldingConfig: durable.HoldingConfig{AckWait: 2 * time.Second}}
	reg := prometheus.NewRegistry()
	g.OutcomeHook, g.Registerer = func(_ string, rep *report, err error) { outcomes <- res{rep, err} }, reg
	startSealer(t, env, g)
	ack := publishMergedBody(t, env.JS, runID, doc)
	cons := sealerConsumer(t, env)
	waitFor(t, "the artefact delivered", 10*time.Second, func() bool { return consumerInfo(t, cons).Delivered.Consumer == 1 })
	time.Sleep(3 * g.AckWait / 2) // longer than the ack wait: the runner keeps it alive
	if ci := consumerInfo(t, cons); ci.NumAckPending != 1 || ci.NumRedelivered != 0 || ci.Delivered.Consumer != 1 {
		t.Fatalf("while waiting for the profile: %d unacked (want 1), %d redelivered, %d deliveries", ci.NumAckPending, ci.NumRedelivered, ci.Delivered.Consumer)
	}
	if ks := keys(t, kv); len(ks) != 0 {
		t.Fatalf("sealed without a profile: %v", ks)
	}
	profile, _ := json.Marshal(testProfile)
	if _, err := benchstore.PublishProfile(context.Background(), env.JS, runID, profile); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-outcomes:
		if r.err != nil || len(r.rep.Cells) != 1 || r.rep.Cells[0].State != sealed.String() {
			t.Fatalf("outcome %+v %v", r.rep, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not sealed after the profile arrived")
	}
	waitFor(t, "the artefact acked", 5*time.Second, func() bool {
		ci := consumerInfo(t, cons)
		return ci.AckFloor.Stream == ack.Sequence && ci.NumAckPending == 0
	})
	if dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(ConsumerName)); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
	if runs, cells := gatheredBy(t, reg, "fpmbus_seal_runs_total"), gatheredBy(t, reg, "fpmbus_seal_cells_total"); runs[outcomeSealed] != 1 || runs[outcomeRejected] != 0 ||
		cells[sealed.String()] != 1 || len(runs) != 3 || len(cells) != 5 {
		t.Fatalf("fpmbus_seal_runs_total %v, fpmbus_seal_cells_total %v: want one run and one cell sealed", runs, cells)
	}
}

// gatheredBy reads the counter family name from reg by its one label's value.
func gatheredBy(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// An unknown seal outcome (the bucket gone) holds the artefact and retries it on a tick; once the
// bucket is back it is sealed once.
func TestConsumerRetriesUnknownOutcome(t *testing.T) {
	t.Parallel()
	env, kv := singleNode(t)
	ctx := context.Background()
	doc, runID := goldenRun(t)
	profile, _ := json.Marshal(testProfile)
	if _, err := benchstore.PublishProfile(ctx, env.JS, runID, profile); err != nil {
		t.Fatal(err)
	}
	if err := env.JS.DeleteKeyValue(ctx, streams.BucketDatasets); err != nil {
		t.Fatal(err)
	}
	s, err := NewSealer(kv, WithSource("fpmbus seal"), withRetries(1, 10*time.Millisecond), withOpTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		rep *report
		err error
	}
	outcomes := make(chan res, 4)
	startSealer(t, env, Config{Sealer: s, OutcomeHook: func(_ string, rep *report, err error) { outcomes <- res{rep, err} }})
	publishMergedBody(t, env.JS, runID, doc)
	cons := sealerConsumer(t, env)
	waitFor(t, "the artefact delivered", 10*time.Second, func() bool { return consumerInfo(t, cons).Delivered.Consumer == 1 })
	time.Sleep(500 * time.Millisecond)
	select {
	case r := <-outcomes:
		t.Fatalf("an outcome without a bucket: %+v %v", r.rep, r.err)
	default:
	}
	if ci := consumerInfo(t, cons); ci.NumAckPending != 1 {
		t.Fatalf("%d unacked while the outcome is unknown, want 1", ci.NumAckPending)
	}
	if _, err := OpenBucket(ctx, env.JS, streams.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-outcomes:
		if r.err != nil || len(r.rep.Cells) != 1 || r.rep.Cells[0].State != sealed.String() {
			t.Fatalf("outcome %+v %v", r.rep, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not sealed once the bucket was back")
	}
	waitFor(t, "the artefact acked", 5*time.Second, func() bool { return consumerInfo(t, cons).NumAckPending == 0 })
	h, err := kv.History(ctx, r0(t, kv))
	if err != nil || len(h) != 1 {
		t.Fatalf("cell history %d (%v), want 1", len(h), err)
	}
}

// r0 is the one cell key of the bucket.
func r0(t *testing.T, kv jetstream.KeyValue) string {
	t.Helper()
	for _, k := range keys(t, kv) {
		if len(k) > 5 && k[:5] == "cell." {
			return k
		}
	}
	t.Fatal("no cell sealed")
	return ""
}

func TestConsumerConfigValidate(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	for name, cfg := range map[string]Config{
		"partitions":   {HoldingConfig: durable.HoldingConfig{Partitions: -1}},
		"ack wait":     {HoldingConfig: durable.HoldingConfig{AckWait: time.Millisecond}},
		"profile wait": {ProfileWait: -time.Second},
		"pinned ttl":   {HoldingConfig: durable.HoldingConfig{PinnedTTL: time.Millisecond}},
		"group name":   {HoldingConfig: durable.HoldingConfig{Durable: "a.b"}},
	} {
		if _, err := New(cfg, env.JS); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := New(Config{}, env.JS, durable.WithClock(nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil clock: %v", err)
	}
}
