package natsserver_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// BenchmarkR3SyncPolicy measures how a replicated stream syncs: on an in-process 3-node cluster with
// `sync_interval: always` and on one with nats-server's default (background fsync every two
// minutes), started in the same run on the same disk, an R3 FPM stream takes N asynchronous
// publishes of 200-byte bodies with message ids, at most 4,096 in flight, timed until every ack is in.
// The Raft leader sends what is queued as one append entry and syncs its log once per append, so
// `always` costs far less per message than on a single replica. Each iteration is one run of both;
// it reports per policy msgs/s and the ratio always/default as the min, median and max over the
// runs, and the load average.
//
// Run with: go test ./streams -run '^$' -bench R3SyncPolicy -benchtime 3x (FPMBUS_BENCH_N, default 30000)
func BenchmarkR3SyncPolicy(b *testing.B) {
	n := 30000
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	policies := []struct {
		name   string
		always bool
	}{{"always", true}, {"default", false}}
	js := make([]jetstream.JetStream, len(policies))
	for i, p := range policies {
		c := natsservertest.StartClusterWith(b, func(o *server.Options) {
			o.SyncAlways = p.always
			if !p.always {
				o.SyncInterval = natsserver.ServerDefaultSyncInterval
			}
		})
		nc, err := nats.Connect(strings.Join(c.URLs, ","))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		if js[i], err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
			b.Fatal(err)
		}
		sc := streams.DefaultConfig()
		sc.Replicas = 3
		if _, err := js[i].CreateStream(b.Context(), sc.FPMStream()); err != nil {
			b.Fatal(err)
		}
	}
	body := make([]byte, 200)
	runs := map[string][]float64{}
	run := 0
	for b.Loop() {
		got := make([]float64, len(policies))
		for i, p := range policies {
			run++
			start := time.Now()
			for j := range n {
				m := nats.NewMsg("fpm.bench.r3." + strconv.Itoa(run) + ".0")
				m.Data = body
				m.Header.Set(jetstream.MsgIDHeader, strconv.Itoa(run)+":"+strconv.Itoa(j))
				if _, err := js[i].PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js[i].PublishAsyncComplete():
			case <-time.After(5 * time.Minute):
				b.Fatalf("%s: acks missing after 5 minutes", p.name)
			}
			got[i] = float64(n) / time.Since(start).Seconds()
			runs[p.name+"-msgs/s"] = append(runs[p.name+"-msgs/s"], got[i])
		}
		runs["ratio"] = append(runs["ratio"], got[0]/got[1])
	}
	for name, v := range runs {
		slices.Sort(v)
		b.ReportMetric(v[0], name+"-min")
		b.ReportMetric(v[len(v)/2], name+"-med")
		b.ReportMetric(v[len(v)-1], name+"-max")
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		if la, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64); err == nil {
			b.ReportMetric(la, "loadavg-1m")
		}
	}
	b.ReportMetric(0, "ns/op")
}
