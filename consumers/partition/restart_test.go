package partition

import (
	"context"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// The server restarts under a running group (pins and connections are lost, consumers and streams
// are on disk): the members reconnect, take their partitions again and the output still holds every
// message once, in order.
func TestGroupSurvivesServerRestart(t *testing.T) {
	env := streamstest.Start(t)
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
	env2 := streamstest.StartAt(t, listen, store)
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
