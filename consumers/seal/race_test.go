package seal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

type raceResult struct {
	sealer    int
	cell      *schemas.Cell
	attemptID string
	out       outcome
	err       error
}

// runRace has 8 sealers, each on its own connection (spread over the servers), race over 200 cells.
// Sealers 0-3 publish the same attempt (run "run-A"); sealers 4-7 each publish their own run (a
// different attempt). During the race, disrupt (if set) runs once after about a third of the seals.
func runRace(t *testing.T, connect func(i int) jetstream.JetStream, disrupt func()) {
	const sealers, cells = 8, 200
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		results = map[string][]raceResult{}
		done    atomic.Int64
		wg      sync.WaitGroup
	)
	disrupted := make(chan struct{})
	if disrupt != nil {
		go func() {
			defer close(disrupted)
			for done.Load() < sealers*cells/3 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			disrupt()
		}()
	} else {
		close(disrupted)
	}
	for s := range sealers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			js := connect(s)
			kv, err := js.KeyValue(ctx, streams.BucketDatasets)
			if err != nil {
				t.Errorf("sealer %d: bucket: %v", s, err)
				return
			}
			sl, err := NewSealer(kv, WithSource(fmt.Sprintf("sealer-%d", s)), withOpTimeout(2*time.Second), withRetries(60, 50*time.Millisecond))
			if err != nil {
				t.Error(err)
				return
			}
			run, scale := "run-A", 1.0
			if s >= 4 {
				run, scale = fmt.Sprintf("run-%d", s), 1+float64(s)/10
			}
			order := rand.Perm(cells)
			for _, i := range order {
				c := testCell(i, run, scale, 4)
				id := newAttemptID()
				out, err := sl.SealAttempt(ctx, &c, "", id)
				mu.Lock()
				results[c.Key] = append(results[c.Key], raceResult{s, &c, id, out, err})
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	<-disrupted

	js := connect(0)
	kv, err := js.KeyValue(ctx, streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != cells {
		t.Fatalf("%d cells raced, want %d", len(results), cells)
	}
	counts := map[result]int{}
	settled := 0
	for key, rs := range results {
		val, rev, err := get(ctx, kv, key)
		if err != nil {
			t.Fatalf("%s: read sealed value: %v", key, err)
		}
		winners := 0
		for _, r := range rs {
			if r.out.Settled {
				settled++
			}
			switch {
			case r.err == nil && r.out.Result == sealed:
				winners++
				counts[sealed]++
				// No acknowledged seal is lost: the stored value is this sealer's.
				if val.AttemptID != r.attemptID {
					t.Errorf("%s: sealer %d was told it won, but the value has attempt %s", key, r.sealer, val.AttemptID)
				}
			case r.err == nil && r.out.Result == alreadySealed:
				counts[alreadySealed]++
				if !val.SameAttempt(r.cell) {
					t.Errorf("%s: sealer %d got an idempotent success for a different attempt", key, r.sealer)
				}
			case errors.Is(r.err, ErrConflict):
				counts[conflict]++
				var ce *conflictError
				if !errors.As(r.err, &ce) || ce.Sealed.AttemptID != val.AttemptID || ce.Refused.RunID != r.cell.Provenance.RunID {
					t.Errorf("%s: sealer %d: conflict does not name both identities: %v", key, r.sealer, r.err)
				}
				if val.SameAttempt(r.cell) {
					t.Errorf("%s: sealer %d saw a conflict with its own attempt", key, r.sealer)
				}
			default:
				t.Errorf("%s: sealer %d: unexpected outcome %v / %v", key, r.sealer, r.out.Result, r.err)
			}
		}
		if winners != 1 {
			t.Errorf("%s: %d winners, want exactly 1", key, winners)
		}
		hist, err := kv.History(ctx, key)
		if err != nil {
			t.Fatalf("%s: history: %v", key, err)
		}
		if len(hist) != 1 || hist[0].Revision() != rev {
			t.Errorf("%s: history has %d revisions, want 1", key, len(hist))
		}
	}
	t.Logf("outcomes: sealed %d, idempotent %d, conflict %d; %d settled by reading back after an unknown outcome",
		counts[sealed], counts[alreadySealed], counts[conflict], settled)
	if counts[alreadySealed] == 0 || counts[conflict] == 0 {
		t.Errorf("the race exercised too little: %v", counts)
	}
}

func TestClusterRaceOneWinnerPerCell(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	runRace(t, func(i int) jetstream.JetStream {
		js, _ := jetstream.New(c.connect(t, i))
		return js
	}, nil)
}

func TestClusterRaceWithLeaderStepDown(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	nc := c.connect(t, 0)
	js, _ := jetstream.New(nc)
	before := bucketLeader(context.Background(), js)
	runRace(t, func(i int) jetstream.JetStream {
		js, _ := jetstream.New(c.connect(t, i))
		return js
	}, func() {
		// Step the bucket's leader down twice while the sealers run.
		for range 2 {
			if err := stepDown(nc); err != nil {
				t.Logf("step down: %v", err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	})
	after := bucketLeader(context.Background(), js)
	t.Logf("bucket leader before %q, after %q", before, after)
}

func TestClusterRaceWithServerStopped(t *testing.T) {
	t.Parallel()
	c := startCluster(t)
	runRace(t, func(i int) jetstream.JetStream {
		// Connect every sealer to servers 2 and 3 first so that stopping server 1 moves clients too.
		js, _ := jetstream.New(c.connect(t, i))
		return js
	}, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		js, _ := jetstream.New(c.connect(t, 1))
		leader := bucketLeader(ctx, js)
		for i, s := range c.Servers {
			if s.Name() == leader {
				t.Logf("stopping server %d (%s), the bucket leader", i+1, leader)
				s.Shutdown()
				return
			}
		}
		t.Logf("leader %q not found; stopping server 1", leader)
		c.Servers[0].Shutdown()
	})
}
