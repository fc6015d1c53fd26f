package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// silentBucket is the agreed runs bucket as a server that does not answer sees it: while down, every
// read and write fails as a request that timed out does. The FPM stream is untouched.
type silentBucket struct {
	jetstream.KeyValue
	down  atomic.Bool
	calls atomic.Int64
}

func (s *silentBucket) fail() error {
	s.calls.Add(1)
	if s.down.Load() {
		return fmt.Errorf("silent bucket: %w", context.DeadlineExceeded)
	}
	return nil
}

func (s *silentBucket) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if err := s.fail(); err != nil {
		return nil, err
	}
	return s.KeyValue.Get(ctx, key)
}

func (s *silentBucket) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if err := s.fail(); err != nil {
		return 0, err
	}
	return s.KeyValue.Create(ctx, key, value, opts...)
}

func (s *silentBucket) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if err := s.fail(); err != nil {
		return 0, err
	}
	return s.KeyValue.Update(ctx, key, value, revision)
}

// A publisher run that begins while the agreed runs bucket does not answer (the server restarting, its
// store refusing writes on a full disk) waits for it, up to runHold: its FPMs are stored under the
// epoch recorded in the bucket, as a redundant bridge would find it, not under an epoch of this
// bridge's own. A bucket away for longer than runHold holds the run no longer: its FPMs are stored
// under the bridge's local epoch, and so are those of a run that begins afterwards, at once. A bucket
// that did not answer when the bridge started is opened again for the run, which waits for it alike.
func TestRunWaitsForTheRunsBucketToAnswer(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		away     time.Duration // how long the bucket stays away, on the bridge's clock
		atStart  bool          // it was away when the bridge opened it
		recorded bool          // the FPMs' epoch is the one recorded in the bucket
	}{
		"back within the hold":                           {away: 0, recorded: true},
		"away for longer than the hold":                  {away: runHold + time.Second, recorded: false},
		"away when the bridge started, back in the hold": {away: 0, atStart: true, recorded: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := natsservertest.Start(t)
			var mu sync.Mutex
			skew := time.Duration(0)
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(skew) }
			sb := &silentBucket{}
			sb.down.Store(true)
			pub := newTestPub(t, "tcp://127.0.0.1:*")
			defer pub.Close()
			worker := "held-" + strconv.FormatBool(tc.recorded) + "-" + strconv.FormatBool(tc.atStart)
			opts := []option{withClock(clock), withRunsBucket(func(kv jetstream.KeyValue) jetstream.KeyValue { sb.KeyValue = kv; return sb })}
			if tc.atStart {
				opts = append(opts, withRunsOpen(sb.fail))
			}
			h := startBridge(t, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = worker }, opts...)
			pub.waitSubscribed()
			const n = 10
			for q := range uint64(n) {
				pub.send(q, payload(worker, 0, q))
			}
			h.waitStats(30*time.Second, "every FPM received", func(s stats) bool { return s.Ranks[0].Received == n })
			// The bridge has asked the silent bucket more than once: the run is held, nothing stored.
			checkFor(t, 30*time.Second, 10*time.Millisecond, func() error {
				if c := sb.calls.Load(); c < 3 {
					return fmt.Errorf("%d bucket calls", c)
				}
				return nil
			})
			if got := len(messages(t, env.JS, streams.StreamFPM, streams.FPMWildcard)); got != 0 {
				t.Fatalf("%d FPMs stored while their run was not agreed", got)
			}
			mu.Lock()
			skew = tc.away
			mu.Unlock()
			if tc.away == 0 {
				sb.down.Store(false)
			}
			h.waitStats(60*time.Second, "every FPM published", func(s stats) bool { return s.Ranks[0].Published == n })
			stored := messages(t, env.JS, streams.StreamFPM, streams.FPMWildcard)
			if len(stored) != n {
				t.Fatalf("%d FPMs stored, want %d", len(stored), n)
			}
			epoch := stored[0].Headers().Get(streams.HeaderEpoch)
			for _, m := range stored {
				if e := m.Headers().Get(streams.HeaderEpoch); e != epoch {
					t.Fatalf("one run stored under epochs %s and %s", epoch, e)
				}
			}
			sb.down.Store(false)
			entry, err := sb.KeyValue.Get(context.Background(), streams.BridgeRunKey(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: 0}))
			var rec streams.RunRecord
			if err == nil {
				err = json.Unmarshal(entry.Value(), &rec)
			}
			recorded := err == nil && len(rec.Entries()) == 1 && strconv.FormatInt(rec.Entries()[0].Epoch, 10) == epoch
			if recorded != tc.recorded {
				t.Fatalf("FPMs under epoch %s; recorded in the bucket: %v (want %v; record %+v, %v)", epoch, recorded, tc.recorded, rec, err)
			}
		})
	}
}

