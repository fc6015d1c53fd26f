package gaps

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// toShards routes msgs as a bridge does with n shards: each to its key's shard ingest subject.
func toShards(t testing.TB, n int, msgs []*nats.Msg) []*nats.Msg {
	t.Helper()
	for _, m := range msgs {
		k, err := streams.ParseFPMSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		m.Subject = streams.FPMPublishSubject(k, n)
	}
	return msgs
}

// The scripted publishers of TestDetectorClassifiesScriptedStreams, stored in 3 shards: the detector
// (one partition per shard, each reading its shard directly) reports exactly what it reports on one
// stream, delivered + missing == sent per publisher. Killed and restarted with more FPMs stored
// meanwhile (its state reloaded, each publisher caught up from its own shard), it reports only the new
// gap. The partitions are keyed by worker_id, as the shards: two ranks of one worker share a
// partition and are still told apart.
func TestDetectorOverThreeShards(t *testing.T) {
	t.Parallel()
	const n = 3
	env := natsservertest.StartShards(t, n)
	t0 := time.Now().UnixMilli()
	kb, kz, kr, kd, kn := key("bridge", 0), key("zmq", 1), key("restart", 0), key("dup", 0), key("newbridge", 2)
	kz4 := key("zmq", 4) // kz's worker, another rank
	shardsUsed := map[int]bool{}
	for _, k := range []streams.Key{kb, kz, kr, kd, kn, kz4} {
		shardsUsed[streams.ShardOf(k, n)] = true
	}
	if len(shardsUsed) < 2 {
		t.Fatalf("the test's publishers all live in one shard")
	}
	var msgs []*nats.Msg
	msgs = append(msgs, fpms(kb, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kb, 15, 30, t0, t0+200)...)
	msgs = append(msgs, fpms(kz, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kz, 13, 19, t0, t0+100)...)
	msgs = append(msgs, fpms(kz, 21, 25, t0, t0+200)...)
	msgs = append(msgs, fpms(kz4, 0, 5, t0, t0)...)
	msgs = append(msgs, fpms(kz4, 8, 10, t0, t0+100)...)
	msgs = append(msgs, fpms(kr, 0, 39, t0, t0)...)
	msgs = append(msgs, fpms(kr, 0, 9, t0+1000, t0+1000)...)
	msgs = append(msgs, fpms(kd, 0, 5, t0, t0)...)
	dup := fpmMsg(kd, 5, t0, t0+50, false, "test-bridge")
	dup.Header.Set(streams.HeaderMsgID, "retry-5")
	msgs = append(msgs, dup, fpmMsg(kd, 7, t0, t0+70, false, "test-bridge"), fpmMsg(kd, 6, t0, t0+60, false, "test-bridge"))
	msgs = append(msgs, fpms(kd, 8, 10, t0, t0+80)...)
	dup3 := fpmMsg(kd, 3, t0, t0+30, false, "test-bridge")
	dup3.Header.Set(streams.HeaderMsgID, "retry-3")
	msgs = append(msgs, dup3)
	msgs = append(msgs, fpms(kn, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(kn, 10, 19, t0+500, t0+500)...)
	publishAll(t, env.JS, toShards(t, n, msgs)...)
	// The bridge's drop marker for kb's gap is stored with the FPMs, before the detector starts: the
	// marker grace counts in stream time from the FPM that reveals the gap, which a loaded machine
	// could let pass before a marker published after the start is stored.
	publishAll(t, env.JS, markerMsg(kb, t0, 10, 14, "buffer_full"))

	// Plain advances are acked but not checkpointed: after the kill below, the restarted detector must
	// read them from each publisher's own shard (catch-up) before applying what comes next.
	first := testConfig()
	first.CheckpointInterval = time.Hour
	h := startDetector(t, env.Server.ClientURL(), first)

	by := waitEvents(t, env.JS, 5, 20*time.Second)
	match(t, kb, by[kb], gapW(CauseBridgeDrop, 10, 14))
	match(t, kz, by[kz], gapW(CauseZMQDrop, 10, 12), gapW(CauseZMQDrop, 20, 20))
	match(t, kz4, by[kz4], gapW(CauseZMQDrop, 6, 7))
	match(t, kr, by[kr], want{TypeGap, CausePublisherRestart, -1, -1, 0, -1})
	match(t, kd, by[kd])
	match(t, kn, by[kn])

	cfg := testConfig()
	cfg.FPMShards = n
	pc := cfg.PartitionConfig()
	for p := range n {
		if got := pc.ConsumerStreamOf(p); got != streams.ShardStreamName(p) {
			t.Fatalf("partition %d reads %s, want shard %s", p, got, streams.ShardStreamName(p))
		}
		consumerDone(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if _, err := env.JS.Stream(context.Background(), "FPM_PART_"+defaultGroup); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the detector made a partition stream over the shards: %v", err)
	}
	for _, k := range []streams.Key{kb, kz, kr, kd, kn, kz4} {
		if got := cfg.PartitionOf(k); got != streams.ShardOf(k, n) {
			t.Fatalf("%s: partition %d, shard %d", k, got, streams.ShardOf(k, n))
		}
	}
	sent := map[streams.Key]uint64{kb: 31, kz: 26, kr: 50, kd: 11, kn: 20, kz4: 11}
	for k, want := range sent {
		seen := map[string]bool{}
		for _, m := range natsservertest.Messages(t, env.JS, streams.FPMStreamOf(k, n), streams.FPMSubject(k)) {
			seen[m.Headers().Get(streams.HeaderMsgID)] = true
		}
		d := uint64(len(seen))
		if k == kd {
			d -= 2 // the two retries stored twice
		}
		equal(t, want, d+missingOf(by[k]), k.String()+": delivered + missing != sent")
	}

	// Killed and restarted: kb goes on with 31..32 lost, kz and kn go on without a gap, all stored while
	// no detector runs.
	h.kill()
	var more []*nats.Msg
	more = append(more, fpms(kb, 33, 40, t0, t0+400)...)
	more = append(more, fpms(kz, 26, 35, t0, t0+400)...)
	more = append(more, fpms(kn, 20, 29, t0+500, t0+700)...)
	publishAll(t, env.JS, toShards(t, n, more)...)
	startDetector(t, env.Server.ClientURL(), testConfig())
	by = waitEvents(t, env.JS, 6, 20*time.Second)
	match(t, kb, by[kb], gapW(CauseBridgeDrop, 10, 14), gapW(CauseZMQDrop, 31, 32))
	match(t, kz, by[kz], gapW(CauseZMQDrop, 10, 12), gapW(CauseZMQDrop, 20, 20))
	match(t, kz4, by[kz4], gapW(CauseZMQDrop, 6, 7))
	for p := range n {
		consumerDone(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	time.Sleep(500 * time.Millisecond) // a false gap would need the marker grace to be reported
	if evs := storedEvents(t, env.JS); len(evs) != 6 {
		t.Fatalf("%d events after the restart, want 6: %v", len(evs), summarizeAll(evs))
	}
}

// The detector's direct reads of a publisher's FPMs (catch-up after a reload, the stale check) go to
// the publisher's shard: each key's FPMs are found there, in order, by shard sequence.
func TestStoreReadsEachPublishersShard(t *testing.T) {
	t.Parallel()
	const n = 3
	env := natsservertest.StartShards(t, n)
	t0 := time.Now().UnixMilli()
	cfg := testConfig()
	cfg.FPMShards = n
	s := &stateStore{js: env.JS, cfg: cfg}
	if err := s.open(context.Background()); err != nil {
		t.Fatal(err)
	}
	keys := []streams.Key{key("bridge", 0), key("bridge", 1), key("bridge", 2)} // shards 1, 0, 2
	var msgs []*nats.Msg
	for _, k := range keys {
		msgs = append(msgs, fpms(k, 0, 4, t0, t0)...)
	}
	publishAll(t, env.JS, toShards(t, n, msgs)...)
	for _, k := range keys {
		var from uint64 = 1
		for want := range uint64(5) {
			raw, err := s.nextFPM(k, from)
			if err != nil {
				t.Fatalf("%s (shard %d): FPM %d: %v", k, streams.ShardOf(k, n), want, err)
			}
			if raw.Subject != streams.FPMSubject(k) || raw.Header.Get(streams.HeaderSeq) != strconv.FormatUint(want, 10) {
				t.Fatalf("%s: read %s seq %s, want seq %d", k, raw.Subject, raw.Header.Get(streams.HeaderSeq), want)
			}
			from = raw.Sequence + 1
		}
		if _, err := s.nextFPM(k, from); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("%s: a sixth FPM: %v", k, err)
		}
	}
}
