package trace

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// benchRecords is how many FPMs BenchmarkTraceWriterVsBareConsumer pre-publishes
// (FPMBUS_BENCH_RECORDS overrides it).
func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// benchRounds is how many times BenchmarkTraceWriterVsBareConsumer measures each side
// (FPMBUS_BENCH_ROUNDS).
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// BenchmarkTraceWriterVsBareConsumer consumes the same pre-published FPMs (16 ranks of 8 workers),
// each side on a consumer of its own, until everything is acknowledged:
//
//   - bare: the cheapest consumer of the stream: a pull consumer with the AckAll policy (the writer's
//     consumer settings, without the partition group) that fetches and acknowledges cumulatively,
//     every 1000 messages and the last, and does nothing else;
//   - runner: a durable.Runner (one partition, cumulative acks) whose Consumer says every message done
//     at once: the runner's own cost;
//   - full: the trace writer in full mode (Consumer, defaults): parse, line, gzip, write, fsync, done.
//
// The sides rotate through the rounds (benchRounds), so that load from elsewhere on the machine hits
// them alike. It reports each side's median rate, the ratios of the medians to bare (goal for full:
// >= 0.8), the lowest per-round ratio of full, and the compressed bytes per record.
func BenchmarkTraceWriterVsBareConsumer(b *testing.B) {
	n := benchRecords()
	env := streamstest.Start(b)
	msgs, _ := manyFPMs(b, testKeys(16), n, 1_782_777_600_000)
	publish(b, env.JS, msgs)
	b.ResetTimer()
	for i := range b.N {
		var bareRates, runnerRates, fullRates []float64
		minRatio := math.Inf(1)
		var gzPerRec float64
		for round := range benchRounds() {
			var bare, runner, full float64
			sides := []func(){
				func() { bare = float64(n) / benchBare(b, env.JS, fmt.Sprint("bare-", i, "-", round), n).Seconds() },
				func() {
					runner = float64(n) / benchRunner(b, env.JS, fmt.Sprint("runner-", i, "-", round), n).Seconds()
				},
				func() {
					d, gz := benchFull(b, env.JS, fmt.Sprint("trace-", i, "-", round), n)
					full, gzPerRec = float64(n)/d.Seconds(), float64(gz)/float64(n)
				},
			}
			for k := range sides {
				sides[(k+round)%len(sides)]()
			}
			bareRates, runnerRates, fullRates = append(bareRates, bare), append(runnerRates, runner), append(fullRates, full)
			minRatio = min(minRatio, full/bare)
		}
		bare, runner, full := median(bareRates), median(runnerRates), median(fullRates)
		b.ReportMetric(bare, "bare-rec/s")
		b.ReportMetric(runner, "runner-rec/s")
		b.ReportMetric(full, "full-rec/s")
		b.ReportMetric(runner/bare, "runner-ratio")
		b.ReportMetric(full/bare, "ratio")
		b.ReportMetric(minRatio, "min-ratio")
		b.ReportMetric(gzPerRec, "gz-B/rec")
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchConfig is the writer's config for a benchmark side: defaults, full mode, group name.
func benchConfig(b *testing.B, name string) Config {
	cfg := DefaultConfig()
	cfg.Mode = schemas.CaptureFull
	cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
	cfg.Group = name
	return cfg
}

// benchFull runs the full-mode writer on its own group until all n messages are acknowledged and
// returns how long that took and the compressed bytes written. Once every message is delivered it
// stops: the graceful stop writes, fsyncs and acknowledges what is left at once instead of at the next
// flush tick, so the time is consume + write + acknowledge only.
func benchFull(b *testing.B, js jetstream.JetStream, name string, n int) (time.Duration, int64) {
	cfg := benchConfig(b, name)
	opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
	if l, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_LEVEL")); err == nil {
		opts = append(opts, WithCompressionLevel(l))
	}
	w, err := New(cfg, js, opts...)
	if err != nil {
		b.Fatal(err)
	}
	d := benchRun(b, js, name, n, w.Run)
	var gz int64
	files, _ := filepath.Glob(cfg.OutputPath + ".*.jsonl.gz")
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			b.Fatal(err)
		}
		gz += fi.Size()
	}
	return d, gz
}

