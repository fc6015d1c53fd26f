package trace

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// testFPM is one message as the bridge publishes it.
type testFPM struct {
	key        streams.Key
	counter    int64
	receivedMs int64  // Fpm-Received-At-Ms; 0 = header missing
	producer   string // Fpm-Producer; "" = header missing
	heartbeat  bool
}

// body returns the canonical JSON body, made by the schemas codec from a msgpack payload.
func (f testFPM) body(t testing.TB) []byte {
	return natsservertest.FPMBody(t, f.key, f.counter, f.heartbeat)
}

func (f testFPM) msg(t testing.TB) *nats.Msg {
	return natsservertest.FPMMsg(t, f.key, f.counter, f.receivedMs, f.producer, f.heartbeat)
}

// publish publishes msgs to the FPM stream (asynchronously, then waits for every ack).
func publish(t testing.TB, js jetstream.JetStream, msgs []*nats.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, m := range msgs {
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if i%1000 == 999 || i == len(msgs)-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publish: timeout")
			}
		}
	}
}

// manyFPMs returns n messages round-robin over keys, counters 0.., received one ms apart.
func manyFPMs(t testing.TB, keys []streams.Key, n int, startMs int64) ([]*nats.Msg, []testFPM) {
	t.Helper()
	var msgs []*nats.Msg
	var fs []testFPM
	for i := range n {
		k := keys[i%len(keys)]
		f := testFPM{key: k, counter: int64(i / len(keys)), receivedMs: startMs + int64(i), heartbeat: i%10 == 9}
		fs = append(fs, f)
		msgs = append(msgs, f.msg(t))
	}
	return msgs, fs
}

func testKeys(n int) []streams.Key {
	var ks []streams.Key
	for i := range n {
		ks = append(ks, streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w" + strconv.Itoa(i/2), DPRank: i % 2})
	}
	return ks
}

// testConfig is a full-mode config writing under a temp dir, with fast flushes and failovers.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Mode = schemas.CaptureFull
	cfg.OutputPath = filepath.Join(t.TempDir(), "dynamo-fpm.jsonl.gz")
	cfg.FlushInterval = 50 * time.Millisecond
	cfg.StopTimeout = 5 * time.Second
	cfg.PinnedTTL = durable.MinPinnedTTL
	return cfg
}

// testLogger logs into the test's output (shown on failure or with -v).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// running is a Consumer running in a goroutine.
type running struct {
	w      *Consumer
	cancel context.CancelFunc
	done   chan error
}

// startWriter runs a writer with cfg. Its member id is derived from the group: a writer started again
// in the same test is the same instance restarted (and takes its partition back at once); two
// writers of one group never run at once through it.
func startWriter(t testing.TB, cfg Config, js jetstream.JetStream, opts ...durable.Option) *running {
	t.Helper()
	w, err := New(logTo(cfg, testLogger(t)), js, append([]durable.Option{durable.WithMemberID("test-" + cfg.Group)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return runConsumer(t, w)
}

// runConsumer runs an already built Consumer until the test ends (or stop).
func runConsumer(t testing.TB, w *Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	select {
	case <-w.Ready():
	case err := <-r.done:
		cancel()
		t.Fatalf("writer did not start: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("writer not ready after 10s")
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// stop cancels Run and returns its result (once; later calls return nil).
func (r *running) stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("writer did not stop within 30s")
	}
}

// waitConsumed waits until the group's consumer (one partition: <group> on FPM) has acked everything on
// the stream.
func waitConsumed(t testing.TB, js jetstream.JetStream, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := js.PushConsumer(ctx, streams.StreamFPM, durable)
		var ci *jetstream.ConsumerInfo
		var last uint64
		if err == nil {
			ci, err = c.Info(ctx)
		}
		if err == nil {
			last, err = natsservertest.LastStoredFor(ctx, js, streams.StreamFPM, ci.Config)
		}
		cancel()
		// The server counts a message just stored as pending a moment after its publish is acked, so
		// "nothing pending" alone can be read before the last publish reaches the consumer: the ack
		// floor must also have reached the last stored message the consumer's filters take.
		if err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream > 0 && ci.AckFloor.Stream >= ci.Delivered.Stream && ci.AckFloor.Stream >= last {
			return ci
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s not done: %+v, %v", durable, ci, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHanded waits until the writer's runner has taken n messages from its partitions
// (fpmbus_consumer_delivered_total in reg, the writer's Registerer): a graceful stop from then on
// writes and acks every one of them. The server's delivered count is not enough: a message it
// delivered may still be on its way to the runner, and a stop drops it for the next owner.
func waitHanded(t testing.TB, reg *prometheus.Registry, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got float64
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "fpmbus_consumer_delivered_total" {
				for _, m := range mf.GetMetric() {
					got += m.GetCounter().GetValue()
				}
			}
		}
		if got >= float64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer was handed %v of %d messages within 30s", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outputLines reads every segment of every producer under outputPath: producer -> lines in segment
// order.
func outputLines(t testing.TB, outputPath string) map[string][][]byte {
	t.Helper()
	producers, err := tracefile.Producers(outputPath)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][][]byte{}
	for _, p := range producers {
		segs, err := tracefile.ListSegments(tracefile.OutputBase(outputPath) + "." + p)
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(segs, func(i, j int) bool { return segs[i].Index < segs[j].Index })
		for _, s := range segs {
			if err := tracefile.ReadSegment(s.Path, func(l []byte) error {
				out[p] = append(out[p], append([]byte(nil), l...))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// deadLetters returns the trace writer's dead letters, in the order they were stored.
func deadLetters(t testing.TB, js jetstream.JetStream) []jetstream.Msg {
	t.Helper()
	return natsservertest.Messages(t, js, streams.StreamEvents, durable.RejectedSubject(ConsumerName))
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// member returns one gzip member holding s.
func member(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// logTo is cfg with its logs (the writer's and its runner's) going to l.
func logTo(cfg Config, l *slog.Logger) Config {
	cfg.Logger = l
	return cfg
}

// retrying is cfg retrying a failed write from initial to at most maxWait.
func retrying(cfg Config, initial, maxWait time.Duration) Config {
	cfg.RetryInitial, cfg.RetryMax = initial, maxWait
	return cfg
}
