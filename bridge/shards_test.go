package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// shardWorkers returns, for each rank r < n, a worker id whose key (worker, r) lives in shard r of n:
// the test's publishers then cover every shard.
func shardWorkers(n int) []string {
	out := make([]string, n)
	for r := range n {
		for i := 0; ; i++ {
			w := "w-" + strconv.Itoa(i)
			if streams.ShardOf(fpmKey(w, r), n) == r {
				out[r] = w
				break
			}
		}
	}
	return out
}

// With the server's FPMs in 3 shards, a bridge fed over real ZMQ stores every FPM exactly once, in its
// key's shard (ShardOf), under its fpm. subject with the bridge's headers, in publication order; a
// core subscriber on fpm.> (`nats sub 'fpm.>'`) sees each of them; no stream FPM is created. The
// lost_after_ack check at the next start reads each key's own shard: a shard emptied by its limits is
// no loss, FPMs deleted from another shard are reported exactly.
func TestShardedIngestOverZMQ(t *testing.T) {
	t.Parallel()
	const n, perRank = 3, 300
	env := natsservertest.StartShards(t, n)
	ctx := t.Context()
	sub, err := env.NC.SubscribeSync(streams.FPMWildcard)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	workers := shardWorkers(n)
	pubs := make([]*testPub, n)
	eps := make([]Endpoint, n)
	for r := range n {
		pubs[r] = newTestPub(t, "tcp://127.0.0.1:*")
		eps[r] = Endpoint{URL: pubs[r].URL, DPRank: r}
	}
	h := startBridge(t, env, eps, func(c *Config) { c.BridgeID = "bridge-1" })
	for r, p := range pubs {
		p.waitSubscribed()
		for seq := range uint64(perRank) {
			p.send(seq, payload(workers[r], r, seq))
		}
	}
	h.waitStats(20*time.Second, "every FPM published", func(s stats) bool { return s.Total().Published == n*perRank })
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := env.JS.Stream(ctx, streams.StreamFPM); err == nil {
		t.Fatalf("stream %s exists next to the shards", streams.StreamFPM)
	}
	ids := map[string]bool{}
	for i := range n {
		msgs := messages(t, env.JS, streams.ShardStreamName(i), ">")
		if len(msgs) != perRank {
			t.Fatalf("shard %d holds %d FPMs, want %d (one publisher's)", i, len(msgs), perRank)
		}
		for j, m := range msgs {
			k, err := streams.ParseFPMSubject(m.Subject())
			if err != nil {
				t.Fatalf("shard %d: %v", i, err)
			}
			if got := streams.ShardOf(k, n); got != i || k != fpmKey(workers[i], i) {
				t.Fatalf("shard %d holds %s (shard %d)", i, m.Subject(), got)
			}
			if seq := hdrUint(t, m, streams.HeaderSeq); seq != uint64(j) {
				t.Fatalf("shard %d message %d has Fpm-Seq %d: out of order", i, j, seq)
			}
			want, err := schemas.DecodeFPM(payload(workers[i], i, uint64(j)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Data(), want.JSON) {
				t.Fatalf("shard %d message %d body %s\nwant %s", i, j, m.Data(), want.JSON)
			}
			id := m.Headers().Get(streams.HeaderMsgID)
			if id == "" || ids[id] {
				t.Fatalf("shard %d message %d: message id %q empty or seen before", i, j, id)
			}
			ids[id] = true
		}
	}
	seen := map[streams.Key]int{}
	for range n * perRank {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("core subscriber on %s got %d FPMs: %v", streams.FPMWildcard, len(seen), err)
		}
		k, err := streams.ParseFPMSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		seen[k]++
	}
	for r := range n {
		if got := seen[fpmKey(workers[r], r)]; got != perRank {
			t.Fatalf("core subscriber saw %d FPMs of %s, want %d", got, fpmKey(workers[r], r), perRank)
		}
	}

	// Shard 0 loses everything to its limits (its first sequence moves past its messages), shard 1's
	// publisher loses its newest 10 FPMs behind the bridge's back.
	s0, err := env.JS.Stream(ctx, streams.ShardStreamName(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := s0.Purge(ctx, jetstream.WithPurgeSequence(s0.CachedInfo().State.LastSeq+1)); err != nil {
		t.Fatal(err)
	}
	lostKey := fpmKey(workers[1], 1)
	s1, err := env.JS.Stream(ctx, streams.FPMStreamOf(lostKey, n))
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		m, err := s1.GetLastMsgForSubject(ctx, streams.FPMSubject(lostKey))
		if err != nil {
			t.Fatal(err)
		}
		if err := s1.DeleteMsg(ctx, m.Sequence); err != nil {
			t.Fatal(err)
		}
	}
	startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1"}}, func(c *Config) { c.BridgeID = "bridge-2" })
	evs := lostEvents(t, env.JS)
	if len(evs) != 1 {
		t.Fatalf("%d lost_after_ack events, want 1 (shard 1's publisher): %+v", len(evs), evs)
	}
	ev := evs[0]
	if ev.Key != lostKey || ev.Missing != 10 || ev.FirstMissing == nil || *ev.FirstMissing != perRank-10 ||
		ev.Evidence.StreamFirstSeq != 1 || ev.Evidence.StreamLastSeq != perRank || ev.Evidence.StoredLastStreamSeq != perRank-10 {
		t.Fatalf("lost_after_ack event %+v, want %s's sequences %d-%d", ev, lostKey, perRank-10, perRank-1)
	}
	if want := fmt.Sprintf("no longer in stream %s", streams.FPMStreamOf(lostKey, n)); !strings.Contains(ev.Evidence.Summary, want) {
		t.Fatalf("summary %q does not name the shard (%q)", ev.Evidence.Summary, want)
	}
}

// The edge topology needs one central stream FPM: a central server with FPM shards is refused with
// ErrEdgeShards (Failed, once the central server answers), the central shards are left without a
// source of the edge, and an edge declared with shards is refused at start.
func TestEdgeRefusesCentralShards(t *testing.T) {
	t.Parallel()
	t.Cleanup(func() { natsservertest.WaitSourceSetups(t, 40*time.Second) })
	const n = 3
	central := newCentral(t)
	cnc, err := nats.Connect(central.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	cjs, err := jetstream.New(cnc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	scfg := streams.DefaultConfig()
	scfg.FPMShards = n
	if _, err := streams.Ensure(ctx, cjs, scfg, testLogger()); err != nil {
		t.Fatal(err)
	}
	ecfg := edgenode.EdgeConfig{Node: "node1", StoreDir: t.TempDir(), Remotes: "nats-leaf://" + central.leafAddr,
		Listen: "127.0.0.1:0", Sync: natsserver.SyncPolicy{Interval: time.Second}}
	if _, err := StartEdge(ecfg, scfg, testLogger()); !errors.Is(err, ErrEdgeShards) {
		t.Fatalf("an edge declared with %d shards: %v, want ErrEdgeShards", n, err)
	}
	edge, err := StartEdge(ecfg, streams.Config{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Close(context.Background()) })
	select {
	case err := <-edge.Failed():
		if !errors.Is(err, ErrEdgeShards) {
			t.Fatalf("edge failed with %v, want ErrEdgeShards", err)
		}
	case <-edge.Sourced():
		t.Fatal("the central shards source the edge")
	case <-ctx.Done():
		t.Fatal("the edge neither refused the central shards nor was sourced within 30s")
	}
	for _, name := range append(streams.FPMStreamNames(n), streams.StreamEvents) {
		s, err := cjs.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if src := s.CachedInfo().Config.Sources; len(src) != 0 {
			t.Fatalf("central %s sources %v", name, src)
		}
	}
	if _, err := cjs.Stream(ctx, streams.StreamFPM); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("central stream FPM next to the shards: %v", err)
	}
}
