package seal

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// cluster is three embedded JetStream servers in one process, routed on loopback, with the R3 bucket
// FPM_DATASETS.
type cluster struct {
	servers []*server.Server
	urls    []string
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

func startCluster(t testing.TB) *cluster {
	t.Helper()
	dir := t.TempDir()
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	c := &cluster{}
	for i := range 3 {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			NoSigs:     true,
			NoLog:      true,
			Cluster: server.ClusterOpts{
				Name: "fpmbus-test",
				Host: "127.0.0.1",
				Port: ports[i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatalf("server %d not ready", i+1)
		}
		c.servers = append(c.servers, ns)
		c.urls = append(c.urls, ns.ClientURL())
	}
	t.Cleanup(c.stop)
	// Wait for a JetStream meta leader, then create the R3 bucket.
	nc := c.connect(t, 0)
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, Replicas: 3, History: 64})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create R3 bucket: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c
}

// connect returns a client of server i that knows every server (it fails over when i stops).
func (c *cluster) connect(t testing.TB, i int) *nats.Conn {
	t.Helper()
	urls := append([]string{c.urls[i%3]}, c.urls...)
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (c *cluster) stop() {
	for _, s := range c.servers {
		s.Shutdown()
	}
	for _, s := range c.servers {
		s.WaitForShutdown()
	}
}

// stepDown asks the bucket's stream leader to step down.
func stepDown(nc *nats.Conn) error {
	_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN.KV_"+streams.BucketDatasets, nil, 5*time.Second)
	return err
}

// bucketLeader names the server leading KV_FPM_DATASETS.
func bucketLeader(ctx context.Context, js jetstream.JetStream) string {
	s, err := js.Stream(ctx, "KV_"+streams.BucketDatasets)
	if err != nil {
		return ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}
