package partition

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// With Partitions = 1 the group consumes the stream itself (no partition stream, no copy): one member
// owns everything, a second one stands by and takes over when the first stops, right after the first
// released it (not once PinnedTTL passed), with nothing delivered twice.
func TestSinglePartitionGroupFailsOverToStandby(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("single", 1)
	rec := newRecorder(t, cfg)
	a := startMember(t, env, cfg, "a", rec)
	standby := standbyFor("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := publish(ctx, env.JS, 4, 250, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to process everything", func() bool { return rec.total.Load() == 1000 })
	b := startMember(t, env, cfg, standby, rec)
	time.Sleep(cfg.PinnedTTL / 2)
	if got := b.m.Owned(); len(got) != 0 {
		t.Fatalf("standby owns %v", got)
	}
	if _, err := env.JS.Stream(ctx, "FPM_PART_single"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a single-partition group made a partition stream: %v", err)
	}
	owners := watchOwners(t, env, cfg)
	if err := a.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := publishFrom(ctx, env.JS, 4, 250, 250, 0); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 30*time.Second, "b to take over", func() bool { return rec.total.Load() == 2000 })
	t.Logf("standby took over and caught up %v after the stop (PinnedTTL %v)", took, cfg.PinnedTTL)
	owners.takenAfterRelease(t, 0, "a")
	rec.check(4, 500)
	if d := rec.deliveries.Load(); d != 2000 {
		t.Fatalf("deliveries %d for 2000 messages", d)
	}
}

// A group's partitioning cannot change under it: Join refuses, Delete removes it.
func TestJoinRefusesOtherPartitioning(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c16 := testConfig("g", 16)
	if _, err := Join(ctx, env.JS, c16); err != nil {
		t.Fatal(err)
	}
	if _, err := Join(ctx, env.JS, c16); err != nil {
		t.Fatalf("second join with the same config: %v", err)
	}
	c8 := testConfig("g", 8)
	if _, err := Join(ctx, env.JS, c8); !errors.Is(err, ErrGroupMismatch) {
		t.Fatalf("join with 8 partitions: %v, want ErrGroupMismatch", err)
	}
	c1 := testConfig("g", 1)
	if _, err := Join(ctx, env.JS, c1); !errors.Is(err, ErrGroupMismatch) {
		t.Fatalf("join with 1 partition: %v, want ErrGroupMismatch", err)
	}
	byWorker := testConfig("g", 16)
	byWorker.Filters = []Filter{{Subject: streams.FPMRoot + ".*.*.*.*", KeyTokens: []int{3}}}
	if _, err := Join(ctx, env.JS, byWorker); !errors.Is(err, ErrGroupMismatch) {
		t.Fatalf("join with other key tokens: %v, want ErrGroupMismatch", err)
	}
	cumulative := testConfig("g", 16)
	cumulative.CumulativeAcks = true
	if _, err := Join(ctx, env.JS, cumulative); !errors.Is(err, ErrGroupMismatch) {
		t.Fatalf("join with cumulative acks over explicit ones: %v, want ErrGroupMismatch", err)
	}
	if err := Delete(ctx, env.JS, c16); err != nil {
		t.Fatal(err)
	}
	if _, err := Join(ctx, env.JS, c1); err != nil {
		t.Fatalf("join with 1 partition after delete: %v", err)
	}
	if _, err := Join(ctx, env.JS, c16); !errors.Is(err, ErrGroupMismatch) {
		t.Fatalf("join with 16 partitions over a 1-partition group: %v, want ErrGroupMismatch", err)
	}
	if err := Delete(ctx, env.JS, c1); err != nil {
		t.Fatal(err)
	}
}

