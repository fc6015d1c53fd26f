// Package natsservertest starts a real embedded JetStream server for tests: loopback, a random port, a
// store under t.TempDir(), fpmbus's streams applied. Cleanup closes the connection and stops the server.
package natsservertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// Env is one running test server and a client on it.
type Env struct {
	Server   *natsserver.Server
	StoreDir string
	NC       *nats.Conn
	JS       jetstream.JetStream
}

// Start runs a server with streams.DefaultConfig applied.
func Start(t testing.TB) *Env {
	t.Helper()
	return StartAt(t, "127.0.0.1:0", t.TempDir())
}

// StartAt runs a server on listen with the given store dir (reuse both to simulate a restart).
//
// The server fsyncs in the background (nats-server's default interval), not before every ack as
// fpmbus's embedded server does by default (natsserver.DefaultSync): these tests are about behaviour, and
// no test survives a power cut either; a process kill or a graceful restart loses nothing under either
// policy. The tests about durability start their servers with the policy they measure or ship.
func StartAt(t testing.TB, listen, storeDir string) *Env {
	t.Helper()
	return start(t, listen, storeDir, streams.DefaultConfig())
}

// StartShards runs a server whose FPMs are spread over n shard streams FPM_0 … FPM_<n-1> (no stream
// FPM), the other streams as Start makes them.
func StartShards(t testing.TB, n int) *Env {
	t.Helper()
	cfg := streams.DefaultConfig()
	cfg.FPMShards = n
	return start(t, "127.0.0.1:0", t.TempDir(), cfg)
}

func start(t testing.TB, listen, storeDir string, cfg streams.Config) *Env {
	t.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: listen, StoreDir: storeDir,
		Sync: natsserver.SyncPolicy{Interval: natsserver.ServerDefaultSyncInterval}})
	if err != nil {
		t.Fatalf("start embedded server: %v", err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		_ = srv.Shutdown(context.Background())
		t.Fatalf("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Apply(ctx, js, cfg); err != nil {
		t.Fatalf("apply streams: %v", err)
	}
	e := &Env{Server: srv, StoreDir: storeDir, NC: nc, JS: js}
	t.Cleanup(e.Stop)
	return e
}

// Stop closes the client and shuts the server down; safe to call twice.
func (e *Env) Stop() {
	if e.NC != nil {
		e.NC.Close()
		e.NC = nil
	}
	if e.Server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Server.Shutdown(ctx)
		e.Server = nil
	}
}

// Messages fetches every message of stream on subject filter (">" for all) with an ordered consumer.
func Messages(t testing.TB, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if filter != "" && filter != ">" {
		cfg.FilterSubjects = []string{filter}
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		t.Fatalf("ordered consumer: %v", err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n > 0 {
			continue
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatalf("consumer info: %v", err)
		}
		if ci.NumPending == 0 {
			return out
		}
	}
}

// LastStoredFor is the sequence of the last message on stream that a consumer with cfg's filters
// takes (0: none). A wait for a consumer to be done needs it: the server counts a message as pending
// for a consumer a moment after its publish is acked, so "nothing pending, nothing unacked" can be
// read before the last publish reached the consumer; an ack floor at this sequence cannot.
func LastStoredFor(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		return s.CachedInfo().State.LastSeq, nil
	}
	var last uint64
	for _, f := range filters {
		m, err := s.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}
