package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// publishInOrder publishes msgs one at a time, each after the previous one's ack, so that their
// stored times follow their order across streams too.
func publishInOrder(t testing.TB, js jetstream.JetStream, msgs []*nats.Msg) {
	t.Helper()
	for i, m := range msgs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.PublishMsg(ctx, m)
		cancel()
		if err != nil {
			t.Fatalf("publish %d on %s: %v", i, m.Subject, err)
		}
	}
}

// The same FPMs stored in one stream FPM and in 3 shards: a backfill of the shards (whole, or a time
// range) writes exactly the event objects, in the same order per producer, as a backfill of the one
// stream, in both modes (sampled intervals close by event time across shards as on one stream); a
// sequence range is refused with shards. The live writer on the shards (one partition per shard, no
// copy) writes every FPM once, exactly as the live writer on the one stream.
func TestBackfillAcrossShardsIsTheSingleStreams(t *testing.T) {
	t.Parallel()
	const (
		shards = 3
		n      = 1200
		base   = 1_782_777_600_000
		step   = 10
		ivlMs  = 1000
	)
	one, sharded := natsservertest.Start(t), natsservertest.StartShards(t, shards)
	keys := testKeys(8) // workers w0 … w3 with two ranks each
	inShard := map[int]bool{}
	for _, k := range keys {
		inShard[streams.ShardOf(k, shards)] = true
	}
	if len(inShard) != shards {
		t.Fatalf("the test keys leave a shard empty: %v", inShard)
	}
	var toOne, toShards []*nats.Msg
	for i := range n {
		f := testFPM{key: keys[i%len(keys)], counter: int64(i / len(keys)), receivedMs: base + int64(i)*step, heartbeat: i%10 == 9}
		toOne = append(toOne, f.msg(t))
		m := f.msg(t)
		m.Subject = streams.FPMPublishSubject(f.key, shards)
		toShards = append(toShards, m)
	}
	publishInOrder(t, one.JS, toOne)
	publishInOrder(t, sharded.JS, toShards)
	var stamps []time.Time // stored times on the shards, in publication order
	for i := range shards {
		for _, m := range natsservertest.Messages(t, sharded.JS, streams.ShardStreamName(i), ">") {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			stamps = append(stamps, md.Timestamp)
		}
	}
	slices.SortFunc(stamps, func(a, b time.Time) int { return a.Compare(b) })
	if len(stamps) != n {
		t.Fatalf("shards hold %d FPMs, want %d", len(stamps), n)
	}

	backfill := func(t *testing.T, js jetstream.JetStream, mode string, rng BackfillRange) (map[string][]string, error) {
		cfg := testConfig(t)
		cfg.Mode = Mode(mode)
		cfg.SampleInterval = ivlMs * time.Millisecond
		cfg.OutputPath = filepath.Join(t.TempDir(), "backfill", "fpm")
		res, err := Backfill(context.Background(), logTo(cfg, testLogger(t)), js, rng, nil)
		if err != nil {
			return nil, err
		}
		if res.Messages == 0 {
			t.Fatalf("backfill of %+v read nothing", rng)
		}
		return events(t, cfg.OutputPath), nil
	}
	for name, tc := range map[string]struct {
		mode     string
		from, to int // the range by publication index (stored time on the shards); -1: open
	}{
		"full, everything":         {mode: schemas.CaptureFull, from: -1, to: -1},
		"sampled, everything":      {mode: schemas.CaptureSampled, from: -1, to: -1},
		"full, a time range":       {mode: schemas.CaptureFull, from: 200, to: 900},
		"sampled, from a time on":  {mode: schemas.CaptureSampled, from: 300, to: -1},
		"sampled, up to a time":    {mode: schemas.CaptureSampled, from: -1, to: 1000},
		"full, one message's time": {mode: schemas.CaptureFull, from: 500, to: 500},
	} {
		t.Run(name, func(t *testing.T) {
			var shardRng, oneRng BackfillRange
			if tc.from >= 0 {
				shardRng.Since = stamps[tc.from]
				oneRng.StartSeq = uint64(tc.from) + 1
			}
			if tc.to >= 0 {
				shardRng.Until = stamps[tc.to]
				oneRng.StartSeq = max(oneRng.StartSeq, 1)
				oneRng.EndSeq = uint64(tc.to) + 1
			}
			want, err := backfill(t, one.JS, tc.mode, oneRng)
			if err != nil {
				t.Fatal(err)
			}
			got, err := backfill(t, sharded.JS, tc.mode, shardRng)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("producers %s from the shards, %s from one stream", keysOf2(got), keysOf2(want))
			}
			for p, w := range want {
				if !slices.Equal(got[p], w) {
					t.Fatalf("producer %s: %d events from the shards differ from the one stream's %d", p, len(got[p]), len(w))
				}
			}
		})
	}
	if _, err := backfill(t, sharded.JS, schemas.CaptureFull, BackfillRange{StartSeq: 1, EndSeq: 10}); !errors.Is(err, ErrBadRange) {
		t.Fatalf("sequence range over shards: %v, want ErrBadRange", err)
	}

	// The live writer on the shards (one partition per shard, each reading its shard directly) writes
	// what the live writer on the one stream writes, event for event, in the same order per producer,
	// without any copy of the FPMs.
	cfg := testConfig(t)
	cfg.Group = "live"
	r := startWriter(t, cfg, sharded.JS)
	pc, err := r.w.cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	if pc.Partitions != shards || !pc.ReadsShardsDirectly() {
		t.Fatalf("the writer over %d shards has %d partitions, direct %v", shards, pc.Partitions, pc.ReadsShardsDirectly())
	}
	for p := range shards {
		waitShardConsumed(t, sharded.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	noPartitionStream(t, sharded.JS)
	oneCfg := testConfig(t)
	oneCfg.Group = "live"
	r = startWriter(t, oneCfg, one.JS)
	waitConsumed(t, one.JS, oneCfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	live, liveOne := events(t, cfg.OutputPath), events(t, oneCfg.OutputPath)
	if len(live) != len(liveOne) {
		t.Fatalf("producers %s from the shards, %s from one stream", keysOf2(live), keysOf2(liveOne))
	}
	for p, w := range liveOne {
		if !slices.Equal(live[p], w) {
			t.Fatalf("producer %s: the live writer on the shards wrote %d events, not the %d the one stream's wrote in its order", p, len(live[p]), len(w))
		}
	}
	whole, err := backfill(t, one.JS, schemas.CaptureFull, BackfillRange{})
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range whole {
		sortedGot, sortedWant := slices.Sorted(slices.Values(live[p])), slices.Sorted(slices.Values(w))
		if !slices.Equal(sortedGot, sortedWant) {
			t.Fatalf("producer %s: the live writer on the shards wrote other events than the stored FPMs", p)
		}
	}
}

// waitShardConsumed waits until consumer durable on stream has acknowledged everything the stream holds.
func waitShardConsumed(t testing.TB, js jetstream.JetStream, stream, durable string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var ci *jetstream.ConsumerInfo
		var last uint64
		c, err := js.PushConsumer(ctx, stream, durable)
		if err == nil {
			ci, err = c.Info(ctx)
		}
		if err == nil {
			last, err = natsservertest.LastStoredFor(ctx, js, stream, ci.Config)
		}
		cancel()
		if err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream >= ci.Delivered.Stream && ci.AckFloor.Stream >= last {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s on %s not done: %+v, %v", durable, stream, ci, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noPartitionStream fails unless the server holds no partition stream (FPM_PART_*) at all.
func noPartitionStream(t testing.TB, js jetstream.JetStream) {
	t.Helper()
	names := js.StreamNames(context.Background())
	for name := range names.Name() {
		if strings.HasPrefix(name, streams.StreamFPM+"_PART_") {
			t.Fatalf("partition stream %s exists: the shards were copied", name)
		}
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
}

// Messages a shard removed (a message limit) while the writer over 3 shards was stopped are reported
// when it comes back, as on one stream: a loss event naming the shard with the exact range and count
// (each partition reads its whole shard, so every skipped shard sequence is a lost message); the rest
// is written, and no other shard reports a loss.
func TestRetentionLossIsReportedPerShard(t *testing.T) {
	t.Parallel()
	const shards = 3
	env := natsservertest.StartShards(t, shards)
	keys := testKeys(8) // workers w0 … w3, every shard used
	toShards := func(msgs []*nats.Msg) []*nats.Msg {
		for _, m := range msgs {
			k, err := streams.ParseFPMSubject(m.Subject)
			if err != nil {
				t.Fatal(err)
			}
			m.Subject = streams.FPMPublishSubject(k, shards)
		}
		return msgs
	}
	msgs, first := manyFPMs(t, keys, 5*len(keys), 1_782_777_600_000)
	publish(t, env.JS, toShards(msgs))
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	pc, err := r.w.cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	for p := range shards {
		waitShardConsumed(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	more, pub := manyFPMs(t, keys, 20*len(keys), 1_782_777_700_000)
	for i := range pub {
		pub[i].counter += 5
		more[i] = pub[i].msg(t)
	}
	publish(t, env.JS, toShards(more))
	// The shard of the first key keeps only its last 10 messages: the second batch's before them were
	// never read.
	ctx := context.Background()
	victim := streams.ShardStreamName(streams.ShardOf(keys[0], shards))
	st, err := env.JS.Stream(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const keep = 10
	var inVictim []testFPM // the second batch in the victim shard, in its order
	var kept []testFPM
	kept = append(kept, first...)
	for _, f := range pub {
		if streams.ShardStreamName(streams.ShardOf(f.key, shards)) == victim {
			inVictim = append(inVictim, f)
		} else {
			kept = append(kept, f)
		}
	}
	kept = append(kept, inVictim[len(inVictim)-keep:]...)
	readUpTo := info.State.LastSeq - uint64(len(inVictim))
	sc := info.Config
	sc.MaxMsgs = keep
	if _, err := env.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	r = startWriter(t, cfg, env.JS)
	for p := range shards {
		waitShardConsumed(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var losses []streams.ConsumerLoss
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.ConsumerLossSubject(ConsumerName)) {
		var l streams.ConsumerLoss
		if err := json.Unmarshal(m.Data(), &l); err != nil {
			t.Fatal(err)
		}
		l.DetectedAt = 0
		losses = append(losses, l)
	}
	lastRemoved := info.State.LastSeq - keep
	want := []streams.ConsumerLoss{{Event: "loss", Cause: streams.LossRetention, Consumer: ConsumerName, Stream: victim,
		First: readUpTo + 1, Last: lastRemoved, Count: lastRemoved - readUpTo}}
	if fmt.Sprint(losses) != fmt.Sprint(want) {
		t.Fatalf("loss events\n got %+v\nwant %+v", losses, want)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), kept, schemas.CaptureFull)
}

// Matching a trace to the stream needs the single stream FPM: over shards, verify with the stream (and
// repair) is refused with ErrStreamSharded before anything is read or changed; the files alone are
// still checked.
func TestVerifyAgainstShardsIsRefused(t *testing.T) {
	t.Parallel()
	const shards = 3
	env := natsservertest.StartShards(t, shards)
	msgs, _ := manyFPMs(t, testKeys(8), 40, 1_782_777_600_000)
	for _, m := range msgs {
		k, err := streams.ParseFPMSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		m.Subject = streams.FPMPublishSubject(k, shards)
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	pc, err := r.w.cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	for p := range shards {
		waitShardConsumed(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vc := tracefile.VerifyConfig{OutputPath: cfg.OutputPath, IncludeActive: true, Logger: testLogger(t)}
	rep, err := tracefile.Verify(ctx, vc, nil)
	if err != nil || rep.Remaining != 0 {
		t.Fatalf("the files alone: %v, %d findings remain", err, rep.Remaining)
	}
	for name, repair := range map[string]bool{"stream": false, "repair": true} {
		vc.Repair = repair
		if _, err := tracefile.Verify(ctx, vc, env.JS); !errors.Is(err, tracefile.ErrStreamSharded) {
			t.Fatalf("%s over shards: %v, want ErrStreamSharded", name, err)
		}
	}
}

// A group over 3 shards whose consumers were declared for the other capture mode has every shard's
// consumer replaced at start (each on its own shard), going on after its ack floor: nothing is read
// twice, and the new mode's ack policy is on every shard.
func TestModeChangeOverShardsReplacesEveryShardsConsumer(t *testing.T) {
	t.Parallel()
	const shards = 3
	env := natsservertest.StartShards(t, shards)
	msgs, published := manyFPMs(t, testKeys(8), 80, 1_782_777_600_000)
	for _, m := range msgs {
		k, err := streams.ParseFPMSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		m.Subject = streams.FPMPublishSubject(k, shards)
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.FPMShards = shards
	sampled := cfg
	sampled.Mode = schemas.CaptureSampled
	spc, err := sampled.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for p := range shards { // what a sampled-mode group declared: each message acked on its own
		if _, err := env.JS.CreateOrUpdateConsumer(ctx, spc.ConsumerStreamOf(p), spc.ConsumerConfig(p)); err != nil {
			t.Fatal(err)
		}
	}
	r := startWriter(t, cfg, env.JS)
	pc, err := r.w.cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	for p := range shards {
		waitShardConsumed(t, env.JS, streams.ShardStreamName(p), pc.ConsumerName(p))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for p := range shards {
		c, err := env.JS.PushConsumer(ctx, streams.ShardStreamName(p), pc.ConsumerName(p))
		if err != nil {
			t.Fatal(err)
		}
		if ap := c.CachedInfo().Config.AckPolicy; ap != jetstream.AckAllPolicy {
			t.Fatalf("%s on %s acks with %v after the start in full mode", pc.ConsumerName(p), streams.ShardStreamName(p), ap)
		}
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
}
