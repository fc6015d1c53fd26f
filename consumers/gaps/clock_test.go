package gaps

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// TestDetectorReadingABacklogWaitsForLateFPMs: numbers of a gap stored after the FPM that revealed it
// (a bridge resending what a stalled stream leader never acknowledged, after newer numbers reached the
// next leader), with hundreds of other FPMs in between, read as a backlog once the grace has passed on
// the server's clock (a detector taking over or restarted). The late numbers fill the gap; only the
// one never stored is reported, once, and delivered + missing equals sent.
func TestDetectorReadingABacklogWaitsForLateFPMs(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig()
	cfg.MarkerGrace = time.Second
	// Two messages unacked at a time: the partition is read in small steps, so the clock checks run
	// many times between the FPM revealing the gap and the late ones.
	cfg.MaxAckPending = 2
	t0 := time.Now().UnixMilli()
	k, busy := key("late", 0), key("busy", 0)
	var msgs []*nats.Msg
	msgs = append(msgs, fpms(k, 0, 9, t0, t0)...)
	msgs = append(msgs, fpms(k, 13, 20, t0, t0+130)...) // reveals 10..12
	msgs = append(msgs, fpms(busy, 0, 299, t0, t0)...)
	msgs = append(msgs, fpms(k, 10, 11, t0, t0+100)...) // stored late, within the grace; 12 is lost
	publishAll(t, env.JS, msgs...)
	time.Sleep(cfg.MarkerGrace + 500*time.Millisecond)

	h := startDetector(t, env.Server.ClientURL(), cfg)
	by := waitEvents(t, env.JS, 1, 30*time.Second)
	match(t, k, by[k], gapW(CauseZMQDrop, 12, 12))
	consumerDone(t, env.JS, streams.StreamFPM, defaultGroup)
	by = waitEvents(t, env.JS, 1, time.Second)
	equal(t, uint64(21), delivered(t, env.JS, k)+missingOf(by[k]), "delivered + missing")
	check(t, h.stop() == nil, "stop")
}
