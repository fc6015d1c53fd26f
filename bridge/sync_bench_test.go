package bridge

import (
	"cmp"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// BenchmarkBridgeSyncPolicy measures what fsync-before-ack costs the bridge: the same bridge, end to
// end (ZMQ PUB -> bridge -> JetStream ack), against two embedded servers started in the same run on
// the same disk, one with `sync_interval: always` and one with nats-server's default (background
// fsync every two minutes). Each iteration is one run of every side; per run:
//
//	rate ratio     always msgs/s / default msgs/s: N FPMs sent as fast as ZMQ takes them, timed until
//	               every one is acknowledged (group commit: the backlog goes in atomic batches);
//	               rate-ratio-vs-one-by-one against the default without group commit (every FPM on
//	               its own, the best a server without per-message fsync does)
//	<R>/s p99      receive-to-ack p99 (the bridge's receive stamp to the JetStream ack it handles:
//	               fpmbus_bridge_receive_to_ack_seconds) with FPMs paced at R per second, per policy
//	disk limit     what the same disk takes, written as the server writes: 200-byte records appended
//	               to a file with one fsync per record (disk-1-fsync-rec/s) and with one per 100
//	               records (disk-100-fsync-rec/s: the ceiling group commit approaches)
//
// and it reports the min, median and max over the runs of each (-min, -med, -max), and the load
// average (1 min) at the end: the machine is shared. The policies alternate within each run, so
// background load hits both.
//
// Run with: go test ./bridge -run '^$' -bench BridgeSyncPolicy -benchtime 3x (./taskw bench:durable)
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
		sync natsserver.SyncPolicy
	}{
		{"always", natsserver.SyncAlways},
		{"default", natsserver.SyncPolicy{Interval: natsserver.ServerDefaultSyncInterval}},
	}
	envs := make([]*natsservertest.Env, len(policies))
	for i, p := range policies {
		envs[i] = startSyncServer(b, p.sync)
	}
	pls := make([][]byte, n)
	for i := range pls {
		pls[i] = payload("sync-bench", 0, uint64(i))
	}
	runs := map[string][]float64{} // metric -> one value per run
	run := 0
	for b.Loop() {
		msgs := make([]float64, len(policies))
		for i, p := range policies {
			run++
			d, _ := benchBridge(b, envs[i], pls, run)
			msgs[i] = float64(n) / d.Seconds()
			runs[p.name+"-msgs/s"] = append(runs[p.name+"-msgs/s"], msgs[i])
		}
		runs["rate-ratio"] = append(runs["rate-ratio"], msgs[0]/msgs[1])
		// The strict baseline: no fsync and no group commit (every FPM on its own), which is what a
		// server without per-message fsync does best.
		run++
		d, _ := benchBridge(b, envs[1], pls, run, withoutGroupCommit())
		single := float64(n) / d.Seconds()
		runs["default-one-by-one-msgs/s"] = append(runs["default-one-by-one-msgs/s"], single)
		runs["rate-ratio-vs-one-by-one"] = append(runs["rate-ratio-vs-one-by-one"], msgs[0]/single)
		for _, rate := range rates {
			hz := strconv.Itoa(rate) + "/s"
			for i, p := range policies {
				run++
				// The phases before this one leave the no-fsync server's writes in the page cache;
				// the kernel writing them back now would stall this phase's fsyncs, a cost of the
				// benchmark's own order, not of the policy measured.
				syscall.Sync()
				l := pacedReceiveToAck(b, envs[i], 5*rate, rate, "sync-lat-"+strconv.Itoa(run))
				slices.Sort(l)
				runs[p.name+"-"+hz+"-p50-ms"] = append(runs[p.name+"-"+hz+"-p50-ms"], quantileMs(l, 0.50))
				runs[p.name+"-"+hz+"-p99-ms"] = append(runs[p.name+"-"+hz+"-p99-ms"], quantileMs(l, 0.99))
			}
		}
		one, group := diskAppendRates(b, b.TempDir())
		runs["disk-1-fsync-rec/s"] = append(runs["disk-1-fsync-rec/s"], one)
		runs["disk-100-fsync-rec/s"] = append(runs["disk-100-fsync-rec/s"], group)
		runs["always-vs-disk-limit"] = append(runs["always-vs-disk-limit"], msgs[0]/group)
	}
	reportRuns(b, runs)
}

// quantileMs is the p-quantile of sorted l in milliseconds.
func quantileMs(l []time.Duration, p float64) float64 {
	return float64(l[int(p*float64(len(l)-1))]) / float64(time.Millisecond)
}

// reportRuns reports the min, median and max of each metric's values (one per run), and the load
// average over the last minute.
func reportRuns(b *testing.B, runs map[string][]float64) {
	for name, v := range runs {
		slices.Sort(v)
		b.ReportMetric(v[0], name+"-min")
		b.ReportMetric(v[len(v)/2], name+"-med")
		b.ReportMetric(v[len(v)-1], name+"-max")
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 0 {
			if la, err := strconv.ParseFloat(f[0], 64); err == nil {
				b.ReportMetric(la, "loadavg-1m")
			}
		}
	}
	b.ReportMetric(0, "ns/op")
}

// diskAppendRates measures the disk under dir as a JetStream file store uses it: 200-byte records
// appended to one file, with an fsync after every record and after every 100, for about a second
// each; records per second.
func diskAppendRates(b *testing.B, dir string) (one, group float64) {
	b.Helper()
	rate := func(per int) float64 {
		f, err := os.OpenFile(dir+"/disk-"+strconv.Itoa(per), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		rec := make([]byte, 200)
		start := time.Now()
		n := 0
		for time.Since(start) < time.Second {
			for range per {
				if _, err := f.Write(rec); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		return float64(n) / time.Since(start).Seconds()
	}
	return rate(1), rate(100)
}

// startSyncServer is natsservertest.Start with a sync policy: an embedded server on loopback, its store in
// a fresh temporary directory, fpmbus's streams applied.
func startSyncServer(b *testing.B, p natsserver.SyncPolicy) *natsservertest.Env {
	b.Helper()
	dir := b.TempDir()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: dir, Sync: p})
	if err != nil {
		b.Fatal(err)
	}
	env := &natsservertest.Env{Server: srv, StoreDir: dir}
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
func pacedReceiveToAck(b *testing.B, env *natsservertest.Env, n, rate int, worker string) []time.Duration {
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
