package replay

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// shardWorkers are four workers that spread over every one of 3 shards.
var shardWorkers = []string{"w0", "w1", "w2", "w3"}

// storedBodies is subject -> bodies in stored order, over the named streams.
func storedBodies(t *testing.T, js jetstream.JetStream, names ...string) map[string][][]byte {
	t.Helper()
	out := map[string][][]byte{}
	for _, name := range names {
		for _, m := range natsservertest.Messages(t, js, name, ">") {
			out[m.Subject()] = append(out[m.Subject()], m.Data())
		}
	}
	return out
}

// A replay to a sharded server publishes each key to its shard's ingest subject, as the bridge does:
// every shard holds exactly its keys' FPMs, under their fpm. subjects, and the shards together hold
// what a replay to one stream FPM stores, key by key in the same order.
func TestStreamTargetOverShards(t *testing.T) {
	const shards = 3
	var ls []line
	for i := range 10 {
		for _, w := range shardWorkers {
			for rank := range 2 {
				ls = append(ls, line{producer: w, observed: t0 + int64(i*3), fpm: fpmJSON(t, w, rank, int64(100+i))})
			}
		}
	}
	replayTo := func(env *natsservertest.Env) {
		plan, err := NewPlan(recordingOf(t, ls...), PlanConfig{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(plan, Config{Target: TargetStream, Stream: streamConfig{Conn: env.NC, BridgeID: "replay-test"}})
		if err != nil {
			t.Fatal(err)
		}
		if rep := runReplay(t, r); rep.Overall.Replayed != len(ls) || rep.Overall.Failed != 0 {
			t.Fatalf("report %+v", rep.Overall)
		}
	}
	one, sharded := natsservertest.Start(t), natsservertest.StartShards(t, shards)
	replayTo(one)
	replayTo(sharded)
	want := storedBodies(t, one.JS, streams.StreamFPM)
	if len(want) != len(shardWorkers)*2 {
		t.Fatalf("one stream holds %d keys, want %d", len(want), len(shardWorkers)*2)
	}
	used := map[int]bool{}
	for i := range shards {
		for subj := range storedBodies(t, sharded.JS, streams.ShardStreamName(i)) {
			k, err := streams.ParseFPMSubject(subj)
			if err != nil {
				t.Fatal(err)
			}
			if streams.ShardOf(k, shards) != i {
				t.Fatalf("%s stored in %s, its shard is %d", subj, streams.ShardStreamName(i), streams.ShardOf(k, shards))
			}
			used[i] = true
		}
	}
	if len(used) != shards {
		t.Fatalf("the replay used shards %v of %d", used, shards)
	}
	got := storedBodies(t, sharded.JS, streams.FPMStreamNames(shards)...)
	if len(got) != len(want) {
		t.Fatalf("shards hold %d keys, one stream %d", len(got), len(want))
	}
	for subj, w := range want {
		if !slices.EqualFunc(got[subj], w, bytes.Equal) {
			t.Fatalf("%s: %d bodies in the shards differ from the one stream's %d", subj, len(got[subj]), len(w))
		}
	}
}

// --from-stream on a sharded server reads every shard: the same records, in the same order per
// producer and rank, as from one stream holding the same FPMs; a sequence range is refused (each shard
// is numbered on its own).
func TestReadStreamAcrossShards(t *testing.T) {
	const shards = 3
	one, sharded := natsservertest.Start(t), natsservertest.StartShards(t, shards)
	var msgs []streams.FPMMessage
	for i := range 15 {
		for _, w := range shardWorkers {
			for rank := range 2 {
				msgs = append(msgs, streams.FPMMessage{Key: streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: w, DPRank: rank},
					Body: fpmJSON(t, w, rank, int64(i)), Seq: uint64(i), CounterID: int64(i), EpochMs: t0,
					ReceivedAtMs: t0 + int64(2*i), Producer: w, Endpoint: "tcp://x", Bridge: "b"})
			}
		}
	}
	for _, n := range []int{1, shards} {
		js := one.JS
		if n > 1 {
			js = sharded.JS
		}
		for _, m := range msgs { // one at a time: stored times follow publication order across shards
			msg := m.Msg()
			msg.Subject = streams.FPMPublishSubject(m.Key, n)
			if _, err := js.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	// storedAt is the stored time of the i-th FPM published (0-based) on a server with n shards.
	storedAt := func(js jetstream.JetStream, n, i int) time.Time {
		var stamps []time.Time
		for _, name := range streams.FPMStreamNames(n) {
			for _, m := range natsservertest.Messages(t, js, name, ">") {
				md, err := m.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				stamps = append(stamps, md.Timestamp)
			}
		}
		slices.SortFunc(stamps, time.Time.Compare)
		return stamps[i]
	}
	byKey := func(rec *Recording) map[string][]string {
		out := map[string][]string{}
		for _, r := range rec.Records {
			k := fmt.Sprintf("%s/%s/%d", r.Producer, r.WorkerID, r.DPRank)
			out[k] = append(out[k], fmt.Sprintf("%d %d %s", r.ObservedMs, r.CounterID, r.FPM))
		}
		return out
	}
	for name, tc := range map[string]struct {
		filter string
		from   int // index of the first FPM published in the range; -1: open
	}{
		"everything":     {from: -1},
		"one worker":     {filter: "fpm.dynamo.backend.w2.>", from: -1},
		"from a time on": {from: 41},
	} {
		t.Run(name, func(t *testing.T) {
			oneRng, shardRng := StreamRange{Filter: tc.filter}, StreamRange{Filter: tc.filter}
			if tc.from >= 0 {
				oneRng.Since, shardRng.Since = storedAt(one.JS, 1, tc.from), storedAt(sharded.JS, shards, tc.from)
			}
			wantRec, err := readStream(t.Context(), one.JS, oneRng)
			if err != nil {
				t.Fatal(err)
			}
			gotRec, err := readStream(t.Context(), sharded.JS, shardRng)
			if err != nil {
				t.Fatal(err)
			}
			if len(wantRec.Records) == 0 || len(gotRec.Records) != len(wantRec.Records) {
				t.Fatalf("%d records from the shards, %d from one stream", len(gotRec.Records), len(wantRec.Records))
			}
			for i := 1; i < len(gotRec.Records); i++ {
				if gotRec.Records[i].ObservedMs < gotRec.Records[i-1].ObservedMs {
					t.Fatalf("record %d observed before the one before it", i)
				}
			}
			got, want := byKey(gotRec), byKey(wantRec)
			for k, w := range want {
				if !slices.Equal(got[k], w) {
					t.Fatalf("%s: %d records from the shards differ from the one stream's %d", k, len(got[k]), len(w))
				}
			}
		})
	}
	if _, err := readStream(t.Context(), sharded.JS, StreamRange{StartSeq: 1, EndSeq: 10}); !errors.Is(err, ErrBadRange) {
		t.Fatalf("sequence range over shards: %v, want ErrBadRange", err)
	}
}
