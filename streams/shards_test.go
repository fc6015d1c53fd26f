package streams_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// ShardOf is the server's {{partition(n,3)}} transform of the FPM subject (the worker_id token), the
// partition function of a group keyed by worker_id, for every n and for keys whose tokens need
// encoding; a worker's ranks, namespaces and components share its shard.
func TestShardOfIsThePartitionTransform(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		tr, err := server.NewSubjectTransform("fpm.*.*.*.*", "{{partition("+strconv.Itoa(n)+",3)}}")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprintf("w.%d x", i), DPRank: i % 7}
			got, err := tr.Match(streams.FPMSubject(k))
			if err != nil {
				t.Fatal(err)
			}
			if want := strconv.Itoa(streams.ShardOf(k, n)); got != want {
				t.Fatalf("n=%d %s: server partition %s, ShardOf %s", n, streams.FPMSubject(k), got, want)
			}
			other := streams.Key{Namespace: "ns" + strconv.Itoa(i), Component: "c" + strconv.Itoa(i%3), WorkerID: k.WorkerID, DPRank: i}
			if streams.ShardOf(other, n) != streams.ShardOf(k, n) {
				t.Fatalf("n=%d: %s in shard %d, %s of the same worker in shard %d", n, k, streams.ShardOf(k, n), other, streams.ShardOf(other, n))
			}
		}
	}
}

// ShardOf's values are fixed: a change moves workers between the shards of every server that exists.
func TestShardOfGolden(t *testing.T) {
	for _, tc := range []struct {
		worker string
		n      int
		want   int
	}{
		{"w0", 3, 2},
		{"w1", 3, 1},
		{"w2", 3, 1},
		{"worker-17", 8, 6},
		{"a.b c", 5, 2},
		{"w0", 1, 0},
	} {
		k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: tc.worker, DPRank: 3}
		if got := streams.ShardOf(k, tc.n); got != tc.want {
			t.Errorf("ShardOf(worker %q, %d) = %d, want %d", tc.worker, tc.n, got, tc.want)
		}
	}
}

