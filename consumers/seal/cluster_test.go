package seal

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// cluster is a 3-node in-process cluster (natsservertest.Cluster) with the R3 bucket FPM_DATASETS.
type cluster struct{ *natsservertest.Cluster }

func startCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{natsservertest.StartCluster(t)}
	_, js := c.Connect(0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, Replicas: 3, History: 64})
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("create R3 bucket: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// connect returns a client of server i mod 3 that knows every server (it fails over when i stops).
func (c *cluster) connect(_ testing.TB, i int) *nats.Conn {
	nc, _ := c.Connect(i % 3)
	return nc
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
