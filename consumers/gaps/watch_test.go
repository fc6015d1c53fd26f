package gaps

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// A status page's watch of the state bucket: before any detector ran it names the missing bucket;
// then it shows each publisher's counts and gaps by cause as the detector checkpoints them, and it
// follows a replaced connection.
func TestPublisherWatchFollowsTheCheckpoints(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	var js jetstream.JetStream = env.JS
	cfg := testConfig()
	w := NewPublisherWatch(func() jetstream.JetStream { return js }, cfg)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.Publishers(ctx); err == nil || !strings.Contains(err.Error(), defaultStateBucket) {
		t.Fatalf("before a detector ran: %v, want an error naming %s", err, defaultStateBucket)
	}

	t0 := time.Now().UnixMilli()
	kz, kc := key("zmq", 1), key("clean", 0)
	publishAll(t, env.JS, fpms(kz, 0, 9, t0, t0)...)
	publishAll(t, env.JS, fpms(kz, 13, 25, t0, t0+100)...)
	publishAll(t, env.JS, fpms(kc, 0, 19, t0, t0)...)
	startDetector(t, env.Server.ClientURL(), cfg)

	w.retryAt = time.Time{} // the bucket exists now: no wait for the retry
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		ps, err := w.Publishers(ctx)
		if err != nil {
			return err
		}
		by := map[streams.Key]publisherStatus{}
		for _, p := range ps {
			by[p.Key] = p
		}
		z, c := by[kz], by[kc]
		if len(ps) != 2 || z.Messages != 23 || z.Missing.ZMQDrop != 3 || z.Gaps.ZMQDrop != 1 || z.State != conditionLive ||
			c.Messages != 20 || c.Missing.Total() != 0 || c.LastSeen.UnixMilli() != t0+190 {
			return errors.New("not yet")
		}
		return nil
	})

	// Another connection (as `up` makes after its connection closed): the watch starts again on it.
	nc, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	ps, err := w.Publishers(ctx)
	if err != nil || len(ps) != 2 {
		t.Fatalf("on the new connection: %v %+v", err, ps)
	}
}

// A publisher's rate is over its checkpoints up to now: a silent one decays instead of showing its
// last burst for ever.
func TestPublisherRateDecaysWhenSilent(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	p := &watched{samples: []rateSample{{t0, 100}, {t0.Add(10 * time.Second), 1100}}}
	for name, tc := range map[string]struct {
		at   time.Duration
		want float64
	}{
		"at the last checkpoint": {10 * time.Second, 100},
		"10 s later, silent":     {20 * time.Second, 50},
		"a clock behind":         {5 * time.Second, 100},
	} {
		if got := p.rate(t0.Add(tc.at)); got != tc.want {
			t.Errorf("%s: rate %v, want %v", name, got, tc.want)
		}
	}
	if got := (&watched{samples: []rateSample{{t0, 5}}}).rate(t0); got != 0 {
		t.Errorf("one checkpoint: rate %v, want 0", got)
	}
}
