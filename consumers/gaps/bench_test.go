package gaps

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/durable/durabletest"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// BenchmarkDetectorVsAckOnly consumes the same pre-published FPMs (16 ranks of 8 workers, one gap
// per publisher every 1000 messages, every tenth an idle heartbeat), each side on a consumer of its
// own with the detector's consumer settings, until everything is acknowledged:
//
//   - bare: the cheapest consumer of the stream: a pull consumer with the AckAll policy (the
//     detector's consumer settings, without the partition group) that fetches and acknowledges
//     cumulatively, every 1000 messages and the last, and does nothing else;
//   - push: the same acks on the group's own push consumer (flow control, idle heartbeats) pointed
//     at a subject of its own, the way a partition owner receives (consumers/partition): what
//     partition ownership's delivery costs;
//   - runner: a durable.Runner (the detector's group and runner settings) whose Consumer says every
//     message done at once: the runner's own cost on top of push;
//   - detector: the gap detector (state per publisher, checkpoints in the state bucket, events).
//
// Each side's rate is its steady rate: how fast its ack floor went from 10% to 90% of the messages
// (polled every 5 ms), which leaves out what the sides do differently once (joining a group, loading
// state; the last checkpoint, the graceful stop). Its CPU is the process's (server included) over the
// same window, per message: on a machine shared with other work the wall time follows their load, the
// CPU time much less. The sides rotate through the rounds (FPMBUS_BENCH_ROUNDS, default 5; durabletest.Compare), so that
// load from elsewhere hits them alike. It reports each side's median rate and CPU per message, the
// ratios of the median rates (ratio = detector / bare, goal >= 0.8; push/bare, runner/bare,
// runner/push, detector/runner), the lowest per-round ratio of detector to bare, and cpu-ratio (bare
// CPU / detector CPU per message, medians). FPMBUS_BENCH_PROFILE=<dir> writes a CPU profile of each
// side and round (durabletest). The push side runs faster than bare on one host (no pull requests to serve): partition ownership costs nothing on the delivery path.
func BenchmarkDetectorVsAckOnly(b *testing.B) {
	n := durabletest.Records(200_000)
	env := natsservertest.Start(b)
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
		cfg := DefaultConfig()
		cfg.StaleAfter = time.Hour
		side := func(name, group string, run func(Config) durabletest.Result) durabletest.Side {
			return durabletest.Side{Name: name, Run: func(round int) durabletest.Result { return run(withGroup(cfg, group, i, round)) }}
		}
		durabletest.Compare(b, "msg",
			side("bare", "bare-", func(c Config) durabletest.Result { return benchBare(b, url, c, n, false) }),
			side("push", "push-", func(c Config) durabletest.Result { return benchBare(b, url, c, n, true) }),
			side("runner", "runner-", func(c Config) durabletest.Result { return benchRunner(b, url, c, n) }),
			side("detector", "gaps-", func(c Config) durabletest.Result { return benchDetector(b, url, c, n) }))
	}
}

// withGroup is cfg for one side of one round: a group (and so a consumer) of its own.
func withGroup(cfg Config, side string, i, round int) Config {
	cfg.Group = fmt.Sprint(side, i, "-", round)
	return cfg
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
func benchDetector(b *testing.B, url string, cfg Config, n int) durabletest.Result {
	nc, js := connect(b, url)
	defer nc.Close()
	cfg.Logger = testLogger()
	d, err := New(cfg, js)
	if err != nil {
		b.Fatal(err)
	}
	return durabletest.Run(b, js, streams.StreamFPM, cfg.FPMDurable(), n, d.Run)
}

// benchRunner runs a durable.Runner with DoneAtOnce on the detector's group and runner settings until
// n messages are acked and returns its steady rate.
func benchRunner(b *testing.B, url string, cfg Config, n int) durabletest.Result {
	nc, js := connect(b, url)
	defer nc.Close()
	rc := cfg.runnerConfig()
	rc.Name, rc.Logger = "bench", testLogger()
	r, err := durable.New(rc, js, durabletest.DoneAtOnce{})
	if err != nil {
		b.Fatal(err)
	}
	return durabletest.Run(b, js, streams.StreamFPM, cfg.FPMDurable(), n, r.Run)
}

// benchBare consumes n messages with the cheapest consumer on the detector's consumer settings
// (durabletest.Bare), pulled or pushed.
func benchBare(b *testing.B, url string, cfg Config, n int, pushed bool) durabletest.Result {
	nc, js := connect(b, url)
	defer nc.Close()
	return durabletest.Bare(b, js, cfg.PartitionConfig(), n, pushed)
}

// BenchmarkGapEventDelay measures, live, the delay from the end of a gap (the bridge receive time
// of the message after it, stamped just before it is published) to the moment its event is
// received from FPM_EVENTS: for bridge drops whose marker is already stored, for publisher
// restarts, and for ZMQ drops (which wait for the marker grace, here 200 ms; reported without it).
func BenchmarkGapEventDelay(b *testing.B) {
	env := natsservertest.Start(b)
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