// A handler error stops its member (Consume returns it) and the partition is handed on at once, not
// after PinnedTTL; the next owner gets the unacked message again.
func TestHandlerErrorStopsMemberAndHandsOver(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("failing", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, jsA := connect(t, env)
	a, err := Join(ctx, jsA, cfg, WithMemberID("a"), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	aDone := make(chan error, 1)
	go func() {
		aDone <- a.Consume(ctx, func(ctx context.Context, _ int, msgs <-chan jetstream.Msg) error {
			for range msgs {
				return boom // fails on its first message, without acking it
			}
			return nil
		})
	}()
	if err := publish(ctx, env.JS, 1, 3, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; !errors.Is(err, boom) {
		t.Fatalf("Consume returned %v, want the handler's error", err)
	}
	// Handed on, not left to expire: by the time Consume returned, a had released its record, so the
	// next member takes the partition at its first look.
	if owner, _, _, err := a.readOwner(ctx, 0); err != nil || owner == nil || owner.Member != "a" || !owner.Released {
		t.Fatalf("owner record after the handler failed: %+v (%v), want released by a", owner, err)
	}
	failed := time.Now()
	rec := newRecorder(t, cfg)
	startMember(t, env, cfg, "b", rec)
	took := waitFor(t, 30*time.Second, "b to process all three", func() bool { return rec.total.Load() == 3 })
	t.Logf("b took over %v after a failed (%v since the failure)", took, time.Since(failed))
	rec.check(1, 3)
}

// Cancelling Consume's context leaves the group gracefully, like Stop.
func TestConsumeContextCancelLeaves(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("ctx", 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := Join(ctx, env.JS, cfg, WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, cfg)
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Consume(cctx, rec.handler(m.ID())) }()
	if err := publish(ctx, env.JS, 8, 10, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "all messages", func() bool { return rec.total.Load() == 80 })
	if err := m.Consume(ctx, rec.handler("again")); !errors.Is(err, errAlreadyRunning) {
		t.Fatalf("second Consume: %v", err)
	}
	ccancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume after cancel: %v", err)
	}
	if o := m.Owned(); len(o) != 0 {
		t.Fatalf("owns %v after leaving", o)
	}
	kv, err := env.JS.KeyValue(ctx, MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, cfg.Stream+"."+cfg.Group+"."+m.ID()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("member key after leaving: %v", err)
	}
	rec.check(8, 10)
}

// The owner crashes holding every message unacked and nothing new arrives: the server would redeliver
// them only once AckWait expired, and AckWait is far longer here than the test waits. The standby
// takes the partition over in about PinnedTTL and its reset makes them deliverable at once: that the
// standby gets them at all shows it.
func TestCrashOnIdleStreamTakesOverBeforeAckWait(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("idle", 1)
	cfg.AckWait = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ncA, jsA := connect(t, env)
	a, err := Join(ctx, jsA, cfg, WithMemberID("a"), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	var held atomic.Int64
	aDone := make(chan error, 1)
	go func() {
		aDone <- a.Consume(ctx, func(ctx context.Context, _ int, msgs <-chan jetstream.Msg) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case _, ok := <-msgs:
					if !ok {
						return nil
					}
					held.Add(1) // never acked: the output is not durable yet when the crash comes
				}
			}
		})
	}()
	if err := publish(ctx, env.JS, 2, 5, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to hold every message", func() bool { return held.Load() == 10 })
	rec := newRecorder(t, cfg)
	standby := standbyFor("a")
	startMember(t, env, cfg, standby, rec)
	time.Sleep(500 * time.Millisecond)
	if held.Load() != 10 || rec.total.Load() != 0 {
		t.Fatalf("a holds %d, %s processed %d before the crash", held.Load(), standby, rec.total.Load())
	}
	ncA.Close()
	<-aDone
	took := waitFor(t, 45*time.Second, "b to process the crashed member's messages", func() bool { return rec.total.Load() == 10 })
	t.Logf("%s processed them %v after the crash (PinnedTTL %v, AckWait %v)", standby, took, cfg.PinnedTTL, cfg.AckWait)
	rec.check(2, 5)
}

// standbyFor returns a member id that loses partition 0 of a 1-partition group to owner.
func standbyFor(owner string) string {
	for c := 'b'; ; c++ {
		if id := string(c); len(assign([]string{owner, id}, 1)[owner]) == 1 {
			return id
		}
	}
}

// The owner crashes with every message acked and nothing new arrives: nothing is deliverable, yet a
// handler that acts on time (the gap detector's stale publishers) must run for the partition. The
// standby takes it over in about PinnedTTL without any message to deliver, and nothing durable is
// delivered again.
func TestCrashOnIdleAckedPartitionIsTakenOver(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("idle-acked", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := newRecorder(t, cfg)
	ncA, jsA := connect(t, env)
	a, err := Join(ctx, jsA, cfg, WithMemberID("a"), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- a.Consume(ctx, rec.handler("a")) }()
	if err := publish(ctx, env.JS, 2, 5, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to process every message", func() bool { return rec.total.Load() == 10 })
	cons, err := env.JS.PushConsumer(ctx, cfg.Stream, cfg.ConsumerName(0))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a's acks", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == 10
	})
	standby := standbyFor("a")
	var owned atomic.Bool
	sessions := func(member string) Handler {
		h := rec.handler(member) // the shared output: it knows what a wrote
		return func(ctx context.Context, p int, msgs <-chan jetstream.Msg) error {
			owned.Store(true)
			return h(ctx, p, msgs)
		}
	}
	ncB, jsB := connect(t, env)
	defer ncB.Close()
	b, err := Join(ctx, jsB, cfg, WithMemberID(standby), WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	bctx, bcancel := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	go func() { bDone <- b.Consume(bctx, sessions(standby)) }()
	defer func() { bcancel(); <-bDone }()
	time.Sleep(cfg.PinnedTTL) // a owns it while alive, idle or not
	if owned.Load() {
		t.Fatal("the standby owns the partition while its owner is alive")
	}
	ncA.Close()
	<-aDone
	crashed := time.Now()
	took := waitFor(t, 4*cfg.PinnedTTL, "the standby to own the idle partition", func() bool { return owned.Load() })
	t.Logf("%s owns it %v after the crash (PinnedTTL %v)", standby, took, cfg.PinnedTTL)
	if time.Since(crashed) > cfg.AckWait/2 {
		t.Fatal("took over only after AckWait")
	}
	time.Sleep(cfg.PinnedTTL / 2)
	if rec.deliveries.Load() != 10 || rec.dups.Load() != 0 {
		t.Fatalf("%d deliveries, %d redeliveries of durable messages after the takeover; want 10 and none", rec.deliveries.Load(), rec.dups.Load())
	}
	rec.check(2, 5)
	ci, err := cons.Info(ctx)
	if err != nil || ci.AckFloor.Stream != 10 {
		t.Fatalf("ack floor after the takeover: %+v %v", ci, err)
	}
}

// Someone subscribes to every inbox (`nats sub '>'` left running) while the owner crashes: the dead
// owner's subject keeps a subscriber, so the server will not move it, and the standby must neither
// take the partition from under that subscriber nor give up. Once the owner's member key has been
// stale for max(3 x PinnedTTL, ReleaseTimeout + PinnedTTL) the standby claims the record; the
// partition moves as soon as the stray subscriber leaves, and every message is processed once.
func TestStraySubscriberOnADeadOwnersSubjectDelaysTheMoveOnly(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("stray-sub", 1)
	cfg.ReleaseTimeout = cfg.PinnedTTL
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rec := newRecorder(t, cfg)
	a := startMember(t, env, cfg, "a", rec)
	if err := publish(ctx, env.JS, 2, 5, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to process every message", func() bool { return rec.total.Load() == 10 })
	ncTap, _ := connect(t, env)
	tap, err := ncTap.Subscribe("_INBOX.>", func(*nats.Msg) {}) // receives, never acks
	if err != nil {
		t.Fatal(err)
	}
	if err := ncTap.Flush(); err != nil {
		t.Fatal(err)
	}
	standby := standbyFor("a")
	b := startMember(t, env, cfg, standby, rec)
	a.nc.Close() // a crash
	aErr := <-a.done
	a.done <- aErr // for the cleanup
	crashed := time.Now()
	if err := publishFrom(ctx, env.JS, 2, 5, 5, 0); err != nil {
		t.Fatal(err)
	}
	claimAfter := max(3*cfg.PinnedTTL, cfg.ReleaseTimeout+cfg.PinnedTTL)
	time.Sleep(claimAfter + 2*cfg.PinnedTTL)
	if len(b.m.Owned()) != 0 {
		t.Fatalf("%s owns the partition while the dead owner's subject still has a subscriber", standby)
	}
	if err := tap.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	left := time.Now()
	waitFor(t, 3*cfg.PinnedTTL, "the standby to process the messages after the stray subscriber left",
		func() bool { return rec.total.Load() == 20 })
	t.Logf("%s took over %v after the crash, %v after the stray subscriber left", standby, time.Since(crashed), time.Since(left))
	rec.check(2, 10)
}

// A member has claimed the partition (its record is fresh) but has not pointed the consumer at its
// subject or subscribed yet: a standby that looks in that moment must leave the partition alone, and
// take it only once the record has gone stale (the claimer died before subscribing).
func TestFreshClaimWithoutSubscriberIsLeftAlone(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("fresh-claim", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := newRecorder(t, cfg)
	m, err := Join(ctx, env.JS, cfg, WithLogger(testLogger()))
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"member":"claimer","deliver":"_INBOX.claimer-not-subscribed-yet","at_unix_ms":0}`)
	if _, err := m.kv.Create(ctx, cfg.ownerKey(0), body); err != nil {
		t.Fatal(err)
	}
	claimed := time.Now()
	b := startMember(t, env, cfg, "b", rec)
	time.Sleep(cfg.PinnedTTL / 2)
	if got := b.m.Owned(); len(got) != 0 {
		t.Fatalf("the standby took a partition claimed %v ago by a member that has not subscribed yet", time.Since(claimed))
	}
	took := waitFor(t, 2*cfg.PinnedTTL, "the standby to take the partition once the claim is stale", func() bool { return len(b.m.Owned()) == 1 })
	if since := time.Since(claimed); since < cfg.PinnedTTL {
		t.Fatalf("taken %v after the claim, before PinnedTTL %v", since, cfg.PinnedTTL)
	}
	t.Logf("taken %v after waiting", took)
}
