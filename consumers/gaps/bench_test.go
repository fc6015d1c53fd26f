package gaps

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// benchRounds is how many times BenchmarkDetectorVsAckOnly measures each side (FPMBUS_BENCH_ROUNDS).
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 5
}

// BenchmarkDetectorVsAckOnly consumes the same pre-published FPMs (16 ranks of 8 workers, one gap
// per publisher every 1000 messages, every tenth an idle heartbeat), each side on a consumer of its
// own with the detector's consumer settings, until everything is acknowledged:
//
//   - bare: the cheapest consumer of the stream: a pull consumer with the AckAll policy (the
//     detector's consumer settings, without the partition group) that fetches and acknowledges
//     cumulatively, every 1000 messages and the last, and does nothing else;
//   - pinned: the same, declared and pulled with the pinned-client priority group that every
//     partition consumer has (consumers/partition): what partition ownership costs the server;
//   - runner: a durable.Runner (the detector's group and runner settings) whose Consumer says every
//     message done at once: the runner's own cost on top of pinned;
//   - detector: the gap detector (state per publisher, checkpoints in the state bucket, events).
//
// Each side's rate is its steady rate: how fast its ack floor went from 10% to 90% of the messages
// (polled every 5 ms), which leaves out what the sides do differently once (joining a group, loading
// state; the last checkpoint, the graceful stop). Its CPU is the process's (server included) over the
// same window, per message: on a machine shared with other work the wall time follows their load, the
// CPU time much less. The sides rotate through the rounds (FPMBUS_BENCH_ROUNDS, default 5), so that
// load from elsewhere hits them alike. It reports each side's median rate and CPU per message, the
// ratios of the median rates (ratio = detector / bare, goal >= 0.8; pinned/bare, runner/bare,
// runner/pinned, detector/runner), the lowest per-round ratio of detector to bare, and cpu-ratio (bare
// CPU / detector CPU per message, medians). FPMBUS_BENCH_PROFILE=<dir> writes a CPU profile of each
// side and round (profileSide). Pinned runs at about 0.7x of bare: the server adds a Nats-Pin-Id
// header to every message it delivers to a pinned client, which is what partition ownership costs
// (see BenchmarkTraceWriterVsBareConsumer in consumers/trace); the runner and the detector cannot be
// faster than pinned.
func BenchmarkDetectorVsAckOnly(b *testing.B) {
	n := benchRecords()
	env := streamstest.Start(b)
	var keys []streams.Key
	for w := range 8 {
		for r := range 16 {
			keys = append(keys, key(fmt.Sprint("worker-", w), r))
		}
	}
	t0 := time.Now().UnixMilli()
	msgs := make([]*nats.Msg, 0, n)
	seq := make([]uint64, len(keys))
	for i := range n {
		k := i % len(keys)
		if seq[k]%1000 == 999 {
			seq[k] += 3 // a gap
		}
		msgs = append(msgs, fpmMsg(keys[k], seq[k], t0, t0+int64(i/len(keys))*10, seq[k]%10 == 0, "bench"))
		seq[k]++
	}
	publishAll(b, env.JS, msgs...)
	url := env.Server.ClientURL()
	b.ResetTimer()
	for i := range b.N {
		var bare, pinned, runner, det, bareCPU, pinnedCPU, runnerCPU, detCPU []float64
		minRatio := math.Inf(1)
		for round := range benchRounds() {
			cfg := DefaultConfig()
			cfg.StaleAfter = time.Hour
			var r [4]sideResult
			sides := []func(){
				func() {
					defer profileSide(b, "bare", round)()
					r[0] = benchBare(b, url, withGroup(cfg, "bare-", i, round), n, false)
				},
				func() {
					defer profileSide(b, "pinned", round)()
					r[1] = benchBare(b, url, withGroup(cfg, "pinned-", i, round), n, true)
				},
				func() {
					defer profileSide(b, "runner", round)()
					r[2] = benchRunner(b, url, withGroup(cfg, "runner-", i, round), n)
				},
				func() {
					defer profileSide(b, "detector", round)()
					r[3] = benchDetector(b, url, withGroup(cfg, "gaps-", i, round), n)
				},
			}
			for k := range sides {
				if side := (k + round) % len(sides); benchSide([]string{"bare", "pinned", "runner", "detector"}[side]) {
					sides[side]()
				}
			}
			bare, pinned, runner, det = append(bare, r[0].rate), append(pinned, r[1].rate), append(runner, r[2].rate), append(det, r[3].rate)
			bareCPU, pinnedCPU = append(bareCPU, r[0].cpuUs), append(pinnedCPU, r[1].cpuUs)
			runnerCPU, detCPU = append(runnerCPU, r[2].cpuUs), append(detCPU, r[3].cpuUs)
			minRatio = min(minRatio, r[3].rate/r[0].rate)
			if os.Getenv("FPMBUS_BENCH_TRACE") != "" {
				b.Logf("round %d: bare %.0f/s %.2fus, pinned %.0f/s %.2fus, runner %.0f/s %.2fus, detector %.0f/s %.2fus", round,
					r[0].rate, r[0].cpuUs, r[1].rate, r[1].cpuUs, r[2].rate, r[2].cpuUs, r[3].rate, r[3].cpuUs)
			}
		}
		bareM, pinnedM, runnerM, detM := median(bare), median(pinned), median(runner), median(det)
		b.ReportMetric(bareM, "bare-msg/s")
		b.ReportMetric(pinnedM, "pinned-msg/s")
		b.ReportMetric(runnerM, "runner-msg/s")
		b.ReportMetric(detM, "detector-msg/s")
		b.ReportMetric(detM/bareM, "ratio")
		b.ReportMetric(minRatio, "min-ratio")
		b.ReportMetric(pinnedM/bareM, "pinned/bare")
		b.ReportMetric(runnerM/bareM, "runner/bare")
		b.ReportMetric(runnerM/pinnedM, "runner/pinned")
		b.ReportMetric(detM/runnerM, "detector/runner")
		b.ReportMetric(median(bareCPU), "bare-cpu-us/msg")
		b.ReportMetric(median(pinnedCPU), "pinned-cpu-us/msg")
		b.ReportMetric(median(runnerCPU), "runner-cpu-us/msg")
		b.ReportMetric(median(detCPU), "detector-cpu-us/msg")
		b.ReportMetric(median(bareCPU)/median(detCPU), "cpu-ratio")
	}
}