// noopConsumer says every message done as soon as it is handed: what is left is the runner's cost.
type noopConsumer struct{}

func (noopConsumer) Handle(_ context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		m.Done()
	}
	return nil
}
func (noopConsumer) Tick(context.Context, time.Time) error { return nil }
func (noopConsumer) Close(context.Context) error           { return nil }

// benchRunner runs a durable.Runner with noopConsumer on a group with the writer's consumer settings
// until all n messages are acknowledged.
func benchRunner(b *testing.B, js jetstream.JetStream, name string, n int) time.Duration {
	cfg := benchConfig(b, name)
	pc, err := cfg.PartitionConfig()
	if err != nil {
		b.Fatal(err)
	}
	r, err := durable.New(durable.Config{Name: "bench", Group: pc}, js, noopConsumer{}, durable.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	return benchRun(b, js, name, n, r.Run)
}

// benchRun runs run until the consumer name on FPM has delivered all n messages, stops it and returns
// how long it ran; the consumer must then have acknowledged all of them.
func benchRun(b *testing.B, js jetstream.JetStream, name string, n int, run func(context.Context) error) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- run(ctx) }()
	waitDelivered(b, js, name, uint64(n), done)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	waitAckFloor(b, js, name, uint64(n))
	return d
}

// benchBare consumes n messages with the cheapest consumer (see BenchmarkTraceWriterVsBareConsumer)
// and returns how long it took until all were acknowledged.
func benchBare(b *testing.B, js jetstream.JetStream, name string, n int) time.Duration {
	ctx := context.Background()
	cfg := benchConfig(b, name)
	t0 := time.Now()
	cons, err := js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, jetstream.ConsumerConfig{
		Durable: name, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckAllPolicy,
		AckWait: cfg.ackWait(), MaxDeliver: -1, MaxAckPending: cfg.MaxAckPending, FilterSubject: cfg.FilterSubject,
	})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(cfg.pullBatch()))
	if err != nil {
		b.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if i%1000 == 0 || i == n {
			if err := m.Ack(); err != nil {
				b.Fatal(err)
			}
		}
	}
	waitAckFloor(b, js, name, uint64(n))
	d := time.Since(t0)
	it.Stop()
	return d
}

