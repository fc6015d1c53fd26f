package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Cluster nodes as real processes: the real nats-server binary (the version fpmbus embeds, built by
// `./taskw tools:nats-server`, found through FPMBUS_NATS_SERVER_BIN) on the shipped
// ops/nats/cluster/n<i>.conf, copied with its loopback ports and store directory replaced by the
// test's, so that a node can be stopped, SIGKILLed, paused (SIGSTOP) and restarted on its store.

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
	bin  string // nats-server
	conf string
	url  string
	cmd  *exec.Cmd
	done chan struct{}
	logs *lockedBuffer // the current run's output
}

// start runs the node and waits until it accepts clients.
func (n *clusterNode) start() {
	n.t.Helper()
	cmd := exec.Command(n.bin, "-c", n.conf)
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	n.cmd, n.done, n.logs = cmd, done, &logs
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(n.url, "nats://"), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			n.t.Fatalf("%s exited before it was ready:\n%s", n.name, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("%s not ready after 30s:\n%s", n.name, logs.String())
		}
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
// It skips the test when the real nats-server binary is not installed (natsServerBin).
func startProcessCluster(t testing.TB) *processCluster {
	t.Helper()
	bin := natsServerBin(t)
	confs, urls := clusterConfigs(t, t.TempDir())
	c := &processCluster{url: strings.Join(urls, ",")}
	for i, conf := range confs {
		n := &clusterNode{t: t, name: fmt.Sprintf("n%d", i+1), bin: bin, conf: conf, url: urls[i]}
		t.Cleanup(func() {
			n.kill9()
			if t.Failed() && n.logs != nil {
				t.Logf("--- log of %s (last run):\n%s", n.name, n.logs.String())
			}
		})
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
