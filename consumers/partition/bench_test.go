package partition

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// Throughput of one member acking every message, against a plain durable pull consumer doing the same
// on the same stream. Each variant publishes n FPM-sized messages over 64 keys first (not timed), then
// times the consumption of all of them:
//
//	plain                     a durable pull consumer on FPM: Messages(), Next, Ack
//	member_P1                 one member of a 1-partition group (consumes FPM itself)
//	member_P16                one member of a 16-partition group, the partition stream already full
//	member_P16_workqueue      the same on a work-queue partition stream (the alternative rejected)
//	member_P16_with_sourcing  member_P16 timed from Join: the server copies FPM meanwhile
var variants = []string{"plain", "member_P1", "member_P16", "member_P16_workqueue", "member_P16_with_sourcing"}

// BenchmarkThroughput runs each variant with b.N messages, e.g.
//
//	go test ./consumers/partition -run '^$' -bench Throughput -benchtime 200000x
func BenchmarkThroughput(b *testing.B) {
	for _, v := range variants {
		b.Run(v, func(b *testing.B) {
			b.StopTimer()
			rate := throughput(b, v, b.N)
			b.ReportMetric(rate, "msgs/s")
		})
	}
}

// TestThroughputComparison runs the variants in interleaved rounds, so that a machine shared with
// other work slows all of them alike, and reports the median rate of each and its median ratio to
// plain in the same round. Opt in: FPMBUS_BENCH_ROUNDS=5 [FPMBUS_BENCH_MSGS=100000] go test -run
// ThroughputComparison -v ./consumers/partition
func TestThroughputComparison(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("FPMBUS_BENCH_ROUNDS"))
	if rounds < 1 {
		t.Skip("set FPMBUS_BENCH_ROUNDS to run")
	}
	n := 100000
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_MSGS")); err == nil && v > 0 {
		n = v
	}
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	for r := range rounds {
		var plain float64
		for _, v := range variants {
			var rate float64
			t.Run(v, func(t *testing.T) { rate = throughput(t, v, n) })
			rates[v] = append(rates[v], rate)
			if v == "plain" {
				plain = rate
			}
			ratios[v] = append(ratios[v], rate/plain)
			t.Logf("round %d %-26s %8.0f msgs/s  x%.2f", r+1, v, rate, rate/plain)
		}
	}
	for _, v := range variants {
		t.Logf("median %-26s %8.0f msgs/s  x%.2f of plain (%d rounds of %d messages)", v, median(rates[v]), median(ratios[v]), rounds, n)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// throughput runs one variant over n messages and returns messages per second.
func throughput(tb testing.TB, variant string, n int) float64 {
	env, js := benchEnv(tb, n)
	ctx := context.Background()
	if b, ok := tb.(*testing.B); ok {
		defer b.StopTimer()
		b.StartTimer()
	}
	if variant == "plain" {
		cons, err := env.JS.CreateOrUpdateConsumer(ctx, streams.StreamFPM, jetstream.ConsumerConfig{
			Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
			MaxAckPending: defaultMaxAckPending, FilterSubject: "fpm.*.*.*.*",
		})
		if err != nil {
			tb.Fatal(err)
		}
		start := time.Now()
		it, err := cons.Messages(jetstream.PullMaxMessages(defaultBatch))
		if err != nil {
			tb.Fatal(err)
		}
		defer it.Stop()
		for range n {
			m, err := it.Next()
			if err != nil {
				tb.Fatal(err)
			}
			_ = m.Ack()
		}
		return float64(n) / time.Since(start).Seconds()
	}
	cfg := FPMConfig("bench")
	cfg.PinnedTTL = MinPinnedTTL
	if variant == "member_P1" {
		cfg.Partitions = 1
	}
	if variant == "member_P16_workqueue" { // Join accepts an existing partition stream with the right metadata
		src, _ := env.JS.Stream(ctx, streams.StreamFPM)
		sc := cfg.partitionStreamConfig(src.CachedInfo())
		sc.Retention = jetstream.WorkQueuePolicy
		if _, err := env.JS.CreateStream(ctx, sc); err != nil {
			tb.Fatal(err)
		}
	}
	start := time.Now()
	m, err := Join(ctx, js, cfg, WithLogger(testLogger()))
	if err != nil {
		tb.Fatal(err)
	}
	if cfg.Partitions > 1 && variant != "member_P16_with_sourcing" {
		ps, _ := env.JS.Stream(ctx, cfg.PartitionStream())
		waitFor(tb, 2*time.Minute, "sourcing", func() bool {
			i, err := ps.Info(ctx)
			return err == nil && i.State.Msgs == uint64(n)
		})
		start = time.Now()
	}
	var got atomic.Int64
	done := make(chan struct{})
	cerr := make(chan error, 1)
	go func() {
		cerr <- m.Consume(ctx, func(ctx context.Context, _ int, msgs <-chan jetstream.Msg) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case msg, ok := <-msgs:
					if !ok {
						return nil
					}
					_ = msg.Ack()
					if got.Add(1) == int64(n) {
						close(done)
					}
				}
			}
		})
	}()
	<-done
	rate := float64(n) / time.Since(start).Seconds()
	_ = m.Stop(ctx)
	if err := <-cerr; err != nil {
		tb.Fatal(err)
	}
	return rate
}

// benchEnv starts a server and publishes n ~600-byte messages over 64 keys.
func benchEnv(tb testing.TB, n int) (*natsservertest.Env, jetstream.JetStream) {
	tb.Helper()
	env := natsservertest.Start(tb)
	_, js := connect(tb, env)
	pad := make([]byte, 400)
	for i := range pad {
		pad[i] = 'x'
	}
	body := []byte(`{"version":1,"worker_id":"w","dp_rank":0,"counter_id":0,"wall_time":0.001,` +
		`"scheduled_requests":{"num_prefill_requests":3,"sum_prefill_tokens":4096,"num_decode_requests":60,"sum_decode_kv_tokens":120000},` +
		`"queued_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"num_decode_requests":0,"sum_decode_kv_tokens":0},` +
		`"padding":"` + string(pad) + `"}`)
	subjects := make([]string, 64)
	for k := range subjects {
		subjects[k] = streams.FPMSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w" + strconv.Itoa(k), DPRank: k % 8})
	}
	for i := range n {
		if _, err := env.JS.PublishAsync(subjects[i%len(subjects)], body); err != nil {
			tb.Fatal(err)
		}
		if i%4000 == 3999 {
			<-env.JS.PublishAsyncComplete()
		}
	}
	<-env.JS.PublishAsyncComplete()
	return env, js
}
