package gaps

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 200_000
}

// BenchmarkDetectorVsAckOnly consumes the same pre-published FPMs (16 ranks of 8 workers, one gap
// per publisher every 1000 messages), each time on a fresh durable consumer with the detector's
// consumer settings, until everything is acked, with:
//
//	bare      the cheapest consumer of the stream: a plain durable with cumulative acks (AckAll), one
//	          pull loop acking the last message of every 512 and nothing else (the baseline)
//	member    a bare member of the detector's partition group (consumers/partition: pinned-client
//	          pulls, ordered takeover) acking the last of what has arrived: what the group costs
//	runner    a durable.Runner whose Consumer marks every message done at once: the group plus what
//	          the consumer contract costs (done-prefix acks, dead-letter checks, metrics)
//	detector  the gap detector
//
// The variants alternate FPMBUS_BENCH_ROUNDS times (default 5) so that a busy machine slows all alike.
// It reports the median rates, the medians of the per-round ratios of rates, ratio (detector / bare,
// target >= 0.8) and runner-ratio (runner / bare), and, since wall time on a shared machine follows
// the others' load, the process CPU time (server included) per message of each variant and the
// medians of the per-round efficiency ratios cpu-ratio (bare CPU / detector CPU) and runner-cpu-ratio.
func BenchmarkDetectorVsAckOnly(b *testing.B) {
	n := benchRecords()
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
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
		var bare, mem, run, det, bareCPU, memCPU, runCPU, detCPU, ratio, runRatio, cpuRatio, runCPURatio []float64
		for r := range rounds {
			cfg := DefaultConfig()
			cfg.Group = fmt.Sprint("bare-", i, "-", r)
			bareRate, bareUs := measure(n, func() time.Duration { return benchBare(b, url, cfg, n) })
			cfg.Group = fmt.Sprint("member-", i, "-", r)
			memRate, memUs := measure(n, func() time.Duration { return benchMember(b, url, cfg, n) })
			cfg.Group = fmt.Sprint("runner-", i, "-", r)
			runRate, runUs := measure(n, func() time.Duration { return benchRunner(b, url, cfg, n) })
			cfg.Group = fmt.Sprint("gaps-", i, "-", r)
			detRate, detUs := measure(n, func() time.Duration { return benchDetector(b, url, cfg, n) })
			bare, mem, run, det = append(bare, bareRate), append(mem, memRate), append(run, runRate), append(det, detRate)
			bareCPU, memCPU, runCPU, detCPU = append(bareCPU, bareUs), append(memCPU, memUs), append(runCPU, runUs), append(detCPU, detUs)
			ratio, runRatio = append(ratio, detRate/bareRate), append(runRatio, runRate/bareRate)
			cpuRatio, runCPURatio = append(cpuRatio, bareUs/detUs), append(runCPURatio, bareUs/runUs)
			if os.Getenv("FPMBUS_BENCH_TRACE") != "" {
				b.Logf("round %d: bare %.0f/s %.2fus, member %.0f/s %.2fus, runner %.0f/s %.2fus, detector %.0f/s %.2fus",
					r, bareRate, bareUs, memRate, memUs, runRate, runUs, detRate, detUs)
			}
		}
		med := func(xs []float64) float64 { sort.Float64s(xs); return xs[len(xs)/2] }
		b.ReportMetric(med(bare), "bare-msg/s")
		b.ReportMetric(med(mem), "member-msg/s")
		b.ReportMetric(med(run), "runner-msg/s")
		b.ReportMetric(med(det), "detector-msg/s")
		b.ReportMetric(med(ratio), "ratio")
		b.ReportMetric(med(runRatio), "runner-ratio")
		b.ReportMetric(med(bareCPU), "bare-cpu-us/msg")
		b.ReportMetric(med(memCPU), "member-cpu-us/msg")
		b.ReportMetric(med(runCPU), "runner-cpu-us/msg")
		b.ReportMetric(med(detCPU), "detector-cpu-us/msg")
		b.ReportMetric(med(cpuRatio), "cpu-ratio")
		b.ReportMetric(med(runCPURatio), "runner-cpu-ratio")
	}
}

// measure runs one variant over n messages and returns its rate (messages per second of wall time)
// and the CPU time the whole process (server included) spent per message, in microseconds: on a
// machine shared with other work the wall time varies with their load, the CPU time much less.
func measure(n int, run func() time.Duration) (rate, cpuUs float64) {
	before := cpuTime()
	took := run()
	return float64(n) / took.Seconds(), float64((cpuTime() - before).Microseconds()) / float64(n)
}

// cpuTime is the user and system time the process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchDetector runs a detector with cfg until it has acked n messages and returns how long it took.
func benchDetector(b *testing.B, url string, cfg Config, n int) time.Duration {
	cfg.StaleAfter = time.Hour
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	d, err := New(cfg, js, WithLogger(testLogger()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- d.Run(ctx) }()
	<-d.Ready()
	ready := time.Since(start)
	waitAckFloor(b, js, cfg.FPMDurable(), 1)
	first := time.Since(start)
	waitAckFloor(b, js, cfg.FPMDurable(), uint64(n))
	took := time.Since(start)
	if os.Getenv("FPMBUS_BENCH_TRACE") != "" {
		b.Logf("detector: ready %v, first ack %v, all acked %v", ready, first, took)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return took
}

// benchMember acks n messages as a bare member of the detector's partition group
// (Config.PartitionConfig, consumers/partition): its handler acks the last message of what has
// arrived, which covers the rest.
func benchMember(b *testing.B, url string, cfg Config, n int) time.Duration {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	start := time.Now()
	m, err := partition.Join(context.Background(), js, cfg.PartitionConfig(), partition.WithLogger(testLogger()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.Consume(ctx, func(ctx context.Context, _ int, msgs <-chan jetstream.Msg) error {
			for {
				select {
				case msg, ok := <-msgs:
					if !ok {
						return nil
					}
					for more := true; more; { // ack the last of what has arrived: it covers the rest
						select {
						case next, ok := <-msgs:
							if ok {
								msg = next
							} else {
								more = false
							}
						default:
							more = false
						}
					}
					_ = msg.Ack()
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		})
	}()
	waitAckFloor(b, js, cfg.FPMDurable(), uint64(n))
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return took
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

// benchRunner runs a durable.Runner with a Consumer that does nothing, on the detector's group
// settings, until n messages are acked.
func benchRunner(b *testing.B, url string, cfg Config, n int) time.Duration {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	start := time.Now()
	r, err := durable.New(durable.Config{Name: "bench", Group: cfg.PartitionConfig()}, js, doneAtOnce{}, durable.WithLogger(testLogger()))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitAckFloor(b, js, cfg.FPMDurable(), uint64(n))
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return took
}

// benchBare consumes n messages on a plain durable consumer with the detector's consumer settings and
// cumulative acks (no partition group, no priority group): one pull loop that acks the last message
// of every 512 (the AckAll policy covers the rest) and nothing else.
func benchBare(b *testing.B, url string, cfg Config, n int) time.Duration {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	start := time.Now()
	pc := cfg.PartitionConfig()
	cc := pc.ConsumerConfig(0)
	cc.PriorityGroups, cc.PriorityPolicy, cc.PinnedTTL = nil, jetstream.PriorityPolicyNone, 0
	cons, err := js.CreateOrUpdateConsumer(ctx, pc.ConsumerStream(), cc)
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(pc.Batch))
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if i%512 != 511 && i != n-1 {
			continue
		}
		if err := m.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	waitAckFloor(b, js, cfg.FPMDurable(), uint64(n))
	took := time.Since(start)
	it.Stop()
	return took
}

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