// withGroup is cfg for one side of one round: a group (and so a consumer) of its own.
func withGroup(cfg Config, side string, i, round int) Config {
	cfg.Group = fmt.Sprint(side, i, "-", round)
	return cfg
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchSide reports whether side runs: FPMBUS_BENCH_SIDES, when set, lists the sides to run (comma
// separated), e.g. to compare one side of two builds; the ratios of a side left out are meaningless.
func benchSide(side string) bool {
	list := os.Getenv("FPMBUS_BENCH_SIDES")
	return list == "" || slices.Contains(strings.Split(list, ","), side)
}

// profileSide profiles the process's CPU (the in-process server included) while one side runs, when
// FPMBUS_BENCH_PROFILE names a directory: <dir>/<side>-<round>.prof. Merge a side's rounds with
// `go tool pprof -top <dir>/detector-*.prof`. Not with -cpuprofile, which holds the one CPU profile.
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

// sideResult is one side's steady rate (messages per second) and the process CPU per message over
// the same window, in microseconds.
type sideResult struct{ rate, cpuUs float64 }

// cpuTime is the user and system time the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// connect is a connection of a side's own.
func connect(b *testing.B, url string) (*nats.Conn, jetstream.JetStream) {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

// benchDetector runs a detector with cfg until it has acked n messages and returns its steady rate.
func benchDetector(b *testing.B, url string, cfg Config, n int) sideResult {
	nc, js := connect(b, url)
	defer nc.Close()
	d, err := New(cfg, js, WithLogger(testLogger()))
	if err != nil {
		b.Fatal(err)
	}
	return benchRun(b, js, cfg.FPMDurable(), n, d.Run)
}

// doneAtOnce is the cheapest durable.Consumer: every message is done as soon as it is handed.
type doneAtOnce struct{}

func (doneAtOnce) Handle(_ context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		m.Done()
	}
	return nil
}
func (doneAtOnce) Tick(context.Context, time.Time) error { return nil }
func (doneAtOnce) Close(context.Context) error           { return nil }

// benchRunner runs a durable.Runner with doneAtOnce on the detector's group and runner settings until
// n messages are acked and returns its steady rate.
func benchRunner(b *testing.B, url string, cfg Config, n int) sideResult {
	nc, js := connect(b, url)
	defer nc.Close()
	rc := cfg.runnerConfig()
	rc.Name = "bench"
	r, err := durable.New(rc, js, doneAtOnce{}, durable.WithLogger(testLogger()))
	if err != nil {
		b.Fatal(err)
	}
	return benchRun(b, js, cfg.FPMDurable(), n, r.Run)
}

// benchRun runs run until consumer name has acknowledged all n messages, stops it and returns the
// steady rate.
func benchRun(b *testing.B, js jetstream.JetStream, name string, n int, run func(context.Context) error) sideResult {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	res := steadyRate(b, js, name, n, done)
	waitAckFloor(b, js, name, uint64(n))
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return res
}

// benchBare consumes n messages with the cheapest consumer (see BenchmarkDetectorVsAckOnly) on the
// detector's consumer settings and returns its steady rate. pinned keeps the partition consumers'
// pinned-client priority group and pulls in it.
func benchBare(b *testing.B, url string, cfg Config, n int, pinned bool) sideResult {
	nc, js := connect(b, url)
	defer nc.Close()
	ctx := context.Background()
	pc := cfg.PartitionConfig()
	cc := pc.ConsumerConfig(0)
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(pc.Batch)}
	if pinned {
		opts = append(opts, jetstream.PullPriorityGroup(durable.PriorityGroup))
	} else {
		cc.PriorityGroups, cc.PriorityPolicy, cc.PinnedTTL = nil, jetstream.PriorityPolicyNone, 0
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, pc.ConsumerStream(), cc)
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
	res := steadyRate(b, js, cc.Durable, n, done)
	waitAckFloor(b, js, cc.Durable, uint64(n))
	return res
}

// consumerInfoOf returns a function that reads consumer name's info (nil until the consumer exists).
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

// steadyRate polls consumer name's ack floor every 5 ms until it reaches 90% of n and returns the
// rate at which it went from 10% to 90%, with the process CPU per message over that window.
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
				msgs := float64(floor - floorLo)
				return sideResult{rate: msgs / now.Sub(tLo).Seconds(), cpuUs: float64((cpu - cpuLo).Microseconds()) / msgs}
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

// BenchmarkGapEventDelay measures, live, the delay from the end of a gap (the bridge receive time
// of the message after it, stamped just before it is published) to the moment its event is
// received from FPM_EVENTS: for bridge drops whose marker is already stored, for publisher
// restarts, and for ZMQ drops (which wait for the marker grace, here 200 ms; reported without it).
func BenchmarkGapEventDelay(b *testing.B) {
	env := streamstest.Start(b)
	cfg := DefaultConfig()
	cfg.StaleAfter = time.Hour
	cfg.MarkerGrace = 200 * time.Millisecond
	h := startDetector(b, env.Server.ClientURL(), cfg)
	var mu sync.Mutex
	delays := map[string][]time.Duration{}
	sub, err := env.NC.Subscribe(streams.GapEventWildcard, func(m *nats.Msg) {
		now := time.Now()
		var e Event
		if json.Unmarshal(m.Data, &e) != nil || e.After == nil {
			return
		}
		mu.Lock()
		delays[e.Cause] = append(delays[e.Cause], now.Sub(time.UnixMilli(e.After.ObservedAtMs)))
		mu.Unlock()
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	const rounds = 50
	b.ResetTimer()
	for i := range b.N {
		for r := range rounds {
			k := key(fmt.Sprintf("delay-%d-%d", i, r), 0)
			epoch := time.Now().UnixMilli()
			now := func() int64 { return time.Now().UnixMilli() }
			publishAll(b, env.JS, fpmMsg(k, 0, epoch, now(), false, "b"), markerMsg(k, epoch, 1, 4, "buffer_full"))
			publishAll(b, env.JS, fpmMsg(k, 5, epoch, now(), false, "b"))   // bridge_drop, marker already stored
			publishAll(b, env.JS, fpmMsg(k, 0, epoch+1, now(), false, "b")) // publisher_restart
			publishAll(b, env.JS, fpmMsg(k, 3, epoch+1, now(), false, "b")) // zmq_drop 1..2 after the grace
			time.Sleep(20 * time.Millisecond)
		}
	}
	checkFor(b, 30*time.Second, 50*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(delays[CauseZMQDrop]) < rounds*b.N {
			return fmt.Errorf("%d of %d zmq_drop events", len(delays[CauseZMQDrop]), rounds*b.N)
		}
		return nil
	})
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	for _, c := range []string{CauseBridgeDrop, CausePublisherRestart, CauseZMQDrop} {
		ds := delays[c]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		if len(ds) == 0 {
			continue
		}
		p := func(q float64) float64 { return ds[min(int(q*float64(len(ds))), len(ds)-1)].Seconds() * 1000 }
		b.ReportMetric(p(0.5), c+"-p50-ms")
		b.ReportMetric(p(0.99), c+"-p99-ms")
	}
	_ = h
}
