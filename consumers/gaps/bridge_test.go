package gaps

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/bridge"
	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// These tests run the real pipeline: a Dynamo-like ZMQ publisher (libzmq XPUB, so a test can wait
// for the bridge's subscription), the real bridge, a real JetStream server and the detector.

// pipeline is a bridge on env for one publisher endpoint.
type pipeline struct {
	t      testing.TB
	env    *natsservertest.Env
	b      *bridge.Bridge
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

func startPipelineBridge(t testing.TB, env *natsservertest.Env, endpoint string, mutate func(*bridge.Config)) *pipeline {
	t.Helper()
	nc, err := natsconn.Connect(natsconn.ConnConfig{URL: env.Server.ClientURL(), Name: "gaps-test-bridge"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := bridge.Config{Endpoints: []bridge.Endpoint{{URL: endpoint, DPRank: 0}}, BridgeID: "test-bridge", Logger: testLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := bridge.New(cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pipeline{t: t, env: env, b: b, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- b.Run(ctx) }()
	t.Cleanup(func() { p.stop(); nc.Close() })
	select {
	case <-b.Ready():
	case err := <-p.done:
		t.Fatalf("bridge stopped before ready: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("bridge not ready")
	}
	return p
}

func (p *pipeline) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatal("bridge did not stop")
	}
}

// waitAccounted waits until the bridge has published or dropped (with a marker) all n received.
func (p *pipeline) waitAccounted(n uint64) bridge.RankStats {
	p.t.Helper()
	var r bridge.RankStats
	checkFor(p.t, 60*time.Second, 10*time.Millisecond, func() error {
		s := p.b.Stats()
		r = s.Ranks[0]
		if r.Received != n || r.Published+r.Dropped != n || s.Buffered != 0 || s.InFlight != 0 {
			return errors.New("bridge has not accounted for every message yet")
		}
		return nil
	})
	return r
}

func checkRanges(t testing.TB, k streams.Key, evs []Event, cause string, want [][2]uint64) {
	t.Helper()
	var got [][2]uint64
	for _, e := range evs {
		if e.Type != TypeGap || e.Cause != cause {
			t.Fatalf("%s: unexpected event %s (%s)", k, e.ID, e.Cause)
		}
		got = append(got, [2]uint64{*e.FirstMissing, *e.LastMissing})
		if e.Missing != *e.LastMissing-*e.FirstMissing+1 {
			t.Fatalf("event %s: missing %d", e.ID, e.Missing)
		}
	}
	equal(t, want, got, "gap ranges of "+k.String())
}

// TestPipelineZMQDrop: a publisher with a tiny send high-water mark bursts faster than its pipe to
// the bridge drains; the numbers libzmq refused never reach the bridge, no marker covers them, and
// each run of them is one zmq_drop event.
func TestPipelineZMQDrop(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := producertest.NewScripted(t, "tcp://127.0.0.1:*", 1, true, "w", 0)
	pl := startPipelineBridge(t, env, pub.Endpoint(), nil)
	pub.WaitSubscribed()
	cfg := testConfig()
	h := startDetector(t, env.Server.ClientURL(), cfg)

	pub.SendN(10, 5*time.Millisecond)
	for try := 0; try == 0 || len(pub.Lost()) == 0 && try < 20; try++ {
		pub.SendN(2000, 0) // the pipe holds one message: much of a burst is refused
		time.Sleep(100 * time.Millisecond)
	}
	check(t, len(pub.Lost()) > 0, "no ZMQ drop forced")
	time.Sleep(200 * time.Millisecond)
	// A tail that gets through closes every gap (a refused tail number is lost like any other).
	for ok, n := false, 0; !ok || n < 3; n++ {
		ok = pub.Send(false)
		time.Sleep(20 * time.Millisecond)
	}
	sent := pub.Sent()
	r := pl.waitAccounted(sent - uint64(len(pub.Lost())))
	equal(t, uint64(0), r.Dropped, "bridge drops")

	k := key("w", 0)
	want := producertest.Runs(pub.Lost())
	by := waitEvents(t, env.JS, len(want), 30*time.Second)
	checkRanges(t, k, by[k], CauseZMQDrop, want)
	equal(t, sent, delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	equal(t, float64(len(pub.Lost())), h.metric("fpmbus_gaps_missing_messages_total", "cause", CauseZMQDrop))
	t.Logf("sent %d, lost %d in %d gaps", sent, len(pub.Lost()), len(want))
}

// TestPipelineBrokerOutage: the broker goes away while the publisher keeps sending; the bridge
// buffers up to MaxBuffer, drops the rest with drop markers published once the broker is back, and
// every dropped run is one bridge_drop event citing its markers.
func TestPipelineBrokerOutage(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	u, _ := url.Parse(env.Server.ClientURL())
	addr, store := u.Host, env.StoreDir
	pub := producertest.NewScripted(t, "tcp://127.0.0.1:*", 0, false, "w", 0)
	pl := startPipelineBridge(t, env, pub.Endpoint(), func(c *bridge.Config) {
		c.MaxBuffer = 50
		c.AckTimeout = time.Second
	})
	pub.WaitSubscribed()
	cfg := testConfig()
	cfg.MarkerGrace = 2 * time.Second
	h := startDetector(t, env.Server.ClientURL(), cfg)

	pub.SendN(100, time.Millisecond)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if pl.b.Stats().Ranks[0].Published < 100 {
			return errors.New("first 100 not published")
		}
		return nil
	})
	env.Stop()
	pub.SendN(300, 2*time.Millisecond) // 50 are buffered, the rest dropped
	env2 := natsservertest.StartAt(t, addr, store)
	time.Sleep(1500 * time.Millisecond) // the bridge reconnects and publishes buffer and markers
	pub.SendN(10, 5*time.Millisecond)
	sent := pub.Sent()
	r := pl.waitAccounted(sent)
	check(t, r.Dropped > 0, "nothing dropped during the outage")

	k := key("w", 0)
	var dropped []uint64
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		dropped = dropped[:0]
		for _, m := range natsservertest.Messages(t, env2.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
			dm, err := streams.ParseDropMarker(m.Data())
			if err != nil {
				return err
			}
			for q := dm.FirstSeq; q <= dm.LastSeq; q++ {
				dropped = append(dropped, q)
			}
		}
		if uint64(len(dropped)) != r.Dropped {
			return errors.New("markers not all stored yet")
		}
		return nil
	})
	want := producertest.Runs(dropped)
	by := waitEvents(t, env2.JS, len(want), 30*time.Second)
	checkRanges(t, k, by[k], CauseBridgeDrop, want)
	for _, e := range by[k] {
		check(t, len(e.Evidence.Markers) > 0 && e.Evidence.Markers[0].Reason == "buffer_full", "evidence %+v", e.Evidence)
	}
	equal(t, sent, delivered(t, env2.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	equal(t, float64(r.Dropped), h.metric("fpmbus_gaps_missing_messages_total", "cause", CauseBridgeDrop))
	t.Logf("sent %d, bridge dropped %d in %d gaps", sent, r.Dropped, len(want))
}

// TestPipelinePublisherRestart: the publisher process restarts (a new socket on the same port,
// numbering from 0 again); the bridge starts a new epoch and the detector reports one
// publisher_restart event saying how far the old run got.
func TestPipelinePublisherRestart(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := producertest.NewScripted(t, "tcp://127.0.0.1:*", 0, false, "w", 0)
	endpoint := pub.Endpoint()
	pl := startPipelineBridge(t, env, endpoint, nil)
	pub.WaitSubscribed()
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	pub.SendN(50, time.Millisecond)
	pl.waitAccounted(50)
	pub.Close()

	pub2 := producertest.NewScripted(t, endpoint, 0, false, "w", 0)
	pub2.WaitSubscribed()
	pub2.SendN(30, time.Millisecond)
	pl.waitAccounted(80)

	k := key("w", 0)
	by := waitEvents(t, env.JS, 1, 20*time.Second)
	match(t, k, by[k], want{TypeGap, CausePublisherRestart, -1, -1, 0, -1})
	e := by[k][0]
	check(t, e.Evidence.OldRun.LastSeq == 49 && e.Evidence.OldRun.Messages == 50 && *e.Evidence.NewRunFirstSeq == 0 &&
		e.Before.Epoch < e.After.Epoch && e.Before.Seq == 49 && e.After.Seq == 0, "restart event %+v", e)
	equal(t, uint64(80), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	equal(t, 1.0, h.metric("fpmbus_gaps_events_total", "cause", CausePublisherRestart))
}

// TestPipelineReconnectFurtherOn: the publisher restarts and its new run had sent more numbers by the
// time the bridge was connected again than the old run sent in all, so the sequence never goes back.
// The bridge saw its connection end and a new one begin and starts a new run; the detector names
// every number of the new run before the first received (cause reconnect, under the new run's epoch)
// instead of a jump in the old run that would leave the new run's first numbers unnamed.
func TestPipelineReconnectFurtherOn(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := producertest.NewScripted(t, "tcp://127.0.0.1:*", 0, false, "w", 0)
	endpoint := pub.Endpoint()
	pl := startPipelineBridge(t, env, endpoint, nil)
	pub.WaitSubscribed()
	h := startDetector(t, env.Server.ClientURL(), testConfig())
	pub.SendN(10, time.Millisecond)
	pl.waitAccounted(10)
	pub.Close()

	pub2 := producertest.NewScripted(t, endpoint, 0, false, "w", 0)
	for range 25 {
		pub2.Skip() // sent before the bridge was connected again
	}
	pub2.WaitSubscribed()
	pub2.SendN(15, time.Millisecond)
	pl.waitAccounted(25)

	k := key("w", 0)
	by := waitEvents(t, env.JS, 1, 20*time.Second)
	match(t, k, by[k], want{TypeGap, causeReconnect, 0, 24, 25, -1})
	e := by[k][0]
	check(t, e.Evidence.OldRun.LastSeq == 9 && *e.Evidence.NewRunFirstSeq == 25 && e.Before.Epoch < e.After.Epoch && e.Epoch == e.After.Epoch,
		"reconnect event %+v", e)
	equal(t, pub.Sent()+pub2.Sent(), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	equal(t, 25.0, h.metric("fpmbus_gaps_missing_messages_total", "cause", causeReconnect))
}

// TestPipelineSilentPublisher: a publisher that stops sending, heartbeats included, is stale once the
// detector has heard nothing from it for --stale-after; when it sends again (without restarting) a
// resumed event closes the period, with the silence measured in the publisher's observed times. The
// detector's clock is a skewedClock: the silence is the test moving it.
func TestPipelineSilentPublisher(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := producertest.NewScripted(t, "tcp://127.0.0.1:*", 0, false, "w", 0)
	pl := startPipelineBridge(t, env, pub.Endpoint(), nil)
	pub.WaitSubscribed()
	cfg := testConfig()
	cfg.StaleAfter = time.Hour
	clock := &skewedClock{}
	h := startDetector(t, env.Server.ClientURL(), cfg, durable.WithClock(clock.now))
	for i := range 6 {
		pub.Send(i%3 == 2) // busy passes and heartbeats
	}
	pl.waitAccounted(6)
	waitApplied(t, h, 6)
	clock.advance(cfg.StaleAfter)
	k := key("w", 0)
	by := waitEvents(t, env.JS, 1, 10*time.Second)
	match(t, k, by[k], want{typeStale, CauseStale, -1, -1, 0, -1})
	equal(t, 1.0, h.metric("fpmbus_gaps_stale_publishers"))
	pub.SendN(3, 10*time.Millisecond)
	pl.waitAccounted(9)
	by = waitFirstEvents(t, env.JS, 2, 10*time.Second)
	match(t, k, by[k], want{typeStale, CauseStale, -1, -1, 0, -1}, want{typeResumed, CauseStale, -1, -1, 0, 0})
	e := by[k][1]
	check(t, e.Before.Seq == 5 && e.After.Seq == 6 && e.Evidence.SilentMs == e.After.ObservedAtMs-e.Before.ObservedAtMs, "resumed %+v", e)
	equal(t, uint64(9), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing != sent")
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	equal(t, 2.0, h.metric("fpmbus_gaps_heartbeats_total"))
}
