package natsservertest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/freeport"
)

// Cluster is three embedded JetStream servers in one process, routed on loopback, each tagged
// node:n<i> (OnNode places a stream on one of them) and each restartable on its own store with its
// client port kept, so that clients reconnect to a restarted node. The test's cleanup stops them.
type Cluster struct {
	t       testing.TB
	opts    []*server.Options
	Servers []*server.Server // nil while a node is stopped
	URLs    []string
}

// StartCluster starts the three nodes and waits until JetStream has a meta leader.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return StartClusterWith(t, nil)
}

// StartClusterWith is StartCluster with every node's options changed by change first (nil: none),
// for example its sync policy.
func StartClusterWith(t testing.TB, change func(*server.Options)) *Cluster {
	t.Helper()
	dir := t.TempDir()
	ports := FreePorts(t, 6) // distinct: a port given twice would keep a node from listening
	var routes []string
	c := &Cluster{t: t}
	for i := range 3 {
		rp := ports[2*i+1]
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", rp))
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[2*i], // fixed: clients reconnect to a restarted node
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			NoSigs:     true,
			NoLog:      true,
			Tags:       jwt.TagList{fmt.Sprintf("node:n%d", i+1)},
			Cluster:    server.ClusterOpts{Name: "fpmbus-test", Host: "127.0.0.1", Port: rp},
		})
		c.URLs = append(c.URLs, fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port))
	}
	c.Servers = make([]*server.Server, 3)
	for i, o := range c.opts {
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		if change != nil {
			change(o)
		}
		c.Start(i)
	}
	t.Cleanup(func() {
		for i := range c.Servers {
			c.Stop(i)
		}
	})
	_, js := c.Connect(0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no JetStream meta leader after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Start runs node i (again, on its store).
func (c *Cluster) Start(i int) {
	c.t.Helper()
	o := *c.opts[i]
	ns, err := server.NewServer(&o)
	if err != nil {
		c.t.Fatal(err)
	}
	go ns.Start()
	// As long as the meta leader may take: a node recovering its store on a loaded 2-core machine
	// (other test packages running) was seen to need more than 10 s.
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		c.t.Fatalf("n%d not ready after 30s%s", i+1, takenPorts(o.Port, o.Cluster.Port))
	}
	c.Servers[i] = ns
}

// takenPorts names which of a node's ports something else holds (the usual reason a node never gets
// ready), as ", client port 4222 taken: …"; "" when both can be bound.
func takenPorts(client, route int) string {
	var taken string
	for _, p := range []struct {
		what string
		port int
	}{{"client", client}, {"route", route}} {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)))
		if err != nil {
			taken += fmt.Sprintf(", %s port %d taken: %v", p.what, p.port, err)
			continue
		}
		l.Close()
	}
	return taken
}

// Stop shuts node i down (idempotent).
func (c *Cluster) Stop(i int) {
	if ns := c.Servers[i]; ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		c.Servers[i] = nil
	}
}

// Connect returns a client of node i that knows every node (it fails over when i stops); the test's
// cleanup closes it.
func (c *Cluster) Connect(i int) (*nats.Conn, jetstream.JetStream) {
	c.t.Helper()
	urls := append([]string{c.URLs[i]}, c.URLs...)
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.Name(c.t.Name()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	return nc, js
}

// OnNode places a stream on node n<i+1> alone.
func OnNode(i int) *jetstream.Placement {
	return &jetstream.Placement{Tags: []string{fmt.Sprintf("node:n%d", i+1)}}
}

// FreePorts returns n distinct loopback TCP ports (internal/freeport): below the kernel's ephemeral
// range, so a node killed and restarted keeps its ports, which no outgoing connection can take meanwhile.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	return freeport.Ports(t, n)
}

// FreePort is one port as FreePorts gives them.
func FreePort(t testing.TB) int {
	t.Helper()
	return freeport.Ports(t, 1)[0]
}
