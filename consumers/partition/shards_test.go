package partition

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// publishToShards is publishFrom as a bridge publishes with n shards: each key to its shard's
// ingest subject (stored under its fpm. subject).
func publishToShards(ctx context.Context, js jetstream.JetStream, n, keys, from, perKey int) error {
	for i := range perKey {
		for k := range keys {
			key, err := streams.ParseFPMSubject(keySubject(k))
			if err != nil {
				return err
			}
			if _, err := js.PublishAsync(streams.ShardIngestSubject(key, n), []byte(strconv.Itoa(from+i)), publishPatiently); err != nil {
				return err
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A group over FPM spread in 3 shards: keyed like the shards (by worker_id) with one partition per
// shard it reads each shard directly (no partition stream); otherwise (another partition count,
// another key) through
// a partition stream sourcing every shard. Either way, with two members and one of them stopping
// midway, every key's messages are handled once each, in order, in the partition PartitionOf gives,
// by one member at a time.
func TestGroupOverShards(t *testing.T) {
	t.Parallel()
	const shards, keys, perKey = 3, 24, 100
	for name, tc := range map[string]struct {
		partitions int
		workerKey  bool // keyed by worker_id only, as the shards and the trace writer
		direct     bool
	}{
		"one partition per shard, keyed by worker like the shards": {partitions: 3, workerKey: true, direct: true},
		"two partitions by worker":                                 {partitions: 2, workerKey: true},
		"one partition":                                            {partitions: 1},
		"three partitions by publisher":                            {partitions: 3},
	} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.StartShards(t, shards)
			cfg := testConfig("g", tc.partitions)
			cfg.Shards = shards
			if tc.workerKey {
				cfg.Filters = []Filter{{Subject: streams.FPMRoot + ".*.*.*.*", KeyTokens: []int{3}}}
			}
			if cfg.ShardKeyed() != tc.workerKey {
				t.Fatalf("ShardKeyed %v for filters %+v", cfg.ShardKeyed(), cfg.Filters)
			}
			if tc.partitions == 1 {
				cfg.Filters = []Filter{{Subject: streams.FPMWildcard}}
			}
			rec := newRecorder(t, cfg)
			a := startMember(t, env, cfg, "a", rec)
			b := startMember(t, env, cfg, "b", rec)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := publishToShards(ctx, env.JS, shards, keys, 0, perKey/2); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the first half handled", func() bool { return rec.total.Load() == keys*perKey/2 })
			if err := a.stop(); err != nil {
				t.Fatal(err)
			}
			if err := publishToShards(ctx, env.JS, shards, keys, perKey/2, perKey/2); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "every message handled", func() bool { return rec.total.Load() == keys*perKey })
			rec.check(keys, perKey)
			if len(b.m.Owned()) != tc.partitions {
				t.Fatalf("the remaining member owns %v, want all %d partitions", b.m.Owned(), tc.partitions)
			}

			_, err := env.JS.Stream(ctx, "FPM_PART_g")
			switch {
			case tc.direct && !errors.Is(err, jetstream.ErrStreamNotFound):
				t.Fatalf("a group reading its shards directly made a partition stream: %v", err)
			case !tc.direct && err != nil:
				t.Fatalf("partition stream: %v", err)
			}
			for p := range tc.partitions {
				want := "FPM_PART_g"
				if tc.direct {
					want = streams.ShardStreamName(p)
				}
				if got := cfg.ConsumerStreamOf(p); got != want {
					t.Fatalf("partition %d consumes %s, want %s", p, got, want)
				}
				if _, err := env.JS.PushConsumer(ctx, want, cfg.ConsumerName(p)); err != nil {
					t.Fatalf("consumer %s on %s: %v", cfg.ConsumerName(p), want, err)
				}
			}

			// Another partitioning of the same group is refused.
			other := cfg
			if tc.direct {
				other.Partitions = 2
			} else { // the direct reading
				other.Filters, other.Partitions = []Filter{{Subject: streams.FPMRoot + ".*.*.*.*", KeyTokens: []int{3}}}, shards
			}
			if _, err := Join(ctx, env.JS, other); !errors.Is(err, ErrGroupMismatch) {
				t.Fatalf("join with %d partitions (direct %v): %v, want ErrGroupMismatch", other.Partitions, !tc.direct, err)
			}
			// Delete removes the group's consumers wherever they live.
			if err := b.stop(); err != nil {
				t.Fatal(err)
			}
			if err := Delete(ctx, env.JS, cfg); err != nil {
				t.Fatal(err)
			}
			for p := range tc.partitions {
				if _, err := env.JS.Consumer(ctx, cfg.ConsumerStreamOf(p), cfg.ConsumerName(p)); err == nil ||
					!(errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)) {
					t.Fatalf("after Delete, consumer %s: %v", cfg.ConsumerName(p), err)
				}
			}
		})
	}
}

// WorkerKeyedFilter expands an FPM filter to its five tokens keyed by the worker_id wildcard, and the
// result is what ShardKeyed recognises: its partitions are ShardOf's for every key it matches.
func TestWorkerKeyedFilter(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		subject string
		want    Filter
		ok      bool
	}{
		"every FPM":              {subject: "fpm.>", want: Filter{Subject: "fpm.*.*.*.*", KeyTokens: []int{3}}, ok: true},
		"one namespace":          {subject: "fpm.dynamo.>", want: Filter{Subject: "fpm.dynamo.*.*.*", KeyTokens: []int{2}}, ok: true},
		"one component":          {subject: "fpm.dynamo.backend.*.*", want: Filter{Subject: "fpm.dynamo.backend.*.*", KeyTokens: []int{1}}, ok: true},
		"one rank of any worker": {subject: "fpm.*.*.*.0", want: Filter{Subject: "fpm.*.*.*.0", KeyTokens: []int{3}}, ok: true},
		"one worker":             {subject: "fpm.dynamo.backend.w1.>"},
		"not FPM":                {subject: "fpmevents.>"},
		"too many tokens":        {subject: "fpm.a.b.c.d.e"},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := WorkerKeyedFilter(tc.subject)
			if ok != tc.ok || ok && (got.Subject != tc.want.Subject || !slices.Equal(got.KeyTokens, tc.want.KeyTokens)) {
				t.Fatalf("WorkerKeyedFilter(%q) = %+v, %v; want %+v, %v", tc.subject, got, ok, tc.want, tc.ok)
			}
			if !ok {
				return
			}
			c := FPMConfig("g")
			c.Filters, c.Partitions, c.Shards = []Filter{got}, 5, 5
			if !c.ShardKeyed() || !c.ReadsShardsDirectly() {
				t.Fatalf("%+v: ShardKeyed %v, ReadsShardsDirectly %v", got, c.ShardKeyed(), c.ReadsShardsDirectly())
			}
			for i := range 100 {
				k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w." + strconv.Itoa(i), DPRank: 0}
				p, err := c.PartitionOf(streams.FPMSubject(k))
				if err != nil {
					t.Fatal(err)
				}
				if p != streams.ShardOf(k, 5) {
					t.Fatalf("%s: partition %d, shard %d", k, p, streams.ShardOf(k, 5))
				}
			}
		})
	}
	if FPMConfig("g").ShardKeyed() {
		t.Fatal("a group keyed by the whole publisher key is keyed like the shards")
	}
}
