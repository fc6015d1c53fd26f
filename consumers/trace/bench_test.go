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

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// benchRecords is how many FPMs BenchmarkFullModeVsAckOnly pre-publishes (FPMBUS_BENCH_RECORDS
// overrides it).
func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// benchRounds is how many times BenchmarkFullModeVsAckOnly measures each side (FPMBUS_BENCH_ROUNDS).
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// BenchmarkFullModeVsAckOnly consumes the same pre-published FPMs (16 ranks of 8 workers) with
// (a) a loop that only acks every message and (b) the full-mode trace writer, each on its own durable
// consumer, until everything is acked. The two alternate for benchRounds rounds (a b, b a, a b, …), so
// that load from elsewhere on the machine hits both alike; it reports the median rate of each, the
// ratio of the medians (target >= 0.8), the lowest per-round ratio, and the compressed bytes per record.
func BenchmarkFullModeVsAckOnly(b *testing.B) {
	n := benchRecords()
	env := streamstest.Start(b)
	msgs, _ := manyFPMs(b, testKeys(16), n, 1_782_777_600_000)
	publish(b, env.JS, msgs)
	b.ResetTimer()
	for i := range b.N {
		var ackRates, fullRates []float64
		minRatio := math.Inf(1)
		var gzPerRec float64
		for round := range benchRounds() {
			var ack, full float64
			runAck := func() {
				ack = float64(n) / benchAckOnly(b, env.JS, fmt.Sprint("ackonly-", i, "-", round), n).Seconds()
			}
			runFull := func() {
				d, gz := benchFull(b, env.JS, fmt.Sprint("trace-", i, "-", round), n)
				full, gzPerRec = float64(n)/d.Seconds(), float64(gz)/float64(n)
			}
			if round%2 == 0 {
				runAck()
				runFull()
			} else {
				runFull()
				runAck()
			}
			ackRates, fullRates = append(ackRates, ack), append(fullRates, full)
			minRatio = min(minRatio, full/ack)
		}
		ackRate, fullRate := median(ackRates), median(fullRates)
		b.ReportMetric(ackRate, "ackonly-rec/s")
		b.ReportMetric(fullRate, "full-rec/s")
		b.ReportMetric(fullRate/ackRate, "ratio")
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

// benchFull runs the full-mode writer on its own durable until all n messages are acked and returns
// how long that took and the compressed bytes written.
func benchFull(b *testing.B, js jetstream.JetStream, durable string, n int) (time.Duration, int64) {
	cfg := DefaultConfig()
	cfg.Mode = "full"
	cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
	cfg.Durable = durable
	opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
	if l, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_LEVEL")); err == nil {
		opts = append(opts, WithCompressionLevel(l))
	}
	w, err := New(cfg, js, opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- w.Run(ctx) }()
	// Once every message is delivered, stop: the graceful stop writes, fsyncs and acks what is left at
	// once instead of at the next flush tick, so the time is consume + write + ack only.
	waitDelivered(b, js, cfg.Durable, uint64(n))
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	waitAckFloor(b, js, cfg.Durable, uint64(n))
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

// benchAckOnly acks n messages as fast as it can and returns how long it took.
func benchAckOnly(b *testing.B, js jetstream.JetStream, durable string, n int) time.Duration {
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Mode, cfg.Durable = "full", durable
	t0 := time.Now()
	cons, err := js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, cfg.ConsumerConfig())
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(cfg.pullBatch()))
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	waitAckFloor(b, js, durable, uint64(n))
	d := time.Since(t0)
	it.Stop()
	return d
}

// waitDelivered polls until the consumer has delivered everything up to seq.
func waitDelivered(b *testing.B, js jetstream.JetStream, durable string, seq uint64) {
	for {
		c, err := js.Consumer(context.Background(), streams.StreamFPM, durable)
		if err == nil {
			ci, err := c.Info(context.Background())
			if err == nil && ci.Delivered.Stream >= seq {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
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

// fakeMsg is enough of a jetstream.Msg for the writer's own per-message work.
type fakeMsg struct {
	jetstream.Msg
	subject string
	data    []byte
	hdr     nats.Header
}

func (m *fakeMsg) Subject() string      { return m.subject }
func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Headers() nats.Header { return m.hdr }
func (m *fakeMsg) Ack() error           { return nil }

// Metadata: a message without JetStream metadata (never deduplicated, like a core NATS message).
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, jetstream.ErrNotJSMessage }

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
			w, err := New(cfg, fakeJS{}, WithLogger(slog.New(slog.DiscardHandler)), WithCompressionLevel(level))
			if err != nil {
				b.Fatal(err)
			}
			w.start = time.Now()
			w.fl = startFlusher(nil, nil)
			var in int64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m := fakes[i%len(fakes)]
				in += int64(len(m.data))
				r, err := parseRecord(m, "", nil)
				if err := w.handle(fetched{rec: r, err: err}); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.flush(); err != nil {
				b.Fatal(err)
			}
			if err := w.awaitFlush(); err != nil {
				b.Fatal(err)
			}
			w.fl.stop()
			if err := w.closeAll(); err != nil {
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

// fakeJS satisfies New; BenchmarkWriterPerRecord never reaches the server.
type fakeJS struct{ jetstream.JetStream }

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
		w, err := New(cfg, fakeJS{}, WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			b.Fatal(err)
		}
		w.start = time.Now()
		w.fl = startFlusher(nil, nil)
		b.StartTimer()
		for _, m := range msgs {
			r, err := parseRecord(m, "", nil)
			if err := w.handle(fetched{rec: r, err: err}); err != nil {
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
		w.fl.stop()
		if err := w.closeAll(); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(msgs)
	}
}
