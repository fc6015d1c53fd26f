package trace

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// BenchmarkFullModeVsAckOnly consumes the same pre-published FPMs (16 ranks of 8 workers) with
// (a) a loop that only acks every message and (b) the full-mode trace writer, each on its own durable
// consumer, until everything is acked. It reports both rates, their ratio (target >= 0.8) and the
// compressed bytes per record.
func BenchmarkFullModeVsAckOnly(b *testing.B) {
	n := benchRecords()
	env := streamstest.Start(b)
	msgs, _ := manyFPMs(b, testKeys(16), n, 1_782_777_600_000)
	publish(b, env.JS, msgs)
	b.ResetTimer()
	for i := range b.N {
		ackOnly := benchAckOnly(b, env.JS, fmt.Sprint("ackonly-", i), n)

		cfg := DefaultConfig()
		cfg.Mode = "full"
		cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
		cfg.Durable = fmt.Sprint("trace-", i)
		opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
		if l, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_LEVEL")); err == nil {
			opts = append(opts, WithCompressionLevel(l))
		}
		w, err := New(cfg, env.JS, opts...)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		t0 := time.Now()
		go func() { done <- w.Run(ctx) }()
		// Once every message is delivered, stop: the graceful stop writes, fsyncs and acks what is
		// left at once instead of at the next flush tick, so the time is consume + write + ack only.
		waitDelivered(b, env.JS, cfg.Durable, uint64(n))
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		full := time.Since(t0)
		waitAckFloor(b, env.JS, cfg.Durable, uint64(n))

		var gz int64
		files, _ := filepath.Glob(cfg.OutputPath + ".*.jsonl.gz")
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				b.Fatal(err)
			}
			gz += fi.Size()
		}
		ackRate := float64(n) / ackOnly.Seconds()
		fullRate := float64(n) / full.Seconds()
		b.ReportMetric(ackRate, "ackonly-rec/s")
		b.ReportMetric(fullRate, "full-rec/s")
		b.ReportMetric(fullRate/ackRate, "ratio")
		b.ReportMetric(float64(gz)/float64(n), "gz-B/rec")
	}
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
			w.fl = startFlusher()
			var in int64
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m := fakes[i%len(fakes)]
				in += int64(len(m.data))
				r, err := parseRecord(m, "")
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
