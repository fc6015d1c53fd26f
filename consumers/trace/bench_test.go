package trace

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/durable/durabletest"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// BenchmarkTraceWriterVsBareConsumer consumes the same pre-published FPMs (16 ranks of 8 workers),
// each side on a consumer of its own, until everything is acknowledged:
//
//   - bare: the cheapest consumer of the stream: a pull consumer with the AckAll policy (the writer's
//     consumer settings, without the partition group) that fetches and acknowledges cumulatively,
//     every 1000 messages and the last, and does nothing else;
//   - push: the same acks on the group's own push consumer (flow control, idle heartbeats) pointed
//     at a subject of its own, the way a partition owner receives (consumers/partition): what
//     partition ownership's delivery costs;
//   - runner: a durable.Runner (the writer's group and runner settings) whose Consumer says every
//     message done at once: the runner's own cost on top of push;
//   - full: the trace writer in full mode (Consumer, defaults): parse, line, gzip, write, fsync, done.
//
// Each side's rate is its steady rate: how fast its ack floor went from 10% to 90% of the messages
// (polled every 5 ms), which leaves out what the sides do differently once (joining a group, the
// first pulls; the last flush, the graceful stop). Its CPU is the process's (server included) over the
// same window, per record: on a machine shared with other work the wall time follows their load, the
// CPU time much less. The sides rotate through the rounds (durabletest.Compare), so that load from elsewhere
// on the machine hits them alike. It reports each side's median rate and CPU per record, the ratios of
// the medians to bare (goal for full: >= 0.8) and of full to push and runner, the lowest per-round
// ratio of full to bare, and the compressed bytes per record. FPMBUS_BENCH_PROFILE=<dir> writes a CPU
// profile of each side and round (durabletest).
//
// FPMBUS_BENCH_TRACE=1 logs every round.
func BenchmarkTraceWriterVsBareConsumer(b *testing.B) {
	n := durabletest.Records(200_000)
	env := natsservertest.Start(b)
	msgs, _ := manyFPMs(b, testKeys(16), n, 1_782_777_600_000)
	publish(b, env.JS, msgs)
	b.ResetTimer()
	for i := range b.N {
		var gz int64
		side := func(name string, run func(name string) durabletest.Result) durabletest.Side {
			return durabletest.Side{Name: name, Run: func(round int) durabletest.Result { return run(fmt.Sprint(name, "-", i, "-", round)) }}
		}
		durabletest.Compare(b, "rec",
			side("bare", func(g string) durabletest.Result { return benchBare(b, env.JS, g, n, false) }),
			side("push", func(g string) durabletest.Result { return benchBare(b, env.JS, g, n, true) }),
			side("runner", func(g string) durabletest.Result { return benchRunner(b, env.JS, g, n) }),
			side("full", func(g string) durabletest.Result {
				var r durabletest.Result
				r, gz = benchFull(b, env.JS, g, n)
				return r
			}))
		b.ReportMetric(float64(gz)/float64(n), "gz-B/rec")
	}
}

// benchConfig is the writer's config for a benchmark side: defaults, full mode, group name.
func benchConfig(b *testing.B, name string) Config {
	cfg := DefaultConfig()
	cfg.Mode = schemas.CaptureFull
	cfg.OutputPath = filepath.Join(b.TempDir(), "dynamo-fpm")
	cfg.Group = name
	return cfg
}

// benchFull runs the full-mode writer on its own group and returns its steady rate and the
// compressed bytes it wrote.
func benchFull(b *testing.B, js jetstream.JetStream, name string, n int) (durabletest.Result, int64) {
	cfg := benchConfig(b, name)
	cfg.Logger = slog.New(slog.DiscardHandler)
	if l, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_LEVEL")); err == nil {
		cfg.CompressionLevel = l
	}
	w, err := New(cfg, js)
	if err != nil {
		b.Fatal(err)
	}
	rate := durabletest.Run(b, js, streams.StreamFPM, name, n, w.Run)
	var gz int64
	files, _ := filepath.Glob(cfg.OutputPath + ".*.jsonl.gz")
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			b.Fatal(err)
		}
		gz += fi.Size()
	}
	return rate, gz
}

// benchRunner runs a durable.Runner with DoneAtOnce on a group with the writer's consumer settings
// and returns its steady rate.
func benchRunner(b *testing.B, js jetstream.JetStream, name string, n int) durabletest.Result {
	cfg := benchConfig(b, name)
	pc, err := cfg.PartitionConfig()
	if err != nil {
		b.Fatal(err)
	}
	rc := cfg.runnerConfig(pc) // the writer's runner settings
	rc.Name = "bench"
	r, err := durable.New(rc, js, durabletest.DoneAtOnce{})
	if err != nil {
		b.Fatal(err)
	}
	return durabletest.Run(b, js, streams.StreamFPM, name, n, r.Run)
}

// benchBare consumes n messages with the cheapest consumer on the writer's consumer settings
// (durabletest.Bare), pulled or pushed.
func benchBare(b *testing.B, js jetstream.JetStream, name string, n int, pushed bool) durabletest.Result {
	pc, err := benchConfig(b, name).PartitionConfig()
	if err != nil {
		b.Fatal(err)
	}
	return durabletest.Bare(b, js, pc, n, pushed)
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
func benchWriter(b *testing.B, cfg Config) *writer {
	set, err := newSettings(nil)
	if err != nil {
		b.Fatal(err)
	}
	set = set.configured(logTo(cfg, slog.New(slog.DiscardHandler)))
	m, err := newMetrics(nil, cfg.Mode)
	if err != nil {
		b.Fatal(err)
	}
	return newWriter(cfg, set, set.Logger, m, time.Now(), nil)
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
			cfg.CompressionLevel = level
			w := benchWriter(b, cfg)
			keys := tracefile.SubjectKeys{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m := fakes[i%len(fakes)]
				r, err := parseRecord(m, tracefile.MsgMeta{}, "", keys)
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
			if _, err := tracefile.CheckFPM(body); err != nil {
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
			r, err := parseRecord(m, tracefile.MsgMeta{Seq: m.seq}, "", nil)
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
