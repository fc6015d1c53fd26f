package partition

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

const (
	testKeys   = 20
	testPerKey = 500
)

// ownerLog is every owner record a group's partitions had since the log began (a watch of the members
// bucket: the current records, then each write in the order the server stored it). It tells how a
// partition changed hands: a member that takes a released partition writes right after the release;
// one that takes it from a crashed owner writes after that owner's last refresh, once PinnedTTL passed.
type ownerLog struct {
	mu   sync.Mutex
	recs map[int][]ownerRecord
}

// watchOwners starts an ownerLog of cfg's group on env; it returns once the current records are in.
func watchOwners(t *testing.T, env *natsservertest.Env, cfg Config) *ownerLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kv, err := env.JS.KeyValue(ctx, MembersBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, cfg.Stream+"."+cfg.Group+".owner.*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	l := &ownerLog{recs: map[int][]ownerRecord{}}
	current := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					close(current)
					continue
				}
				var rec ownerRecord
				if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &rec) != nil {
					continue
				}
				p, err := strconv.Atoi(e.Key()[strings.LastIndexByte(e.Key(), '.')+1:])
				if err != nil {
					continue
				}
				l.mu.Lock()
				l.recs[p] = append(l.recs[p], rec)
				l.mu.Unlock()
			}
		}
	}()
	select {
	case <-current:
	case <-time.After(30 * time.Second):
		t.Fatal("the owner records did not come through the watch")
	}
	return l
}

// records returns partition p's records so far, oldest first.
func (l *ownerLog) records(p int) []ownerRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs[p])
}

// takenAfterRelease checks that partition p went from member from to another one by a handoff: from's
// last record of it is a release, and the next owner's claim follows it; a takeover after PinnedTTL
// follows the stopped owner's last refresh instead.
func (l *ownerLog) takenAfterRelease(t *testing.T, p int, from string) {
	t.Helper()
	recs := l.records(p)
	last := -1
	for i, r := range recs {
		if r.Member == from {
			last = i
		}
	}
	switch {
	case last < 0:
		t.Errorf("partition %d: no record of %s (records %+v)", p, from, recs)
	case last == len(recs)-1:
		t.Errorf("partition %d: nobody took it from %s (records %+v)", p, from, recs)
	case !recs[last].Released:
		t.Errorf("partition %d: %s took it without %s releasing it (records %+v)", p, recs[last+1].Member, from, recs)
	}
}

// Three members share 20 keys x 500 messages; one stops gracefully mid-run, then a fourth joins.
// Every message is processed exactly once (no redelivery at all: every handoff is graceful), in order
// per key, never by two members at once, and the stopped member hands its partitions on itself: each
// one's next owner takes it right after the stopped member released it, not once PinnedTTL passed.
func TestGroupGracefulStopHandsOverExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, cumulative := range []bool{false, true} {
		t.Run(ackMode(cumulative), func(t *testing.T) { testGracefulStop(t, cumulative) })
	}
}

// ackMode names a test variant by its ack policy.
func ackMode(cumulative bool) string {
	if cumulative {
		return "ack_all"
	}
	return "ack_explicit"
}

func testGracefulStop(t *testing.T, cumulative bool) {
	env := natsservertest.Start(t)
	cfg := testConfig("trace", 16)
	cfg.CumulativeAcks = cumulative
	rec := newRecorder(t, cfg)
	rec.ackEvery = 50 * time.Millisecond // like the trace writer: flush, then ack what it made durable
	var rs []*running
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startMember(t, env, cfg, id, rec))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish(ctx, env.JS, testKeys, testPerKey, 4*time.Second) }()

	all := testKeys * testPerKey
	waitFor(t, 30*time.Second, "a third of the messages", func() bool { return rec.total.Load() >= int64(all/3) })
	owners := watchOwners(t, env, cfg)
	// Balanced before the stop: every member owns some partitions.
	waitFor(t, 10*time.Second, "every member to own partitions", func() bool {
		for _, r := range rs {
			if len(r.m.Owned()) == 0 {
				return false
			}
		}
		return true
	})
	before := ownedBy(rs)
	leaving := rs[0]
	var moved []int
	for p, id := range before {
		if id == leaving.m.ID() {
			moved = append(moved, p)
		}
	}
	slices.Sort(moved)
	t.Logf("before stop: %s", fmtOwned(rs))

	start := time.Now()
	if err := leaving.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stopTook := time.Since(start)
	rest := rs[1:]
	handoff := waitFor(t, 30*time.Second, "the stopped member's partitions to be owned by the others", func() bool {
		now := ownedBy(rest)
		for _, p := range moved {
			if now[p] == "" {
				return false
			}
		}
		return true
	}) + stopTook
	t.Logf("stop took %v; partitions %v owned again %v after Stop was called (PinnedTTL %v); now: %s", stopTook, moved, handoff, cfg.PinnedTTL, fmtOwned(rest))
	for _, p := range moved {
		owners.takenAfterRelease(t, p, leaving.m.ID())
	}

	// A new member joins mid-run: the others hand it its share, gracefully too.
	if rec.total.Load() < int64(all*9/10) {
		d := startMember(t, env, cfg, "d", rec)
		took := waitFor(t, 2*cfg.PinnedTTL, "the new member to own partitions", func() bool { return len(d.m.Owned()) > 0 })
		t.Logf("joining member owns %v after %v", d.m.Owned(), took)
	} else {
		t.Log("publishing nearly done: no member joins")
	}

	if err := <-pubErr; err != nil {
		t.Fatalf("publish: %v", err)
	}
	waitFor(t, 30*time.Second, "every message", func() bool { return rec.total.Load() >= int64(all) })
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	rec.check(testKeys, testPerKey)
	if d := rec.deliveries.Load(); d != int64(all) {
		t.Errorf("handlers got %d deliveries for %d messages (%d already durable): graceful handoffs must not redeliver", d, all, rec.dups.Load())
	}
	t.Logf("deliveries %d, handler sessions %d", rec.deliveries.Load(), rec.sessions.Load())
}

