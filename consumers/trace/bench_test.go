package trace

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
	return 5
}

// BenchmarkTraceWriterVsBareConsumer consumes the same pre-published FPMs (16 ranks of 8 workers),
// each side on a consumer of its own, until everything is acknowledged:
//
//   - bare: the cheapest consumer of the stream: a pull consumer with the AckAll policy (the writer's
//     consumer settings, without the partition group) that fetches and acknowledges cumulatively,
//     every 1000 messages and the last, and does nothing else;
//   - pinned: the same, declared and pulled with the pinned-client priority group that every
//     partition consumer has (consumers/partition): what partition ownership costs the server;
//   - runner: a durable.Runner (the writer's group and runner settings) whose Consumer says every
//     message done at once: the runner's own cost on top of pinned;
//   - full: the trace writer in full mode (Consumer, defaults): parse, line, gzip, write, fsync, done.
//
// Each side's rate is its steady rate: how fast its ack floor went from 10% to 90% of the messages
// (polled every 5 ms), which leaves out what the sides do differently once (joining a group, the
// first pulls; the last flush, the graceful stop). Its CPU is the process's (server included) over the
// same window, per record: on a machine shared with other work the wall time follows their load, the
// CPU time much less. The sides rotate through the rounds (benchRounds), so that load from elsewhere
// on the machine hits them alike. It reports each side's median rate and CPU per record, the ratios of
// the medians to bare (goal for full: >= 0.8) and of full to pinned and runner, the lowest per-round
// ratio of full to bare, and the compressed bytes per record. FPMBUS_BENCH_PROFILE=<dir> writes a CPU
// profile of each side and round (profileSide).
//
// What the pin costs. Pinned alone runs at about 0.7x of bare (0.67–0.72x on an idle 2-CPU host; the
// process spends about 2 µs more CPU per message than bare's 5.5–7 µs, 1 to 3.4 µs in our runs on a
// shared host), and full and the runner cannot be faster than pinned: nats-server (v2.15) adds a
// Nats-Pin-Id header to every message it delivers to a pinned client, rebuilding the header with
// net/http's Header.Write in a new buffer and copying the message after it (its consumer delivery loop
// costs it about twice bare's per message), and the client decodes one header more and records the pin
// id under a lock. Neither has an option to leave the header out, and no other priority policy or
// consumer type makes the server deliver to one client only (overflow and prioritized serve several, a
// push consumer whoever subscribes), so the cost comes with partition ownership (consumers/partition)
// and is kept. FPMBUS_BENCH_TRACE=1 logs every round.
func BenchmarkTraceWriterVsBareConsumer(b *testing.B) {
	n := benchRecords()
	env := streamstest.Start(b)
	msgs, _ := manyFPMs(b, testKeys(16), n, 1_782_777_600_000)
	publish(b, env.JS, msgs)
	b.ResetTimer()
	for i := range b.N {
		var bareRates, pinnedRates, runnerRates, fullRates, bareCPU, pinnedCPU, runnerCPU, fullCPU []float64
		minRatio := math.Inf(1)
		var gzPerRec float64
		for round := range benchRounds() {
			var bare, pinned, runner, full sideResult
			sides := []func(){
				func() {
					defer profileSide(b, "bare", round)()
					bare = benchBare(b, env.JS, fmt.Sprint("bare-", i, "-", round), n, false)
				},
				func() {
					defer profileSide(b, "pinned", round)()
					pinned = benchBare(b, env.JS, fmt.Sprint("pinned-", i, "-", round), n, true)
				},
				func() {
					defer profileSide(b, "runner", round)()
					runner = benchRunner(b, env.JS, fmt.Sprint("runner-", i, "-", round), n)
				},
				func() {
					defer profileSide(b, "full", round)()
					var gz int64
					full, gz = benchFull(b, env.JS, fmt.Sprint("trace-", i, "-", round), n)
					gzPerRec = float64(gz) / float64(n)
				},
			}
			for k := range sides {
				if side := (k + round) % len(sides); benchSide([]string{"bare", "pinned", "runner", "full"}[side]) {
					sides[side]()
				}
			}
			bareRates, pinnedRates = append(bareRates, bare.rate), append(pinnedRates, pinned.rate)
			runnerRates, fullRates = append(runnerRates, runner.rate), append(fullRates, full.rate)
			bareCPU, pinnedCPU = append(bareCPU, bare.cpuUs), append(pinnedCPU, pinned.cpuUs)
			runnerCPU, fullCPU = append(runnerCPU, runner.cpuUs), append(fullCPU, full.cpuUs)
			minRatio = min(minRatio, full.rate/bare.rate)
			if os.Getenv("FPMBUS_BENCH_TRACE") != "" {
				b.Logf("round %d: bare %.0f/s %.2fus, pinned %.0f/s %.2fus, runner %.0f/s %.2fus, full %.0f/s %.2fus", round,
					bare.rate, bare.cpuUs, pinned.rate, pinned.cpuUs, runner.rate, runner.cpuUs, full.rate, full.cpuUs)
			}
		}
		bare, pinned, runner, full := median(bareRates), median(pinnedRates), median(runnerRates), median(fullRates)
		b.ReportMetric(bare, "bare-rec/s")
		b.ReportMetric(pinned, "pinned-rec/s")
		b.ReportMetric(runner, "runner-rec/s")
		b.ReportMetric(full, "full-rec/s")
		b.ReportMetric(full/bare, "ratio")
		b.ReportMetric(minRatio, "min-ratio")
		b.ReportMetric(pinned/bare, "pinned/bare")
		b.ReportMetric(runner/bare, "runner/bare")
		b.ReportMetric(runner/pinned, "runner/pinned")
		b.ReportMetric(full/runner, "full/runner")
		b.ReportMetric(median(bareCPU), "bare-cpu-us/rec")
		b.ReportMetric(median(pinnedCPU), "pinned-cpu-us/rec")
		b.ReportMetric(median(runnerCPU), "runner-cpu-us/rec")
		b.ReportMetric(median(fullCPU), "full-cpu-us/rec")
		b.ReportMetric(gzPerRec, "gz-B/rec")
	}
}

