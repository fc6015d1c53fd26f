package seal

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Kill -9 of JetStream nodes, for real: each node is a process of its own (this test binary re-run
// with nodeEnv set, see TestMain), so SIGKILL leaves its files exactly as a crashed nats-server
// would (what it wrote is in the page cache; nothing is flushed or closed).

// nodeEnv carries a nodeConfig (JSON) to a node process.
const nodeEnv = "FPMBUS_SEAL_TEST_NODE"

// nodeConfig is one node. Conf names a shipped cluster configuration (ops/nats/cluster/n<i>.conf),
// whose name, sync policy and limits are kept and whose addresses and store are replaced by the test's;
// without Conf the node is fpmbus's embedded server (natsserver.StartServer, the one `fpmbus up` runs).
type nodeConfig struct {
	Conf        string   `json:"conf,omitempty"`
	Store       string   `json:"store"`
	Port        int      `json:"port"`
	ClusterPort int      `json:"cluster_port,omitempty"`
	Routes      []string `json:"routes,omitempty"`
}

// runNode runs the node nodeEnv describes until SIGTERM (or SIGKILL), printing "READY <url>" once it
// accepts clients.
func runNode() {
	var c nodeConfig
	if err := json.Unmarshal([]byte(os.Getenv(nodeEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, "node config:", err)
		os.Exit(2)
	}
	var ns *server.Server
	if c.Conf == "" {
		srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:" + strconv.Itoa(c.Port), StoreDir: c.Store})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		ns = srv.NATS()
	} else {
		opts, err := server.ProcessConfigFile(c.Conf)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort = "127.0.0.1", c.Port, "", 0
		opts.StoreDir = c.Store
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", c.ClusterPort
		opts.Routes = server.RoutesFromStr(strings.Join(c.Routes, ","))
		opts.NoSigs, opts.NoLog = true, true
		if !opts.SyncAlways {
			fmt.Fprintln(os.Stderr, c.Conf, "does not set sync_interval: always")
			os.Exit(1)
		}
		if ns, err = server.NewServer(opts); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go ns.Start()
		if !ns.ReadyForConnections(20 * time.Second) {
			fmt.Fprintln(os.Stderr, "not ready")
			os.Exit(1)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("READY", ns.ClientURL())
	<-sig
	ns.Shutdown()
	ns.WaitForShutdown()
	os.Exit(0)
}

// node is a running node process.
type node struct {
	t    testing.TB
	cfg  nodeConfig
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

// startNode starts cfg as a process and waits until it accepts clients.
func startNode(t testing.TB, cfg nodeConfig) *node {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, cfg: cfg, cmd: cmd, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		defer close(n.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if url, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- url
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(n.kill9)
	select {
	case n.url = <-ready:
	case <-n.done:
		t.Fatalf("node %s exited before it was ready", raw)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s not ready after 30s", raw)
	}
	return n
}

// kill9 sends SIGKILL and waits for the process to be gone (idempotent).
func (n *node) kill9() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// eventually retries f until it returns nil or d passes.
func eventually(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// killFixture is what a kill -9 test stores before the kill and checks after the restart: acknowledged
// FPMs on stream FPM, events on FPM_EVENTS, benchmark artefacts on FPM_BENCH, and a sealed dataset
// (cells and campaign record in FPM_DATASETS, a KV bucket like the gap detector's state).
type killFixture struct {
	fpms, events, artefacts int
	ds                      *schemas.Dataset
}

func storeFixture(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue) *killFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := &killFixture{fpms: 500, events: 20, artefacts: 4}
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 0}
	for i := range f.fpms {
		m := nats.NewMsg(streams.FPMSubject(k))
		m.Data = []byte(`{"counter_id":` + strconv.Itoa(i) + `}`)
		m.Header.Set(streams.HeaderMsgID, streams.MsgID(k, 1, uint64(i)))
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range f.events {
		m := nats.NewMsg(streams.GapEventSubject(k))
		m.Data = []byte(`{"event_seq":` + strconv.Itoa(i) + `}`)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	for r := range f.artefacts {
		m := nats.NewMsg(streams.BenchRankSubject("run-A", r))
		m.Data = []byte(`{"rank":` + strconv.Itoa(r) + `}`)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishes not acknowledged")
	}
	if n := js.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d publishes pending", n)
	}
	var cells []schemas.Cell
	for i := range 20 {
		cells = append(cells, testCell(i, "run-A", 1, 4))
	}
	f.ds = testDataset("run-A", cells...)
	s, _ := NewSealer(kv, WithSource("before-kill"))
	if _, err := s.PublishDataset(ctx, f.ds, PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

// check asserts that everything storeFixture stored is there, and that first writer wins still holds.
func (f *killFixture) check(t *testing.T, js jetstream.JetStream, kv jetstream.KeyValue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for name, want := range map[string]int{streams.StreamFPM: f.fpms, streams.StreamEvents: f.events, streams.StreamBench: f.artefacts} {
		eventually(t, 60*time.Second, "stream "+name+" after the restart", func() error {
			actx, acancel := context.WithTimeout(ctx, 3*time.Second)
			defer acancel()
			s, err := js.Stream(actx, name)
			if err != nil {
				return err
			}
			if st := s.CachedInfo().State; st.Msgs != uint64(want) || st.LastSeq != uint64(want) {
				return fmt.Errorf("%s holds %d messages (last seq %d), want %d", name, st.Msgs, st.LastSeq, want)
			}
			return nil
		})
	}
	// readEntry from the leader: a replica still catching up may answer a direct get from its past.
	leaderGet := func(key string, v any) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		m, err := natsconn.LastMsgFromLeader(ctx, js, "KV_"+streams.BucketDatasets, "$KV."+streams.BucketDatasets+"."+key)
		if err != nil {
			return err
		}
		return json.Unmarshal(m.Data, v)
	}
	for _, c := range f.ds.Cells {
		var v schemas.SealedCell
		if err := leaderGet(c.Key, &v); err != nil || v.Provenance.RunID != "run-A" || v.Provenance.DatasetDigest != c.Provenance.DatasetDigest {
			t.Fatalf("sealed cell %s after the restart: %+v %v", c.Key, v, err)
		}
	}
	var camp schemas.Campaign
	if err := leaderGet(CampaignKey(CampaignIDFor(f.ds)), &camp); err != nil || camp.State != schemas.CampaignComplete {
		t.Fatalf("campaign record after the restart: %+v %v", camp, err)
	}
	s, _ := NewSealer(kv, WithSource("after-kill"), withJetStream(js))
	rep, err := s.Audit(ctx)
	if err != nil || rep.Checked != len(f.ds.Cells) || len(rep.Findings) != 0 {
		t.Fatalf("audit after the restart: %+v %v", rep, err)
	}
	// A competing run loses to the seal made before the kill (retried while the cluster still answers
	// 503 to some requests, as the sealer consumer retries an unknown outcome).
	eventually(t, 30*time.Second, "a competing run after the restart", func() error {
		_, err := s.PublishDataset(ctx, testDataset("run-B", testCell(0, "run-B", 1.5, 4)), PublishOptions{})
		var cs *conflictsError
		if errors.As(err, &cs) && len(cs.Conflicts) == 1 && !cs.Conflicts[0].Missing && cs.Conflicts[0].Sealed.RunID == "run-A" {
			return nil
		}
		return fmt.Errorf("want a conflict with run-A's seal, got %v", err)
	})
}

// TestKill9EmbeddedServerKeepsWhatItAcknowledged: fpmbus's embedded server (the single node of
// `fpmbus up`) is SIGKILLed after acknowledging FPMs, events and seals; restarted on the same store it
// holds every one of them.
func TestKill9EmbeddedServerKeepsWhatItAcknowledged(t *testing.T) {
	t.Parallel()
	cfg := nodeConfig{Store: t.TempDir(), Port: natsservertest.FreePort(t)}
	n := startNode(t, cfg)
	js, kv := killTestClient(t, n.url, 1)
	f := storeFixture(t, js, kv)
	n.kill9()
	n = startNode(t, cfg)
	f.check(t, js, kv)
}

// killCluster is three node processes on the shipped cluster configuration.
type killCluster struct {
	cfgs  []nodeConfig
	nodes []*node
	js    jetstream.JetStream
	kv    jetstream.KeyValue
}

// startKillCluster starts n1..n3 of ops/nats/cluster (their own ports and stores), R3 streams and bucket.
func startKillCluster(t *testing.T) *killCluster {
	t.Helper()
	dir := t.TempDir()
	c := &killCluster{nodes: make([]*node, 3)}
	var routes []string
	ports := natsservertest.FreePorts(t, 6)
	for i := range 3 {
		c.cfgs = append(c.cfgs, nodeConfig{Conf: fmt.Sprintf("../../ops/nats/cluster/n%d.conf", i+1), Store: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			Port: ports[2*i], ClusterPort: ports[2*i+1]})
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", c.cfgs[i].ClusterPort))
	}
	urls := make([]string, 3)
	for i := range c.cfgs {
		c.cfgs[i].Routes = append(append([]string{}, routes[:i]...), routes[i+1:]...)
		c.nodes[i] = startNode(t, c.cfgs[i])
		urls[i] = c.nodes[i].url
	}
	c.js, c.kv = killTestClient(t, strings.Join(urls, ","), 3)
	return c
}

// bucketLeader is the index of the node leading FPM_DATASETS's stream.
func (c *killCluster) bucketLeader(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leader := bucketLeader(ctx, c.js)
	for i := range c.cfgs {
		if fmt.Sprintf("n%d", i+1) == leader {
			return i
		}
	}
	t.Fatalf("bucket leader %q is not one of n1..n3", leader)
	return -1
}

// waitBucketLeader waits until FPM_DATASETS's stream has a leader that answers.
func (c *killCluster) waitBucketLeader(t *testing.T, key string) {
	t.Helper()
	start := time.Now()
	eventually(t, 3*time.Minute, "the bucket's leader answers", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := natsconn.LastMsgFromLeader(ctx, c.js, "KV_"+streams.BucketDatasets, "$KV."+streams.BucketDatasets+"."+key)
		return err
	})
	t.Logf("the bucket's leader answered %v after the restart", time.Since(start).Round(100*time.Millisecond))
}

// TestKill9TwoOfThreeClusterNodes: on the shipped 3-node cluster configuration (ops/nats/cluster,
// sync_interval always, R3 streams and bucket), the bucket's leader and one other node are SIGKILLed
// at once after everything was acknowledged; restarted, the cluster holds every FPM, event, artefact
// and sealed cell, the audit finds nothing missing and a competing run still loses.
func TestKill9TwoOfThreeClusterNodes(t *testing.T) {
	t.Parallel()
	c := startKillCluster(t)
	f := storeFixture(t, c.js, c.kv)
	leader := c.bucketLeader(t)
	victims := []int{leader, (leader + 1) % 3}
	t.Logf("SIGKILL n%d (bucket leader) and n%d at once", victims[0]+1, victims[1]+1)
	for _, i := range victims {
		_ = c.nodes[i].cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, i := range victims {
		c.nodes[i].kill9() // waits until it is gone
	}
	for _, i := range victims {
		c.nodes[i] = startNode(t, c.cfgs[i])
	}
	// Direct gets are answered by any replica; wait until the bucket's stream has a leader again.
	c.waitBucketLeader(t, f.ds.Cells[0].Key)
	f.check(t, c.js, c.kv)
}

// TestClusterNodeLosesItsDisk: the bucket's leader is SIGKILLed and its store deleted; it comes back
// empty under its name, the cluster still holds everything, and the other replicas bring every stream
// and the bucket back to it (a current replica, lag 0, or the leader).
func TestClusterNodeLosesItsDisk(t *testing.T) {
	t.Parallel()
	c := startKillCluster(t)
	f := storeFixture(t, c.js, c.kv)
	lost := c.bucketLeader(t)
	c.nodes[lost].kill9()
	if err := os.RemoveAll(c.cfgs[lost].Store); err != nil {
		t.Fatal(err)
	}
	t.Logf("n%d (bucket leader) killed and its store deleted", lost+1)
	c.nodes[lost] = startNode(t, c.cfgs[lost])
	name := fmt.Sprintf("n%d", lost+1)
	for _, stream := range []string{streams.StreamFPM, streams.StreamEvents, streams.StreamBench, "KV_" + streams.BucketDatasets} {
		eventually(t, 3*time.Minute, name+" current on "+stream, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			s, err := c.js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			ci := s.CachedInfo().Cluster
			if ci == nil {
				return fmt.Errorf("%s: no cluster info", stream)
			}
			if ci.Leader == name {
				return nil
			}
			for _, r := range ci.Replicas {
				if r.Name == name && r.Current && r.Lag == 0 {
					return nil
				}
			}
			return fmt.Errorf("%s: %s not a current replica: leader %s, replicas %+v", stream, name, ci.Leader, ci.Replicas)
		})
	}
	c.waitBucketLeader(t, f.ds.Cells[0].Key)
	f.check(t, c.js, c.kv)
}

// killTestClient connects to url (reconnecting forever, so it follows the restarts), applies fpmbus's
// streams with replicas and opens FPM_DATASETS, retrying until JetStream has a leader.
func killTestClient(t *testing.T, url string, replicas int) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	scfg := streams.DefaultConfig()
	scfg.Replicas = replicas
	var kv jetstream.KeyValue
	eventually(t, 60*time.Second, "streams and bucket created", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := streams.Apply(ctx, js, scfg); err != nil {
			return err
		}
		kv, err = OpenBucket(ctx, js, scfg)
		return err
	})
	return js, kv
}
