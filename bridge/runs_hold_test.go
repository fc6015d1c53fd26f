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
