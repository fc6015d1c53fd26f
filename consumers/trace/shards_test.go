package trace

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
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
// sequence range is refused with shards. The live writer on the shards (a partition stream sourcing
// them) writes every FPM once, each key in order.
func TestBackfillAcrossShardsIsTheSingleStreams(t *testing.T) {
	const (
		shards = 3
		n      = 1200
		base   = 1_782_777_600_000
		step   = 10
		ivlMs  = 1000
	)
	one, sharded := streamstest.Start(t), streamstest.StartShards(t, shards)
	keys := testKeys(6)
	inShard := map[int]bool{}
	for _, k := range keys {
		inShard[streams.ShardOf(k, shards)] = true
	}
	if len(inShard) < 2 {
		t.Fatalf("the test keys all live in one shard: %v", inShard)
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
		for _, m := range streamstest.Messages(t, sharded.JS, streams.ShardStreamName(i), ">") {
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
		cfg.Mode = mode
		cfg.SampleInterval = ivlMs * time.Millisecond
		cfg.OutputPath = filepath.Join(t.TempDir(), "backfill", "fpm")
		res, err := Backfill(context.Background(), cfg, js, rng, nil, WithLogger(testLogger(t)))
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

	// The live writer on the shards.
	cfg := testConfig(t)
	cfg.Group = "live"
	r := startWriter(t, cfg, sharded.JS)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := sharded.JS.Consumer(context.Background(), "FPM_PART_live", "live")
		if err == nil {
			if ci, err := c.Info(context.Background()); err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream == n {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("live writer on the shards: not everything acknowledged (%v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	live := events(t, cfg.OutputPath)
	whole, err := backfill(t, one.JS, schemas.CaptureFull, BackfillRange{})
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range whole {
		got := live[p]
		if len(got) != len(w) {
			t.Fatalf("producer %s: the live writer on the shards wrote %d events, want %d", p, len(got), len(w))
		}
		last := map[int64]int64{}
		for _, ev := range got {
			var line struct {
				Event struct {
					FPM struct {
						DPRank    int64 `json:"dp_rank"`
						CounterID int64 `json:"counter_id"`
					} `json:"fpm"`
				} `json:"event"`
			}
			if err := json.Unmarshal([]byte(`{"event":`+ev+`}`), &line); err != nil {
				t.Fatal(err)
			}
			f := line.Event.FPM
			if prev, ok := last[f.DPRank]; ok && f.CounterID != prev+1 {
				t.Fatalf("producer %s rank %d: counter %d after %d", p, f.DPRank, f.CounterID, prev)
			}
			last[f.DPRank] = f.CounterID
		}
		sortedGot, sortedWant := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(w))
		if !slices.Equal(sortedGot, sortedWant) {
			t.Fatalf("producer %s: the live writer on the shards wrote other events than the stored FPMs", p)
		}
	}
}
