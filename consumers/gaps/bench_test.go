package gaps

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
// per publisher every 1000 messages) with (a) a loop that only acks every message, on the same
// consumer settings (the trace writer's baseline), and (b) the gap detector, each on its own durable
// consumer, until everything is acked. They alternate FPMBUS_BENCH_ROUNDS times (default 5) so that a
// busy machine slows all alike; it reports the median rates and the ratio of the medians (target >=
// 0.9). The detector acks cumulatively (ack.go), so two more loops show what that is worth and what
// the detector's own work costs: (c) a plain durable consumer with the AckAll policy acking the last
// message of every 512 (ratio-vs-ackall), and (d) an ack-only member of a partition group like the
// detector's (consumers/partition, one partition, cumulative acks: it acks the last message of what
// has arrived) (ratio-vs-member).
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
	b.ResetTimer()
	for i := range b.N {
		var ack, all, mem, det []float64
		for r := range rounds {
			cfg := DefaultConfig()
			cfg.Group = fmt.Sprint("ackonly-", i, "-", r)
			ack = append(ack, float64(n)/benchAckOnly(b, env.JS, cfg, n, false).Seconds())
			cfg.Group = fmt.Sprint("ackall-", i, "-", r)
			all = append(all, float64(n)/benchAckOnly(b, env.JS, cfg, n, true).Seconds())
			cfg.Group = fmt.Sprint("member-", i, "-", r)
			mem = append(mem, float64(n)/benchAckOnlyMember(b, env.Server.ClientURL(), cfg, n).Seconds())
			cfg.Group = fmt.Sprint("gaps-", i, "-", r)
			det = append(det, float64(n)/benchDetector(b, env.Server.ClientURL(), cfg, n).Seconds())
		}
		med := func(xs []float64) float64 { sort.Float64s(xs); return xs[len(xs)/2] }
		ackRate, allRate, memRate, detRate := med(ack), med(all), med(mem), med(det)
		b.ReportMetric(ackRate, "ackonly-msg/s")
		b.ReportMetric(allRate, "ackall-only-msg/s")
		b.ReportMetric(memRate, "member-ackonly-msg/s")
		b.ReportMetric(detRate, "detector-msg/s")
		b.ReportMetric(detRate/ackRate, "ratio")
		b.ReportMetric(detRate/allRate, "ratio-vs-ackall")
		b.ReportMetric(detRate/memRate, "ratio-vs-member")
	}
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

// benchAckOnlyMember acks n messages as a member of a partition group with the detector's
// partitioning (Config.PartitionConfig) and consumer settings: the detector's mechanism without the
// detector.
func benchAckOnlyMember(b *testing.B, url string, cfg Config, n int) time.Duration {
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

// benchAckOnly acks n messages as fast as it can, with the detector's consumer settings: every one
// (explicit acks), or with cumulative the last of every 512 (the AckAll policy).
func benchAckOnly(b *testing.B, js jetstream.JetStream, cfg Config, n int, cumulative bool) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	cc := cfg.FPMConsumerConfig()
	if cumulative {
		cc.AckPolicy = jetstream.AckAllPolicy
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, cc)
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(cfg.pullBatch()))
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		if cumulative && i%512 != 511 && i != n-1 {
			continue
		}
		if err := m.Ack(); err != nil {
			b.Fatal(err)
		}
	}
	waitAckFloor(b, js, cfg.FPMDurable(), uint64(n))
	d := time.Since(t0)
	it.Stop()
	return d
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
