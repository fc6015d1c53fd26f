package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// The same configurations on the real nats-server binary, the version fpmbus embeds (built by
// `./taskw tools:nats-server`, found through FPMBUS_NATS_SERVER_BIN).

// startNatsServers runs the real nats-server on each configuration and waits until every node accepts
// clients and the account's JetStream answers (on a cluster: once it has elected its meta leader).
func startNatsServers(t *testing.T, confs, urls []string, passwords map[string]string) *opsServer {
	t.Helper()
	bin := natsServerBin(t)
	var nodes []*proc
	for i, conf := range confs {
		nodes = append(nodes, start(t, fmt.Sprintf("nats-server %d", i+1), bin, "-c", conf))
	}
	for _, u := range urls {
		eventually(t, 20*time.Second, func() error {
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "nats://"), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	srv := &opsServer{url: strings.Join(urls, ","), passwords: passwords, nodes: nodes}
	op := srv.client(t, "operator")
	eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := op.js.AccountInfo(ctx)
		return err
	})
	return srv
}

// Every partitioned group as its users on single.conf, on a server without streams (the components
// create what they need): a trace writer group of two processes over two
// partitions (one producer each), a gap detector group of two processes over two partitions, a merger
// and a sealer over two partitions each. Every FPM is traced exactly once across the two writers, the
// gap is reported, the benchmark run is merged and sealed, every component stops cleanly, and no
// component was refused anything.
func TestOpsPartitionedGroupsOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	store := t.TempDir()
	conf, url, passwords := opsSingleConf(t, store)
	srv := startNatsServers(t, []string{conf}, []string{url}, passwords)
	// No `streams apply`: the components create the streams and buckets they find missing; the predict
	// service starts first and creates FPM_DATASETS.
	predict := srv.start(t, "predict", "predict", "predict-service")
	predict.waitOutput("predict service ready", 30*time.Second)

	// Two producers, one per partition of the trace writers' group (keyed by worker id).
	tcfg := trace.DefaultConfig()
	tcfg.Partitions = 2
	pc, err := tcfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	var workers []string
	for i := 0; len(workers) < 2; i++ {
		w := "part-w" + strconv.Itoa(i)
		p, err := pc.PartitionOf(streams.FPMSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: w, DPRank: len(workers)}))
		if err != nil {
			t.Fatal(err)
		}
		if p == len(workers) {
			workers = append(workers, w)
		}
	}

	dir := t.TempDir()
	base := producertest.FreeBasePort(t, "", 2)
	bridge := srv.start(t, "bridge", "bridge", "bridge", "--fpm-port", strconv.Itoa(base), "--dp-size", "2")
	components := []*proc{predict, bridge}
	group := func(p *proc) {
		p.waitOutput("consumer running", 30*time.Second)
		components = append(components, p)
	}
	outs := []string{filepath.Join(dir, "a", "fpm"), filepath.Join(dir, "b", "fpm")}
	for i, m := range []string{"a", "b"} {
		group(srv.start(t, "trace", "trace "+m, "trace", "--partitions", "2", "--member-id", m, "--trace-mode", "full", "--trace-output", outs[i]))
	}
	for _, m := range []string{"g1", "g2"} {
		group(srv.start(t, "gaps", "gaps "+m, "gaps", "--gaps-partitions", "2", "--stale-after", "1h", "--marker-grace", "1s"))
	}
	group(srv.start(t, "merge", "merge", "merge", "--merge-partitions", "2", "--merge-member-id", "m1", "--bench-output", filepath.Join(dir, "merged_{run_id}.json")))
	group(srv.start(t, "seal", "seal", "seal", "--seal-partitions", "2", "--seal-member-id", "s1"))
	bridge.waitOutput("bridge ready", 30*time.Second)

	// Both writers are members before the first FPM: each is assigned, and takes, one partition.
	op := srv.client(t, "operator")
	members, err := op.js.KeyValue(t.Context(), partition.MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a", "b"} {
		if _, err := members.Get(t.Context(), streams.StreamFPM+"."+tcfg.Group+"."+m); err != nil {
			t.Fatalf("trace writer %s is not a member of %s: %v", m, tcfg.Group, err)
		}
	}

	const perWorker = 30
	var pubs []*producertest.Scripted
	for r, w := range workers {
		p := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base+r), 0, false, w, r)
		p.WaitSubscribed()
		pubs = append(pubs, p)
	}
	for i := range perWorker {
		for r, p := range pubs {
			if r == 1 && i == 10 {
				p.Skip()
			}
			p.Send(false)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitStreamCount(t, op.js, streams.StreamFPM, 2*perWorker, 30*time.Second)

	profile := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e-part","version":"1","hardware":"H200-SXM"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.run(t, "operator", append([]string{"bench", "publish", "--profile", profile}, goldenRanks(t)...)...)

	eventually(t, 30*time.Second, func() error {
		var rep gaps.Report
		if err := json.Unmarshal([]byte(srv.run(t, "gaps", "gaps", "report", "--json")), &rep); err != nil {
			return err
		}
		got := map[string][2]uint64{}
		for _, p := range rep.Publishers {
			got[p.Key.WorkerID] = [2]uint64{p.GapsTotal, p.MissingTotal}
		}
		if want := map[string][2]uint64{workers[0]: {0, 0}, workers[1]: {1, 1}}; !reflect.DeepEqual(got, want) {
			return fmt.Errorf("gaps, missing by worker: %v, want %v", got, want)
		}
		return nil
	})
	kv, err := op.js.KeyValue(t.Context(), streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		keys, err := kv.Keys(t.Context())
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, schemas.CellKeyPrefix) }) {
			return errors.New("no sealed cell yet")
		}
		return nil
	})
	if n := len(streamsMessages(t, op.js, streams.StreamBench, streams.BenchMergedWildcard)); n != 1 {
		t.Fatalf("%d merged artefacts, want 1", n)
	}

	for _, p := range slices.Backward(components) {
		if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", p.name, err, p.Output())
		}
	}
	seen := map[string]int{}
	for i, out := range outs {
		lines := traceLines(t, out+".*.jsonl.gz")
		if len(lines) != perWorker {
			t.Fatalf("writer %d wrote %d lines, want the %d of one producer", i, len(lines), perWorker)
		}
		for _, l := range lines {
			seen[string(l.Event.FPM)]++
		}
	}
	if len(seen) != 2*perWorker {
		t.Fatalf("%d distinct FPMs traced, want %d", len(seen), 2*perWorker)
	}
	for _, name := range []string{"FPM_PART_fpm-trace", "FPM_PART_fpm-gaps", "FPM_BENCH_PART_fpmbus-merge", "FPM_BENCH_PART_fpmbus-seal"} {
		if _, err := op.js.Stream(t.Context(), name); err != nil {
			t.Fatalf("partition stream %s: %v", name, err)
		}
	}
	if v := srv.violations(); len(v) > 0 {
		t.Fatalf("the server refused the components %d times:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// The 3-node cluster of ops/nats/cluster, every node including permissions.conf: the operator applies
// R3 streams, the bridge (its user) stores FPMs on the three nodes, and the reader is refused deleting
// the stream. (The durable consumers run on the cluster as they do on one node; on a cluster's first
// start one can exit while a bucket it has just created elects its leader — see ops/README.md — so
// their permissions are tested on single.conf above.)
func TestOpsClusterOnTheRealNatsServer(t *testing.T) {
	t.Parallel()
	confs, urls, passwords := opsClusterConfs(t)
	srv := startNatsServers(t, confs, urls, passwords)
	// Right after the nodes start, the cluster may refuse three replicas for a moment (a node has not
	// reported its JetStream yet); streams apply waits for the placement, as it does for an operator.
	srv.run(t, "operator", "streams", "apply", "--replicas", "3")

	base := producertest.FreeBasePort(t, "", 1)
	bridge := srv.start(t, "bridge", "bridge", "bridge", "--fpm-port", strconv.Itoa(base), "--dp-size", "1")
	bridge.waitOutput("bridge ready", 30*time.Second)
	pub := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", base), 0, false, "cluster-w", 0)
	pub.WaitSubscribed()
	pub.SendN(50, time.Millisecond)
	op := srv.client(t, "operator")
	waitStreamCount(t, op.js, streams.StreamFPM, 50, 30*time.Second)
	s, err := op.js.Stream(t.Context(), streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(t.Context())
	if err != nil || info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("FPM: %v %+v: want 3 replicas, a leader and two followers", err, info)
	}

	c := srv.client(t, "reader")
	if err := c.nc.Publish("$JS.API.STREAM.DELETE.FPM", nil); err != nil {
		t.Fatal(err)
	}
	if msg, ok := c.refused("$JS.API.STREAM.DELETE.FPM", 5*time.Second); !ok {
		t.Fatal("the reader was not refused deleting FPM")
	} else {
		t.Log("reader:", msg)
	}
	if err := bridge.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge: %v", err)
	}
	if n, err := streamCount(t, op.js, streams.StreamFPM); err != nil || n != 50 {
		t.Fatalf("FPM holds %d messages (%v), want 50", n, err)
	}
	for _, line := range srv.violations() {
		if !strings.Contains(line, `"FPMBUS/user:reader"`) {
			t.Fatalf("the server refused something besides the reader's delete: %s", line)
		}
	}
}

// The cluster nodes include the same permissions.conf as single.conf: with the include enabled, each
// node's configuration has exactly single.conf's users, with the same permissions.
func TestOpsClusterNodesHaveTheSingleNodeUsers(t *testing.T) {
	t.Parallel()
	single, _, _ := opsSingleConf(t, t.TempDir())
	want, err := natsserver.LoadServerConfig(single)
	if err != nil {
		t.Fatal(err)
	}
	confs, _, _ := opsClusterConfs(t)
	byName := func(o []*serverUser) map[string]*serverUser {
		m := map[string]*serverUser{}
		for _, u := range o {
			m[u.Username] = u
		}
		return m
	}
	wantUsers := byName(want.Users)
	if len(wantUsers) != len(opsRoles) {
		t.Fatalf("single.conf has %d users, permissions.conf %d", len(wantUsers), len(opsRoles))
	}
	for _, conf := range confs {
		o, err := natsserver.LoadServerConfig(conf)
		if err != nil {
			t.Fatal(err)
		}
		got := byName(o.Users)
		if len(got) != len(wantUsers) {
			t.Fatalf("%s: %d users, single.conf %d", conf, len(got), len(wantUsers))
		}
		for name, w := range wantUsers {
			u := got[name]
			if u == nil || !reflect.DeepEqual(u.Permissions, w.Permissions) || u.Account.Name != w.Account.Name {
				t.Fatalf("%s: user %s differs from single.conf's", conf, name)
			}
		}
	}
}