// A member's connection is closed abruptly (a crash: no Stop, no release, nothing acked afterwards).
// Its partitions move to the others once PinnedTTL has passed; its unacked messages are redelivered
// to the new owners before anything newer, so the output still holds every message exactly once and
// in order, and no key is ever processed by two members at once.
func TestGroupCrashRedeliversToNewOwner(t *testing.T) {
	t.Parallel()
	for _, cumulative := range []bool{false, true} {
		t.Run(ackMode(cumulative), func(t *testing.T) { testCrash(t, cumulative) })
	}
}

func testCrash(t *testing.T, cumulative bool) {
	env := natsservertest.Start(t)
	cfg := testConfig("gaps", 16)
	cfg.CumulativeAcks = cumulative
	rec := newRecorder(t, cfg)
	rec.ackEvery = 50 * time.Millisecond // like the trace writer: flush, then ack what it made durable
	var rs []*running
	for _, id := range []string{"a", "b", "c"} {
		rs = append(rs, startMember(t, env, cfg, id, rec))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pubErr := make(chan error, 1)
	go func() { pubErr <- publish(ctx, env.JS, testKeys, testPerKey, 4*time.Second) }()

	all := testKeys * testPerKey
	waitFor(t, 30*time.Second, "a third of the messages", func() bool { return rec.total.Load() >= int64(all/3) })
	waitFor(t, 10*time.Second, "every member to own partitions", func() bool {
		for _, r := range rs {
			if len(r.m.Owned()) == 0 {
				return false
			}
		}
		return true
	})
	crashed := rs[1]
	lost := crashed.m.Owned()
	t.Logf("before crash: %s", fmtOwned(rs))
	start := time.Now()
	crashed.nc.Close()
	err := <-crashed.done
	crashed.done <- err
	if err == nil {
		t.Fatal("Consume of the crashed member returned nil")
	}
	t.Logf("crashed member's Consume returned after %v: %v", time.Since(start), err)
	if o := crashed.m.Owned(); len(o) != 0 {
		t.Errorf("crashed member still owns %v", o)
	}
	rest := []*running{rs[0], rs[2]}
	bound := cfg.PinnedTTL + cfg.PinnedTTL/3 + 2*time.Second
	failover := waitFor(t, bound, "the crashed member's partitions to be owned by the others", func() bool {
		now := ownedBy(rest)
		for _, p := range lost {
			if now[p] == "" {
				return false
			}
		}
		return true
	})
	t.Logf("partitions %v owned again after %v (PinnedTTL %v); now: %s", lost, failover, cfg.PinnedTTL, fmtOwned(rest))

	if err := <-pubErr; err != nil {
		t.Fatalf("publish: %v", err)
	}
	waitFor(t, 30*time.Second, "every message", func() bool { return rec.total.Load() >= int64(all) })
	time.Sleep(200 * time.Millisecond)
	rec.check(testKeys, testPerKey)
	t.Logf("deliveries %d for %d messages: %d redelivered after the crash (already durable, skipped by the output)",
		rec.deliveries.Load(), all, rec.dups.Load())
	if rec.dups.Load() == 0 {
		t.Log("note: the crash left no durable-but-unacked message this run")
	}
}