// A bridge stopped before it opened the agreed runs bucket (a stop that came while it started: the
// server slow to answer, a full disk) still publishes what it received, and agrees those runs through
// the bucket like any others, so that a redundant bridge's copies of them are the same messages: the
// stop opens the bucket.
func TestBridgeStoppedBeforeItOpenedTheRunsBucketAgreesItsRuns(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	defer pub.Close()
	nc, err := natsconn.Connect(natsconn.ConnConfig{URL: env.Server.ClientURL(), Name: "bridge-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	const worker, n = "stopped-starting", 10
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var b *Bridge
	var first sync.Once
	// The first opening of the bucket waits until every FPM was received, and then the bridge is
	// stopped: Run never opened the bucket and was never ready.
	stopWhileStarting := func() (err error) {
		first.Do(func() {
			deadline := time.Now().Add(30 * time.Second)
			for b.Stats().Ranks[0].Received < n && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			err = context.Canceled
		})
		return err
	}
	b, err = New(Config{Endpoints: []Endpoint{{URL: pub.URL}}, BridgeID: worker, Logger: testLogger(), StopTimeout: 30 * time.Second},
		nc, withRunsOpen(stopWhileStarting))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	pub.waitSubscribed()
	for q := range uint64(n) {
		pub.send(q, payload(worker, 0, q))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("bridge did not stop within 60s")
	}
	select {
	case <-b.Ready():
		t.Fatal("the bridge became ready: the stop did not come while it started")
	default:
	}
	stored := messages(t, env.JS, streams.StreamFPM, streams.FPMWildcard)
	if len(stored) != n {
		t.Fatalf("%d FPMs stored, want %d", len(stored), n)
	}
	epoch := stored[0].Headers().Get(streams.HeaderEpoch)
	kv, err := env.JS.KeyValue(context.Background(), streams.BucketBridgeRuns)
	if err != nil {
		t.Fatalf("runs bucket: %v", err)
	}
	entry, err := kv.Get(context.Background(), streams.BridgeRunKey(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: 0}))
	if err != nil {
		t.Fatalf("the run was not recorded: %v", err)
	}
	var rec streams.RunRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil || len(rec.Entries()) != 1 || strconv.FormatInt(rec.Entries()[0].Epoch, 10) != epoch {
		t.Fatalf("FPMs under epoch %s; record %+v (%v)", epoch, rec, err)
	}
	for _, m := range stored {
		if e := m.Headers().Get(streams.HeaderEpoch); e != epoch {
			t.Fatalf("one run stored under epochs %s and %s", epoch, e)
		}
	}
}

// A redundant bridge whose runs bucket does not answer for longer than the hold, while the other
// bridge's answers, stores the run under the other bridge's epoch when the FPM stream shows that
// bridge's copies of messages it received: each FPM is stored once, not once per bridge.
func TestRunTakesAnotherBridgesStoredEpochWhenItsBucketDoesNotAnswer(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	var mu sync.Mutex
	// The bridges' clocks differ by a few milliseconds, as two hosts' do: an epoch of this bridge's own
	// is not the other's by chance.
	skew := 20 * time.Millisecond
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(skew) }
	sb := &silentBucket{}
	sb.down.Store(true)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	defer pub.Close()
	const worker = "bucketless"
	a := startBridge(t, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = "answered" })
	b := startBridge(t, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = "unanswered" },
		withClock(clock), withRunsBucket(func(kv jetstream.KeyValue) jetstream.KeyValue { sb.KeyValue = kv; return sb }))
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for q := range uint64(n) {
		pub.send(q, payload(worker, 0, q))
	}
	a.waitStats(30*time.Second, "every FPM published by the bridge whose bucket answers", func(s stats) bool { return s.Ranks[0].Published == n })
	b.waitStats(30*time.Second, "every FPM received by the other", func(s stats) bool { return s.Ranks[0].Received == n })
	checkFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if c := sb.calls.Load(); c < 3 {
			return fmt.Errorf("%d bucket calls", c)
		}
		return nil
	})
	mu.Lock()
	skew = runHold + time.Second // the hold runs out; the bucket stays away
	mu.Unlock()
	b.waitStats(60*time.Second, "every FPM published by the bridge whose bucket does not answer", func(s stats) bool {
		return s.Ranks[0].Published == n
	})
	stored := messages(t, env.JS, streams.StreamFPM, streams.FPMWildcard)
	if len(stored) != n {
		t.Fatalf("%d FPMs stored, want %d: one copy per bridge", len(stored), n)
	}
	for _, m := range stored {
		if br := m.Headers().Get(streams.HeaderBridge); br != "answered" {
			t.Fatalf("FPM %s stored by %s", m.Headers().Get(streams.HeaderMsgID), br)
		}
	}
}