// benchSide reports whether side runs: FPMBUS_BENCH_SIDES, when set, lists the sides to run (comma
// separated), e.g. to compare one side of two builds; the ratios of a side left out are meaningless.
func benchSide(side string) bool {
	list := os.Getenv("FPMBUS_BENCH_SIDES")
	return list == "" || slices.Contains(strings.Split(list, ","), side)
}

// profileSide profiles the process's CPU (the in-process server included) while one side runs, when
// FPMBUS_BENCH_PROFILE names a directory: <dir>/<side>-<round>.prof. Merge a side's rounds with
// `go tool pprof -top <dir>/full-*.prof`. Not with -cpuprofile, which holds the one CPU profile.
func profileSide(b *testing.B, side string, round int) (stop func()) {
	dir := os.Getenv("FPMBUS_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprint(side, "-", round, ".prof")))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
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

// benchFull runs the full-mode writer on its own group and returns its steady rate and the
// compressed bytes it wrote.
func benchFull(b *testing.B, js jetstream.JetStream, name string, n int) (sideResult, int64) {
	cfg := benchConfig(b, name)
	opts := []Option{WithLogger(slog.New(slog.DiscardHandler))}
	if l, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_LEVEL")); err == nil {
		opts = append(opts, WithCompressionLevel(l))
	}
	w, err := New(cfg, js, opts...)
	if err != nil {
		b.Fatal(err)
	}
	rate := benchRun(b, js, name, n, w.Run)
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
// and returns its steady rate.
func benchRunner(b *testing.B, js jetstream.JetStream, name string, n int) sideResult {
	cfg := benchConfig(b, name)
	pc, err := cfg.PartitionConfig()
	if err != nil {
		b.Fatal(err)
	}
	rc := cfg.runnerConfig(pc) // the writer's runner settings
	rc.Name = "bench"
	r, err := durable.New(rc, js, noopConsumer{}, durable.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	return benchRun(b, js, name, n, r.Run)
}

// benchRun runs run until the consumer name on FPM has acknowledged all n messages, stops it and
// returns the steady rate.
func benchRun(b *testing.B, js jetstream.JetStream, name string, n int, run func(context.Context) error) sideResult {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	rate := steadyRate(b, js, name, n, done)
	waitAckFloor(b, js, name, uint64(n))
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return rate
}

// benchBare consumes n messages with the cheapest consumer (see BenchmarkTraceWriterVsBareConsumer)
// and returns its steady rate. pinned declares it with the partition consumers' pinned-client
// priority group and pulls in that group.
func benchBare(b *testing.B, js jetstream.JetStream, name string, n int, pinned bool) sideResult {
	ctx := context.Background()
	cfg := benchConfig(b, name)
	cc := jetstream.ConsumerConfig{
		Durable: name, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckAllPolicy,
		AckWait: cfg.ackWait(), MaxDeliver: -1, MaxAckPending: cfg.MaxAckPending, FilterSubject: cfg.FilterSubject,
	}
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(cfg.pullBatch())}
	if pinned {
		cc.PriorityGroups, cc.PriorityPolicy, cc.PinnedTTL = []string{durable.PriorityGroup}, jetstream.PriorityPolicyPinned, cfg.PinnedTTL
		opts = append(opts, jetstream.PullPriorityGroup(durable.PriorityGroup))
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, cc)
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(opts...)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer it.Stop()
		for i := 1; i <= n; i++ {
			m, err := it.Next()
			if err != nil {
				done <- err
				return
			}
			if i%1000 == 0 || i == n {
				if err := m.Ack(); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	rate := steadyRate(b, js, name, n, done)
	waitAckFloor(b, js, name, uint64(n))
	return rate
}

// consumerInfo returns a function that reads consumer name's info (nil until the consumer exists).
func consumerInfoOf(js jetstream.JetStream, name string) func() *jetstream.ConsumerInfo {
	var c jetstream.Consumer
	return func() *jetstream.ConsumerInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if c == nil {
			var err error
			if c, err = js.Consumer(ctx, streams.StreamFPM, name); err != nil {
				c = nil
				return nil
			}
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return nil
		}
		return ci
	}
}

// sideResult is one side's steady rate (records per second) and the process CPU per record over the
// same window, in microseconds.
type sideResult struct{ rate, cpuUs float64 }

// cpuTime is the user and system time the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// steadyRate polls consumer name's ack floor every 5 ms until it reaches 90% of n and returns the
// rate at which it went from 10% to 90%, with the process CPU per record over that window.
func steadyRate(b *testing.B, js jetstream.JetStream, name string, n int, done <-chan error) sideResult {
	lo, hi := uint64(n)/10, uint64(n)*9/10
	var tLo time.Time
	var floorLo uint64
	var cpuLo time.Duration
	info := consumerInfoOf(js, name)
	for {
		if ci := info(); ci != nil {
			now, cpu, floor := time.Now(), cpuTime(), ci.AckFloor.Stream
			if tLo.IsZero() && floor >= lo {
				tLo, floorLo, cpuLo = now, floor, cpu
			}
			if !tLo.IsZero() && floor >= hi {
				recs := float64(floor - floorLo)
				return sideResult{rate: recs / now.Sub(tLo).Seconds(), cpuUs: float64((cpu - cpuLo).Microseconds()) / recs}
			}
		}
		select {
		case err := <-done:
			b.Fatalf("%s ended before acknowledging 90%%: %v", name, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitAckFloor polls until the consumer's ack floor reaches seq.
func waitAckFloor(b *testing.B, js jetstream.JetStream, durable string, seq uint64) {
	deadline := time.Now().Add(5 * time.Minute)
	info := consumerInfoOf(js, durable)
	for {
		if ci := info(); ci != nil && ci.AckFloor.Stream >= seq {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("consumer %s: ack floor below %d after 5 minutes", durable, seq)
		}
		time.Sleep(5 * time.Millisecond)
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
			w := benchWriter(b, cfg, WithCompressionLevel(level))
			keys := subjectKeys{}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				m := fakes[i%len(fakes)]
				r, err := parseRecord(m, msgMeta{}, "", keys)
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
			r, err := parseRecord(m, msgMeta{seq: m.seq}, "", nil)
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
