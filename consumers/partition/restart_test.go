package partition

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// The server restarts under a running group (pins and connections are lost, consumers and streams
// are on disk): the members reconnect, take their partitions again and the output still holds every
// message once, in order.
func TestGroupSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig("restart", 4)
	rec := newRecorder(t, cfg)
	rec.ackEvery = 50 * time.Millisecond
	var rs []*running
	for _, id := range []string{"a", "b"} {
		rs = append(rs, startMember(t, env, cfg, id, rec))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const keys = 16
	if err := publish(ctx, env.JS, keys, 100, time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the first round", func() bool { return rec.total.Load() == keys*100 })
	listen, store := env.Server.NATS().Addr().String(), env.StoreDir
	env.Stop()
	time.Sleep(500 * time.Millisecond)
	env2 := natsservertest.StartAt(t, listen, store)
	if err := publishFrom(ctx, env2.JS, keys, 100, 100, time.Second); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 60*time.Second, "the second round", func() bool { return rec.total.Load() == keys*200 })
	t.Logf("second round done %v after the restart; owned: %s; deliveries %d, already durable %d",
		took, fmtOwned(rs), rec.deliveries.Load(), rec.dups.Load())
	rec.check(keys, 200)
	for _, r := range rs {
		if err := r.stop(); err != nil {
			t.Errorf("%s: %v", r.m.ID(), err)
		}
	}
}

// A member with a stable id dies holding every message unacked (its connection closed: no graceful
// leave, the server keeps its pins for PinnedTTL) and is started again with the same id: it
// recognises its dead incarnation's key, takes the partitions back at once instead of after
// PinnedTTL, and gets the unacked messages first, in stream order, then the new ones. PinnedTTL is
// the longest allowed here, far beyond every wait of the test, so nothing can finish by waiting it
// out; and the owner records show the mechanism: the restarted member released each partition its
// dead incarnation held before taking it again.
func TestRestartedMemberReclaimsItsPartitionsAtOnce(t *testing.T) {
	t.Parallel()
	for name, partitions := range map[string]int{"one partition": 1, "four partitions": 4} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			cfg := testConfig("reclaim", partitions)
			cfg.PinnedTTL = MaxPinnedTTL // a takeover by recognition needs none of it
			rec := newRecorder(t, cfg)
			rec.ackEvery = time.Hour // nothing acked: the dead incarnation leaves it all unacked
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const keys = 16
			first := startMember(t, env, cfg, "a", rec)
			if err := publish(ctx, env.JS, keys, 50, 0); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the first incarnation to hold every message", func() bool {
				return rec.total.Load() == keys*50 && len(first.m.Owned()) == partitions
			})
			// Long before the periodic heartbeat (PinnedTTL/4, minutes here): the key lists the owned
			// partitions because the member put it when it took them.
			kv, err := env.JS.KeyValue(ctx, MembersBucket)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, "the member key to list its partitions", func() bool {
				e, err := kv.Get(ctx, cfg.Stream+"."+cfg.Group+".a")
				var r memberRecord
				return err == nil && json.Unmarshal(e.Value(), &r) == nil && len(r.Owned) == partitions
			})
			owners := watchOwners(t, env, cfg)
			first.nc.Close() // kill: no graceful leave, the pins stay
			err = <-first.done
			first.done <- err
			if err == nil {
				t.Fatal("Consume returned nil after its connection closed")
			}
			restarted := time.Now()
			second := startMember(t, env, cfg, "a", rec)
			if err := publishFrom(ctx, env.JS, keys, 50, 50, 0); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 60*time.Second, "the restarted member to process the held and the new messages",
				func() bool { return rec.total.Load() == keys*100 })
			t.Logf("restarted member done %v after its restart (PinnedTTL %v); owned %v; redeliveries recognised %d",
				time.Since(restarted), cfg.PinnedTTL, second.m.Owned(), rec.dups.Load())
			for p := range partitions {
				// The dead incarnation's session, then the release the restarted member wrote at Join,
				// then its new session on a subject of its own.
				recs := owners.records(p)
				released := slices.IndexFunc(recs, func(r ownerRecord) bool { return r.Member == "a" && r.Released })
				if len(recs) == 0 || recs[0].Released || released < 0 || released == len(recs)-1 ||
					recs[released+1].Member != "a" || recs[released+1].Released || recs[released+1].Deliver == recs[0].Deliver {
					t.Errorf("partition %d: records %+v, want the dead session, a release, then a new session", p, recs)
				}
			}
			if got := rec.dups.Load(); got != keys*50 {
				t.Fatalf("%d redeliveries of durable messages, want %d (every message the dead incarnation held)", got, keys*50)
			}
			rec.check(keys, 100)
		})
	}
}
