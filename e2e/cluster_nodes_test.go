package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster nodes as real processes: the shipped ops/nats/cluster/n<i>.conf, copied with its loopback
// ports and store directory replaced by the test's, loaded by nats-server's own config loader in a
// process of its own (this test binary re-run with clusterNodeEnv set, see TestMain), so that a node
// can be stopped, SIGKILLed, paused (SIGSTOP) and restarted on its store as a real nats-server would be.

// clusterNodeEnv names the configuration file a node process runs.
const clusterNodeEnv = "FPMBUS_E2E_CLUSTER_NODE"

// runClusterNode runs the node whose configuration file clusterNodeEnv names until SIGTERM, printing
// "READY <url>" once it accepts clients.
func runClusterNode(conf string) {
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster node:", err)
		os.Exit(1)
	}
	opts.NoSigs = true
	ns, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster node:", err)
		os.Exit(1)
	}
	ns.ConfigureLogger() // to stderr, which the test shows when the node fails to start
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "cluster node: not ready after 30s")
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("READY", ns.ClientURL())
	<-sig
	ns.Shutdown()
	ns.WaitForShutdown()
	os.Exit(0)
}

// shippedPorts are the loopback ports ops/nats/cluster uses: client, monitoring, cluster, per node.
var shippedPorts = [3][3]int{{4222, 8222, 6222}, {4223, 8223, 6223}, {4224, 8224, 6224}}

// includeLine matches an active include (the shipped files carry it commented out; a permissions
// include needs credentials the components here do not present, so the copy runs without it).
var includeLine = regexp.MustCompile(`(?m)^\s*include\s.*$`)

// clusterConfigs copies n1..n3.conf of ops/nats/cluster into dir with every shipped port replaced by a
// free loopback port, each store under dir, any active include removed, and route pings every second
// (two missed pings close a route: a node paused for a few seconds is cut off from the others, as a
// network partition would cut it). It returns the copies' paths and the nodes' client URLs.
func clusterConfigs(t testing.TB, dir string) (confs, urls []string) {
	t.Helper()
	var ports [3][3]int
	taken := map[int]bool{}
	for i := range ports {
		for j := range ports[i] {
			for ports[i][j] = freePort(t); taken[ports[i][j]]; ports[i][j] = freePort(t) {
			}
			taken[ports[i][j]] = true
		}
	}
	for i := range 3 {
		raw, err := os.ReadFile(fmt.Sprintf("../ops/nats/cluster/n%d.conf", i+1))
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		for n := range shippedPorts {
			for j, old := range shippedPorts[n] {
				text = strings.ReplaceAll(text, fmt.Sprintf("127.0.0.1:%d", old), fmt.Sprintf("127.0.0.1:%d", ports[n][j]))
			}
		}
		store := fmt.Sprintf("/var/lib/nats/n%d", i+1)
		if !strings.Contains(text, store) {
			t.Fatalf("n%d.conf no longer stores in %s: update clusterConfigs", i+1, store)
		}
		text = strings.ReplaceAll(text, store, filepath.Join(dir, fmt.Sprintf("store-n%d", i+1)))
		text = includeLine.ReplaceAllString(text, "# (include removed by the test)")
		text += "\nping_interval: \"1s\"\nping_max: 2\n"
		conf := filepath.Join(dir, fmt.Sprintf("n%d.conf", i+1))
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		confs = append(confs, conf)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i][0]))
	}
	return confs, urls
}

// lockedBuffer is a node's log, written by its process and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// clusterNode is one node process; start may be called again after it stopped (same config, same store).
type clusterNode struct {
	t    testing.TB
	name string
	conf string
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs the node and waits until it accepts clients.
func (n *clusterNode) start() {
	n.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clusterNodeEnv+"="+n.conf)
	var logs lockedBuffer
	cmd.Stderr = &logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		n.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan struct{})
	ready := make(chan struct{}, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- struct{}{}
			}
		}
		_ = cmd.Wait()
	}()
	n.cmd, n.done = cmd, done
	select {
	case <-ready:
	case <-done:
		n.t.Fatalf("%s exited before it was ready:\n%s", n.name, logs.String())
	case <-time.After(30 * time.Second):
		n.t.Fatalf("%s not ready after 30s:\n%s", n.name, logs.String())
	}
}

// stop sends SIGTERM (a clean shutdown) and waits for the process to exit.
func (n *clusterNode) stop() {
	n.t.Helper()
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		n.t.Fatalf("%s did not stop within 30s", n.name)
	}
}

// signal sends sig (SIGSTOP, SIGCONT) to the running node.
func (n *clusterNode) signal(sig syscall.Signal) {
	n.t.Helper()
	if err := n.cmd.Process.Signal(sig); err != nil {
		n.t.Fatalf("%s: %v: %v", n.name, sig, err)
	}
}

// kill9 sends SIGKILL (also to a paused node) and waits for the process to be gone (idempotent).
func (n *clusterNode) kill9() {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// processCluster is n1..n3 running as processes.
type processCluster struct {
	nodes []*clusterNode
	url   string // every node's client URL, comma-separated
}

// startProcessCluster starts the three shipped nodes and waits until JetStream answers on the cluster.
func startProcessCluster(t testing.TB) *processCluster {
	t.Helper()
	confs, urls := clusterConfigs(t, t.TempDir())
	c := &processCluster{url: strings.Join(urls, ",")}
	for i, conf := range confs {
		n := &clusterNode{t: t, name: fmt.Sprintf("n%d", i+1), conf: conf, url: urls[i]}
		t.Cleanup(n.kill9)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		n.start()
	}
	// JetStream answers once the nodes have elected a meta leader.
	js := jsClient(t, c.url)
	eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
	return c
}

// node returns the node named name (n1..n3).
func (c *processCluster) node(t testing.TB, name string) *clusterNode {
	t.Helper()
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	t.Fatalf("%q is not a node of the cluster", name)
	return nil
}

// streamLeader waits until stream has a leader and returns its node.
func (c *processCluster) streamLeader(t testing.TB, js jetstream.JetStream, stream string) *clusterNode {
	t.Helper()
	var leader string
	eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		leader = info.Cluster.Leader
		return nil
	})
	return c.node(t, leader)
}
