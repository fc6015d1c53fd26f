package durable_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// fpmCounter is a fifth consumer: it counts the FPMs of each worker. A count is all it keeps and it
// need not survive the instance, so a message is done as soon as it is counted; a stage that writes
// would call Done once what it wrote is durable.
type fpmCounter struct {
	perWorker map[string]int
	left      int           // messages still expected
	all       chan struct{} // closed when none is left
}

func (c *fpmCounter) Handle(_ context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		k, err := streams.ParseFPMSubject(m.Subject())
		if err != nil {
			m.Reject(err) // never succeeds: dead-lettered, the others go on
			continue
		}
		c.perWorker[k.WorkerID]++
		m.Done()
		if c.left--; c.left == 0 {
			close(c.all)
		}
	}
	return nil
}

func (c *fpmCounter) Tick(context.Context, time.Time) error { return nil }
func (c *fpmCounter) Close(context.Context) error           { return nil }

// A consumer of stream FPM is a durable.Consumer run by a Runner in a group: the runner joins the
// group (FPMGroup: one partition per FPM shard, hot standbys in other instances), hands the messages
// over in order, acks what is done, dead-letters what is rejected and stops gracefully.
func Example() {
	js, stop := startJetStream() // an in-process JetStream server with fpmbus's streams
	defer stop()
	for i, worker := range []string{"w1", "w1", "w2", "w1", "w2"} {
		k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker}
		if _, err := js.Publish(context.Background(), streams.FPMSubject(k), fmt.Appendf(nil, "fpm %d", i)); err != nil {
			panic(err)
		}
	}

	c := &fpmCounter{perWorker: map[string]int{}, left: 5, all: make(chan struct{})}
	cfg := durable.Config{Name: "fpm-count", Group: durable.FPMGroup("fpm-count"),
		Logger: slog.New(slog.DiscardHandler)}
	r, err := durable.New(cfg, js, c, durable.WithMemberID("example"))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-c.all
	cancel() // a graceful stop: everything counted is acked
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println("w1:", c.perWorker["w1"], "w2:", c.perWorker["w2"])
	// Output: w1: 3 w2: 2
}

// startJetStream starts an in-process server with fpmbus's streams, as natsservertest does for tests.
func startJetStream() (jetstream.JetStream, func()) {
	dir, err := os.MkdirTemp("", "durable-example")
	if err != nil {
		panic(err)
	}
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: dir,
		Sync: natsserver.SyncPolicy{Interval: natsserver.ServerDefaultSyncInterval}})
	if err != nil {
		panic(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	if err := streams.Apply(context.Background(), js, streams.DefaultConfig()); err != nil {
		panic(err)
	}
	return js, func() {
		nc.Close()
		_ = srv.Shutdown(context.Background())
		_ = os.RemoveAll(dir)
	}
}