// A sharded FPM is stored under its fpm. subject in its shard, deduplicated by its id, and republished
// on its fpm. subject for core subscribers.
func TestShardStreamStoresFPMSubject(t *testing.T) {
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 3
	for i := range n {
		if _, err := env.JS.CreateStream(ctx, streams.DefaultConfig().FPMShardStream(i, n)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := env.NC.SubscribeSync(streams.FPMWildcard)
	if err != nil {
		t.Fatal(err)
	}
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w1", DPRank: 2}
	for range 2 { // the second publish is a retry: same id
		m := &nats.Msg{Subject: streams.ShardIngestSubject(k, n), Header: nats.Header{}, Data: []byte(`{"counter_id":7}`)}
		m.Header.Set(streams.HeaderMsgID, "id-7")
		if _, err := env.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	s, err := env.JS.Stream(ctx, streams.ShardStreamName(streams.ShardOf(k, n)))
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.Msgs != 1 {
		t.Fatalf("shard holds %d messages after a publish and its retry, want 1", st.Msgs)
	}
	stored, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Subject != streams.FPMSubject(k) || stored.Header.Get(streams.HeaderMsgID) != "id-7" {
		t.Fatalf("stored %s id %q, want %s id-7", stored.Subject, stored.Header.Get(streams.HeaderMsgID), streams.FPMSubject(k))
	}
	got, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("nats sub 'fpm.>' saw nothing: %v", err)
	}
	if got.Subject != streams.FPMSubject(k) || string(got.Data) != `{"counter_id":7}` {
		t.Fatalf("core subscriber got %s %s", got.Subject, got.Data)
	}
	if extra, err := sub.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("core subscriber got a second message %s (the retry was not stored)", extra.Subject)
	}
}

// startCluster runs a 3-node JetStream cluster in this process and returns its client URLs.
func startCluster(b *testing.B) []string {
	b.Helper()
	ports := []int{freePort(b), freePort(b), freePort(b)}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	var urls []string
	for i, p := range ports {
		base := &server.Options{Cluster: server.ClusterOpts{Name: "fpmbus-bench", Host: "127.0.0.1", Port: p}, Routes: routes}
		srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: b.TempDir(),
			Name: "n" + strconv.Itoa(i+1), Base: base, Sync: natsserver.SyncPolicy{Interval: 10 * time.Second}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
		urls = append(urls, srv.ClientURL())
	}
	return urls
}

// BenchmarkShardedIngest measures, on one in-process 3-node cluster, the aggregate rate at which R3
// FPM streams store FPMs published asynchronously by 3 publishers (one per node, 300 keys) — with one
// stream, then with 3 shards whose leaders are spread over the nodes — and reports both and their
// ratio. Run it alone: go test -run '^$' -bench ShardedIngest -benchtime 1x ./streams/
func BenchmarkShardedIngest(b *testing.B) {
	urls := startCluster(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var conns []*nats.Conn
	var jss []jetstream.JetStream
	for _, u := range urls {
		nc, err := nats.Connect(u)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		conns, jss = append(conns, nc), append(jss, js)
	}
	// JetStream is usable once the cluster elected its meta leader.
	for deadline := time.Now().Add(60 * time.Second); ; {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := jss[0].AccountInfo(actx)
		acancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("no JetStream on the cluster after 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	const window = 5 * time.Second
	keys := make([]streams.Key, 300)
	for i := range keys {
		keys[i] = streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w" + strconv.Itoa(i/8), DPRank: i % 8}
	}
	body := []byte(`{"version":1,"worker_id":"w","dp_rank":0,"counter_id":1,"wall_time":0.025,"scheduled_requests":{"num_prefill_requests":2,"sum_prefill_tokens":256},"queued_requests":{}}`)
	rates := map[int]float64{}
	for _, n := range []int{1, 3} {
		cfg := streams.DefaultConfig()
		cfg.Replicas = 3
		leaders := map[string]int{}
		for i := range n {
			s, err := jss[0].CreateStream(ctx, cfg.FPMShardStream(i, n))
			if err != nil {
				b.Fatal(err)
			}
			leaders[s.CachedInfo().Cluster.Leader]++
		}
		// Spread the leaders: step a shard down while its node leads another one.
		for try := 0; len(leaders) < n && try < 20; try++ {
			for i := range n {
				info, err := jss[0].Stream(ctx, streams.ShardStreamName(i))
				if err != nil {
					b.Fatal(err)
				}
				if leaders[info.CachedInfo().Cluster.Leader] > 1 {
					_, _ = conns[0].Request("$JS.API.STREAM.LEADER.STEPDOWN."+streams.ShardStreamName(i), nil, 5*time.Second)
					time.Sleep(500 * time.Millisecond)
					break
				}
			}
			leaders = map[string]int{}
			for i := range n {
				info, _ := jss[0].Stream(ctx, streams.ShardStreamName(i))
				leaders[info.CachedInfo().Cluster.Leader]++
			}
		}
		var acked atomic.Int64
		start := time.Now()
		done := make(chan error, len(jss))
		for p, js := range jss {
			go func() {
				var id int
				for time.Since(start) < window {
					k := keys[(id*len(jss)+p)%len(keys)]
					id++
					m := &nats.Msg{Subject: streams.ShardIngestSubject(k, n), Header: nats.Header{}, Data: body}
					m.Header.Set(streams.HeaderMsgID, fmt.Sprintf("p%d-%d", p, id))
					f, err := js.PublishMsgAsync(m)
					if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
						continue // 4096 awaiting acks: the streams are the bottleneck, as measured
					}
					if err != nil {
						done <- err
						return
					}
					go func() {
						select {
						case <-f.Ok():
							acked.Add(1)
						case <-f.Err():
						}
					}()
				}
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(30 * time.Second):
				}
				done <- nil
			}()
		}
		for range jss {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		rates[n] = float64(acked.Load()) / elapsed.Seconds()
		b.Logf("%d shard(s), leaders %v: %d FPMs stored in %v: %.0f FPM/s", n, leaders, acked.Load(), elapsed.Round(time.Millisecond), rates[n])
		for i := range n {
			if err := jss[0].DeleteStream(ctx, streams.ShardStreamName(i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(rates[1], "fpm/s-1shard")
	b.ReportMetric(rates[3], "fpm/s-3shards")
	b.ReportMetric(rates[3]/rates[1], "ratio-3/1")
	fmt.Printf("sharded ingest on a 3-node cluster: 1 shard %.0f FPM/s, 3 shards %.0f FPM/s, ratio %.2f\n", rates[1], rates[3], rates[3]/rates[1])
}

// The shard count is the server's: Ensure and NewPlan create the shards a declared count asks for on a
// new server, report the server's count to components that declare none, and refuse a count other
// than the server's (ErrShardMismatch naming both) without changing anything.
func TestEnsureShardCount(t *testing.T) {
	withShards := func(n int) streams.Config {
		c := streams.DefaultConfig()
		c.FPMShards = n
		return c
	}
	t.Run("new server, 3 declared", func(t *testing.T) {
		env := emptyServer(t)
		r, err := streams.Ensure(t.Context(), env.JS, withShards(3), quiet)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"FPM_0", "FPM_1", "FPM_2", streams.StreamEvents, streams.StreamBench}
		if !reflect.DeepEqual(r.Created, want) || r.FPMShards != 3 {
			t.Fatalf("created %v with %d shards, want %v with 3", r.Created, r.FPMShards, want)
		}
		for i := range 3 {
			md := info(t, env.JS, streams.ShardStreamName(i)).Config.Metadata
			if md[streams.MetaFPMShards] != "3" || md[streams.MetaFPMShard] != strconv.Itoa(i) {
				t.Fatalf("shard %d metadata %v", i, md)
			}
		}
		if _, err := env.JS.Stream(t.Context(), streams.StreamFPM); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("stream FPM next to the shards: %v", err)
		}
		// A component declaring nothing uses the server's count and creates nothing.
		r, err = streams.Ensure(t.Context(), env.JS, streams.DefaultConfig(), quiet)
		if err != nil || r.FPMShards != 3 || len(r.Created) != 0 || len(r.Differences) != 0 {
			t.Fatalf("undeclared: %+v, %v; want 3 shards, nothing created or different", r, err)
		}
		if n, err := streams.DiscoverFPMShards(t.Context(), env.JS); n != 3 || err != nil {
			t.Fatalf("discovered %d, %v", n, err)
		}
		p, err := streams.NewPlan(t.Context(), env.JS, streams.DefaultConfig())
		if err != nil || p.FPMShards != 3 || !reflect.DeepEqual(p.Lines(), []string{"FPM_0 unchanged", "FPM_1 unchanged", "FPM_2 unchanged",
			"FPM_EVENTS unchanged", "FPM_BENCH unchanged"}) {
			t.Fatalf("plan %+v %v, %v", p, p.Lines(), err)
		}
	})
	t.Run("new server, nothing declared", func(t *testing.T) {
		env := emptyServer(t)
		r, err := streams.Ensure(t.Context(), env.JS, streams.DefaultConfig(), quiet)
		if err != nil || r.FPMShards != 1 || r.Created[0] != streams.StreamFPM {
			t.Fatalf("%+v, %v: want stream FPM, 1 shard", r, err)
		}
	})
	mismatch := map[string]struct {
		have, declare int
		want          string
	}{
		"3 shards on the server, 2 declared":    {3, 2, "3 shard(s) (streams FPM_0 … FPM_2), --fpm-shards asks for 2"},
		"stream FPM on the server, 3 declared":  {1, 3, "1 shard(s) (stream FPM), --fpm-shards asks for 3"},
		"3 shards on the server, 1 declared":    {3, 1, "3 shard(s) (streams FPM_0 … FPM_2), --fpm-shards asks for 1"},
		"2 shards on the server, 64 declared":   {2, 64, "2 shard(s) (streams FPM_0 … FPM_1), --fpm-shards asks for 64"},
		"stream FPM on the server, 2 declared ": {1, 2, "1 shard(s) (stream FPM), --fpm-shards asks for 2"},
	}
	for name, tc := range mismatch {
		t.Run(name, func(t *testing.T) {
			env := emptyServer(t)
			if err := streams.Apply(t.Context(), env.JS, withShards(tc.have)); err != nil {
				t.Fatal(err)
			}
			before := streamNames(t, env.JS)
			_, err := streams.Ensure(t.Context(), env.JS, withShards(tc.declare), quiet)
			if !errors.Is(err, streams.ErrShardMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ensure: %v, want ErrShardMismatch saying %q", err, tc.want)
			}
			if _, err := streams.NewPlan(t.Context(), env.JS, withShards(tc.declare)); !errors.Is(err, streams.ErrShardMismatch) {
				t.Fatalf("NewPlan: %v, want ErrShardMismatch", err)
			}
			if after := streamNames(t, env.JS); !reflect.DeepEqual(after, before) {
				t.Fatalf("streams %v after the refusal, %v before", after, before)
			}
		})
	}
}

func streamNames(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var out []string
	for name := range js.StreamNames(t.Context()).Name() {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