// waitDelivered polls until the consumer has delivered everything up to seq (or run ended).
func waitDelivered(b *testing.B, js jetstream.JetStream, durable string, seq uint64, done <-chan error) {
	for {
		c, err := js.Consumer(context.Background(), streams.StreamFPM, durable)
		if err == nil {
			ci, err := c.Info(context.Background())
			if err == nil && ci.Delivered.Stream >= seq {
				return
			}
		}
		select {
		case err := <-done:
			b.Fatalf("%s ended before delivering everything: %v", durable, err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// waitAckFloor polls until the consumer's ack floor reaches seq.
func waitAckFloor(b *testing.B, js jetstream.JetStream, durable string, seq uint64) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		c, err := js.Consumer(context.Background(), streams.StreamFPM, durable)
		if err == nil {
			ci, err := c.Info(context.Background())
			if err == nil && ci.AckFloor.Stream >= seq {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("consumer %s: ack floor below %d after 5 minutes", durable, seq)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fakeMsg is a delivery without a server: nothing to settle.
type fakeMsg struct {
	subject string
	data    []byte
	hdr     nats.Header
}

func (m *fakeMsg) Subject() string      { return m.subject }
func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Headers() nats.Header { return m.hdr }
func (m *fakeMsg) Done()                {}
func (m *fakeMsg) Reject(error)         {}

// benchWriter is a full- or sampled-mode writer without a server, for the CPU benchmarks.
func benchWriter(b *testing.B, cfg Config, opts ...Option) *writer {
	set, err := newSettings(append([]Option{WithLogger(slog.New(slog.DiscardHandler))}, opts...))
	if err != nil {
		b.Fatal(err)
	}
	m, err := newMetrics(nil, cfg.Mode)
	if err != nil {
		b.Fatal(err)
	}
	return newWriter(cfg, set, set.logger, m, time.Now(), nil)
}

// BenchmarkWriterPerRecord measures the writer's own CPU per record, without NATS: parse and check the
// message, build the line, buffer it, and (every BufferSize) compress, write and fsync a member, at
// each gzip level.
func BenchmarkWriterPerRecord(b *testing.B) {
	msgs, _ := manyFPMs(b, testKeys(16), 4096, 1_782_777_600_000)
	fakes := make([]*fakeMsg, len(msgs))
	for i, m := range msgs {
		fakes[i] = &fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}
	}
	for _, level := range []int{1, 2, 3, 5, 6} {
		b.Run(fmt.Sprint("level-", level), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Mode = "full"
			cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
			w := benchWriter(b, cfg, WithCompressionLevel(level))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m := fakes[i%len(fakes)]
				r, err := parseRecord(m, msgMeta{}, "")
				if err != nil {
					b.Fatal(err)
				}
				if err := w.handle(&r); err != nil {
					b.Fatal(err)
				}
				if err := w.collect(); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.finish(nil); err != nil {
				b.Fatal(err)
			}
			var gz int64
			files, _ := filepath.Glob(cfg.OutputPath + ".*.jsonl.gz")
			for _, f := range files {
				fi, _ := os.Stat(f)
				gz += fi.Size()
			}
			b.ReportMetric(float64(gz)/float64(b.N), "gz-B/rec")
		})
	}
}

// BenchmarkCheckFPM compares the writer's check of a canonical body (fast path) with the full parse.
func BenchmarkCheckFPM(b *testing.B) {
	body := testFPM{key: streams.Key{WorkerID: "worker-4192", DPRank: 3}, counter: 123456}.body(b)
	b.Run("ParseFPMJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := schemas.ParseFPMJSON(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checkFPM", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := checkFPM(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSampledMemoryPerKey measures what sampled mode holds per key at 100,000 keys (100 producers
// × 1,000 ranks), each with one pending message: the writer's own bytes per key (sampler entry, held
// record, map, the producers' segment writers spread over the keys), and, apart, the bytes of the held
// messages themselves (body and headers, as the client keeps them), which the server would otherwise
// hold anyway.
func BenchmarkSampledMemoryPerKey(b *testing.B) {
	const producers, ranks = 100, 1000
	const keys = producers * ranks
	for range b.N {
		b.StopTimer()
		var m0, m1, m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		msgs := make([]*ackMsg, 0, keys)
		for i := range keys {
			f := testFPM{key: streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprint("worker-", i/ranks), DPRank: i % ranks},
				counter: int64(i), receivedMs: 1_782_777_600_000 + int64(i%1000)}
			m := f.msg(b)
			msgs = append(msgs, &ackMsg{fakeMsg: fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}, seq: uint64(i + 1)})
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		cfg := DefaultConfig()
		cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
		w := benchWriter(b, cfg)
		b.StartTimer()
		for _, m := range msgs {
			r, err := parseRecord(m, msgMeta{seq: m.seq}, "")
			if err != nil {
				b.Fatal(err)
			}
			if err := w.handle(&r); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&m2)
		if len(w.sampler.keys) != keys {
			b.Fatalf("%d keys", len(w.sampler.keys))
		}
		b.ReportMetric(float64(m2.HeapAlloc-m1.HeapAlloc)/keys, "writer-B/key")
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/keys, "msg-B/key")
		w.abort()
		runtime.KeepAlive(msgs)
	}
}
