package bridge

import (
	"cmp"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// BenchmarkBridgeSyncPolicy measures what fsync-before-ack costs the bridge: the same bridge, end to
// end (ZMQ PUB -> bridge -> JetStream ack), against two embedded servers started in the same run on
// the same disk, one with `sync_interval: always` and one with nats-server's default (background
// fsync every two minutes). Per policy:
//
//	<policy>-msgs/s            N FPMs sent as fast as ZMQ takes them, timed until every one is acknowledged
//	<policy>-<R>/s-p50/p99-ms  receive-to-ack latency (the bridge's receive stamp to the JetStream ack
//	                           it handles: fpmbus_bridge_receive_to_ack_seconds) with FPMs paced at R per
//	                           second, for each R of the paced rates
//	rate-ratio                 always-msgs/s / default-msgs/s
//	<R>/s-p99-ratio            always p99 / default p99 at R per second
//
// The two policies alternate within each iteration, so background load on a shared machine hits both.
//
// Run with: go test ./bridge -run '^$' -bench BridgeSyncPolicy -benchtime 1x
// (FPMBUS_BENCH_N sets N, default 30000; FPMBUS_BENCH_RATES the paced rates, default "500,2000": one
// node's FPM rate is usually hundreds to a few thousand per second; each paced phase lasts 5 s.)
func BenchmarkBridgeSyncPolicy(b *testing.B) {
	n := benchN(30000)
	var rates []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("FPMBUS_BENCH_RATES"), "500,2000"), ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 1 {
			b.Fatalf("FPMBUS_BENCH_RATES: %q is not a positive rate", f)
		}
		rates = append(rates, r)
	}
	policies := []struct {
		name string
		sync streams.SyncPolicy
	}{
		{"always", streams.SyncAlways},
		{"default", streams.SyncPolicy{Interval: streams.ServerDefaultSyncInterval}},
	}
	envs := make([]*streamstest.Env, len(policies))
	for i, p := range policies {
		envs[i] = startSyncServer(b, p.sync)
	}
	pls := make([][]byte, n)
	for i := range pls {
		pls[i] = payload("sync-bench", 0, uint64(i))
	}
	wall := make([]time.Duration, len(policies))
	lat := make([][][]time.Duration, len(policies)) // [policy][rate]
	for i := range lat {
		lat[i] = make([][]time.Duration, len(rates))
	}
	run := 0
	iter := 0
	for b.Loop() {
		iter++
		for i := range policies {
			run++
			d, _ := benchBridge(b, envs[i], pls, run)
			wall[i] += d
		}
		for r, rate := range rates {
			for i := range policies {
				run++
				lat[i][r] = append(lat[i][r], pacedReceiveToAck(b, envs[i], 5*rate, rate, "sync-lat-"+strconv.Itoa(run))...)
			}
		}
	}
	q := func(l []time.Duration, p float64) float64 {
		return float64(l[int(p*float64(len(l)-1))]) / float64(time.Millisecond)
	}
	msgs := make([]float64, len(policies))
	for i, p := range policies {
		msgs[i] = float64(n*iter) / wall[i].Seconds()
		b.ReportMetric(msgs[i], p.name+"-msgs/s")
	}
	b.ReportMetric(msgs[0]/msgs[1], "rate-ratio")
	for r, rate := range rates {
		hz := strconv.Itoa(rate) + "/s"
		p99 := make([]float64, len(policies))
		for i, p := range policies {
			slices.Sort(lat[i][r])
			p99[i] = q(lat[i][r], 0.99)
			b.ReportMetric(q(lat[i][r], 0.50), p.name+"-"+hz+"-p50-ms")
			b.ReportMetric(p99[i], p.name+"-"+hz+"-p99-ms")
		}
		b.ReportMetric(p99[0]/p99[1], hz+"-p99-ratio")
	}
	b.ReportMetric(0, "ns/op")
}

// startSyncServer is streamstest.Start with a sync policy: an embedded server on loopback, its store in
// a fresh temporary directory, fpmbus's streams applied.
func startSyncServer(b *testing.B, p streams.SyncPolicy) *streamstest.Env {
	b.Helper()
	dir := b.TempDir()
	srv, err := streams.StartServer(streams.ServerConfig{Listen: "127.0.0.1:0", StoreDir: dir, Sync: p})
	if err != nil {
		b.Fatal(err)
	}
	env := &streamstest.Env{Server: srv, StoreDir: dir}
	b.Cleanup(env.Stop)
	if env.NC, err = nats.Connect(srv.ClientURL()); err != nil {
		b.Fatal(err)
	}
	if env.JS, err = jetstream.New(env.NC); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Apply(ctx, env.JS, streams.DefaultConfig()); err != nil {
		b.Fatal(err)
	}
	return env
}

// pacedReceiveToAck sends n FPMs at rate per second (in bursts every millisecond) through a fresh
// bridge on env and returns each one's receive-to-ack time.
func pacedReceiveToAck(b *testing.B, env *streamstest.Env, n, rate int, worker string) []time.Duration {
	b.Helper()
	out := make([]time.Duration, n)
	var acked atomic.Int64
	pub := newTestPub(b, "tcp://127.0.0.1:*")
	defer pub.Close()
	h := startBridge(b, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = worker },
		withAckHook(func(it *item, at time.Time) {
			out[it.seq] = at.Sub(it.recv)
			acked.Add(1)
		}))
	defer func() { _ = h.stop() }()
	pub.waitSubscribed()
	pls := make([][]byte, n)
	for i := range pls {
		pls[i] = payload(worker, 0, uint64(i))
	}
	// Bursts every millisecond at high rates (a busy rank's forward passes), single sends below 1000/s.
	perTick := max(1, rate/1000)
	t := time.NewTicker(time.Second * time.Duration(perTick) / time.Duration(rate))
	for i := 0; i < n; {
		<-t.C
		for j := 0; j < perTick && i < n; j, i = j+1, i+1 {
			pub.send(uint64(i), pls[i])
		}
	}
	t.Stop()
	deadline := time.Now().Add(time.Minute)
	for acked.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d acks: %s", acked.Load(), n, fmtStats(h.b.Stats()))
		}
		time.Sleep(time.Millisecond)
	}
	return out
}
