package partition

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// createRetrying retries create until the cluster answers (a restarted node, a new meta leader).
func createRetrying(t testing.TB, what string, create func(ctx context.Context) error) {
	t.Helper()
	var err error
	waitFor(t, 30*time.Second, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err = create(ctx)
		return err == nil
	})
}

// Join while the group's R3 stream cannot answer (two of three nodes down, so neither the stream nor
// JetStream's meta group has a quorum): Join keeps trying and succeeds once the nodes are back, as a
// member started during a cluster's election must, rather than failing and exiting.
func TestJoinWaitsForTheClusterToAnswer(t *testing.T) {
	t.Parallel()
	c := natsservertest.StartCluster(t)
	_, js := c.Connect(0)
	cfg := testConfig("join-quorum", 2)
	createRetrying(t, "the R3 stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{streams.FPMRoot + ".>"}, Replicas: 3})
		return err
	})
	c.Stop(1)
	c.Stop(2)
	type joined struct {
		m   *Member
		err error
	}
	done := make(chan joined, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m, err := Join(ctx, js, cfg, WithLogger(testLogger()))
		done <- joined{m, err}
	}()
	select {
	case j := <-done:
		t.Fatalf("Join returned while the cluster had no quorum: %v", j.err)
	case <-time.After(3 * time.Second):
	}
	c.Start(1)
	c.Start(2)
	j := <-done
	if j.err != nil {
		t.Fatalf("Join after the nodes came back: %v", j.err)
	}
	t.Logf("joined %v after the outage began", time.Since(start).Round(time.Millisecond))
	// The group is declared: its partition stream, consumers and members bucket exist.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for p := range cfg.Partitions {
		if _, err := js.PushConsumer(ctx, cfg.PartitionStream(), cfg.ConsumerName(p)); err != nil {
			t.Fatalf("consumer %s: %v", cfg.ConsumerName(p), err)
		}
	}
	if _, err := js.KeyValue(ctx, MembersBucket); err != nil {
		t.Fatalf("members bucket: %v", err)
	}
}

// The members bucket is away (its only node stopped, longer than several PinnedTTLs) while the
// group's stream, on another node, keeps taking messages: the member keeps its partitions and
// handles every message meanwhile; once the bucket is back, its watch works again, so a member that
// joins afterwards is seen and gets its share, and every message is handled once, in order.
func TestMembersSurviveAnOutageOfTheMembersBucket(t *testing.T) {
	t.Parallel()
	c := natsservertest.StartCluster(t)
	_, js := c.Connect(0)
	cfg := testConfig("bucket-outage", 2)
	// The stream and its partition copy on n1, the members bucket on n2 alone.
	createRetrying(t, "the stream on n1", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{streams.FPMRoot + ".>"}, Placement: natsservertest.OnNode(0)})
		return err
	})
	createRetrying(t, "the partition stream on n1", func(ctx context.Context) error {
		src, err := js.Stream(ctx, cfg.Stream)
		if err != nil {
			return err
		}
		sc := cfg.partitionStreamConfig(src.CachedInfo())
		sc.Placement = natsservertest.OnNode(0)
		_, err = js.CreateStream(ctx, sc)
		return err
	})
	createRetrying(t, "the members bucket on n2", func(ctx context.Context) error {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: MembersBucket, History: 1, TTL: membersBucketTTL,
			Storage: jetstream.FileStorage, Placement: natsservertest.OnNode(1)})
		return err
	})

	// Member ids such that, once both are live, each owns one partition.
	a, b := "a", ""
	for i := 0; b == ""; i++ {
		if id := fmt.Sprintf("b%d", i); len(assign([]string{a, id}, cfg.Partitions)[id]) == 1 {
			b = id
		}
	}
	const keys, perKey = 16, 25 // keys 0-15 fall in both partitions (10 and 6)
	rec := newRecorder(t, cfg)
	ma := startMemberOn(t, c, 0, cfg, a, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	batch := func(i int) { // publishes the i-th perKey messages of every key and waits until they are handled
		t.Helper()
		if err := publishFrom(ctx, js, keys, i*perKey, perKey, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, fmt.Sprintf("batch %d handled", i), func() bool { return rec.total.Load() == int64((i+1)*keys*perKey) })
	}
	batch(0)
	waitFor(t, 20*time.Second, "a owns both partitions", func() bool { return len(ma.m.Owned()) == 2 })

	c.Stop(1)
	outage := time.Now()
	batch(1)
	// Past several PinnedTTLs without a heartbeat reaching the bucket, the member still owns both.
	time.Sleep(max(3*cfg.PinnedTTL-time.Since(outage), 0))
	if got := ma.m.Owned(); len(got) != 2 {
		t.Fatalf("after %v without the members bucket a owns %v, want both partitions", time.Since(outage).Round(time.Millisecond), got)
	}
	batch(2)

	c.Start(1)
	mb := startMemberOn(t, c, 2, cfg, b, rec)
	rs := []*running{ma, mb}
	batch(3)
	waitFor(t, 30*time.Second, "a and b own one partition each", func() bool {
		return len(ma.m.Owned()) == 1 && len(mb.m.Owned()) == 1
	})
	batch(4)
	t.Logf("owners after the outage: %s", fmtOwned(rs))
	for _, r := range rs {
		if err := r.stop(); err != nil {
			t.Fatalf("%s: %v", r.m.ID(), err)
		}
	}
	rec.check(keys, 5*perKey)
}

// The members bucket's stream disappears under a running member (deleted, as a lost store would
// lose it) and comes back: the members watch ends (nats.go cannot re-create its consumer), and the
// member, instead of stopping, keeps its partitions and opens the watch again until the bucket is
// there, so that a member joining afterwards is seen and gets its share.
func TestMembersWatchIsReopenedAfterItEnds(t *testing.T) {
	t.Parallel()
	c := natsservertest.StartCluster(t)
	_, js := c.Connect(0)
	cfg := testConfig("watch-ends", 2)
	createRetrying(t, "the stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{streams.FPMRoot + ".>"}})
		return err
	})
	a, b := "a", ""
	for i := 0; b == ""; i++ {
		if id := fmt.Sprintf("b%d", i); len(assign([]string{a, id}, cfg.Partitions)[id]) == 1 {
			b = id
		}
	}
	const keys, perKey = 16, 25
	rec := newRecorder(t, cfg)
	ma := startMemberOn(t, c, 0, cfg, a, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	batch := func(i int) {
		t.Helper()
		if err := publishFrom(ctx, js, keys, i*perKey, perKey, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("batch %d handled", i), func() bool { return rec.total.Load() == int64((i+1)*keys*perKey) })
	}
	batch(0)
	waitFor(t, 20*time.Second, "a owns both partitions", func() bool { return len(ma.m.Owned()) == 2 })

	if err := js.DeleteKeyValue(ctx, MembersBucket); err != nil {
		t.Fatal(err)
	}
	// The watch's consumer went with the stream; nats.go notices after its missed heartbeats and fails
	// to re-create it. Meanwhile, and after, the member runs on.
	time.Sleep(15 * time.Second)
	select {
	case err := <-ma.done:
		t.Fatalf("member a stopped when its members watch ended: %v", err)
	default:
	}
	batch(1)
	if _, err := membersBucket(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	mb := startMemberOn(t, c, 1, cfg, b, rec)
	batch(2)
	waitFor(t, 30*time.Second, "a and b own one partition each", func() bool {
		return len(ma.m.Owned()) == 1 && len(mb.m.Owned()) == 1
	})
	batch(3)
	for _, r := range []*running{ma, mb} {
		if err := r.stop(); err != nil {
			t.Fatalf("%s: %v", r.m.ID(), err)
		}
	}
	rec.check(keys, 4*perKey)
}

// streamLeader names the node leading stream name ("" if none or unknown).
func streamLeader(js jetstream.JetStream, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// The group's stream (on n2 alone) goes away, so the R3 partition stream's source loses its consumer
// and nats-server only retries it on a growing backoff: a member notices the inactive source and asks
// the partition stream's leader to step down (a new leader sets the source up at once), and once the
// stream is back every message reaches the handler.
func TestMembersMoveThePartitionStreamLeaderWhenItsSourceStalls(t *testing.T) {
	t.Parallel()
	c := natsservertest.StartCluster(t)
	_, js := c.Connect(0)
	cfg := testConfig("source-stall", 2)
	createRetrying(t, "the stream on n2", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{streams.FPMRoot + ".>"}, Placement: natsservertest.OnNode(1)})
		return err
	})
	createRetrying(t, "the R3 partition stream", func(ctx context.Context) error {
		src, err := js.Stream(ctx, cfg.Stream)
		if err != nil {
			return err
		}
		sc := cfg.partitionStreamConfig(src.CachedInfo())
		sc.Replicas = 3
		_, err = js.CreateStream(ctx, sc)
		return err
	})
	// Its leader on n1 or n3, so that stopping n2 does not move it.
	nc, _ := c.Connect(0)
	waitFor(t, 30*time.Second, "a partition stream leader other than n2", func() bool {
		switch streamLeader(js, cfg.PartitionStream()) {
		case "n1", "n3":
			return true
		case "n2":
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+cfg.PartitionStream(), nil, 2*time.Second)
		}
		return false
	})
	const keys, perKey = 16, 25
	rec := newRecorder(t, cfg)
	m := startMemberOn(t, c, 0, cfg, "a", rec)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := publish(ctx, js, keys, perKey, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the first batch handled", func() bool { return rec.total.Load() == keys*perKey })

	before := streamLeader(js, cfg.PartitionStream())
	c.Stop(1)
	waitFor(t, 60*time.Second, "a new partition stream leader while the source is away", func() bool {
		l := streamLeader(js, cfg.PartitionStream())
		return l != "" && l != before
	})
	c.Start(1)
	createRetrying(t, "the stream back on n2", func(ctx context.Context) error {
		_, err := js.Stream(ctx, cfg.Stream)
		return err
	})
	if err := publishFrom(ctx, js, keys, perKey, perKey, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the second batch handled", func() bool { return rec.total.Load() == 2*keys*perKey })
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	rec.check(keys, 2*perKey)
}
