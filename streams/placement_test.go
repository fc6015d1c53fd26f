package streams_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// unplaced is a server that refuses the first refusals stream creations as a cluster does while it
// cannot place their replicas yet (a node that has just started has not reported its JetStream to the
// meta leader): nats-server's "no suitable peers for placement". Everything else is the real server's.
type unplaced struct {
	jetstream.JetStream
	refusals atomic.Int64 // left to refuse; negative: refuse for ever
	tries    atomic.Int64
}

func (u *unplaced) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	u.tries.Add(1)
	if u.refusals.Load() != 0 {
		u.refusals.Add(-1)
		return nil, &jetstream.APIError{Code: 500, ErrorCode: 10005, Description: "no suitable peers for placement"}
	}
	return u.JetStream.CreateStream(ctx, cfg)
}

// Apply and Ensure wait while the cluster cannot place a stream's replicas yet (up to
// streams.PlacementWait, within their context), and then fail naming the cause.
func TestStreamCreationWaitsForPlacement(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		refusals int64
		timeout  time.Duration
		wantErr  error
	}{
		"placed after a few refusals":         {refusals: 3, timeout: 30 * time.Second},
		"refused past the context: the cause": {refusals: -1, timeout: 2 * time.Second, wantErr: streams.ErrNoPeers},
	} {
		for _, how := range []string{"apply", "ensure"} {
			t.Run(name+", "+how, func(t *testing.T) {
				env := natsservertest.StartAt(t, "127.0.0.1:0", t.TempDir())
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := env.JS.DeleteStream(ctx, streams.StreamFPM); err != nil {
					t.Fatal(err)
				}
				js := &unplaced{JetStream: env.JS}
				js.refusals.Store(tc.refusals)
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
				defer cancel()
				var err error
				if how == "apply" {
					err = streams.Apply(ctx, js, streams.DefaultConfig())
				} else {
					_, err = streams.Ensure(ctx, js, streams.DefaultConfig(), nil)
				}
				if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
					t.Fatalf("%v, want %v", err, tc.wantErr)
				}
				if tc.wantErr != nil {
					if js.tries.Load() < 2 {
						t.Fatalf("gave up after %d tries", js.tries.Load())
					}
					return
				}
				if got := js.tries.Load(); got != tc.refusals+1 {
					t.Fatalf("%d creations of FPM, want %d refused and one placed", got, tc.refusals)
				}
				if _, err := env.JS.Stream(ctx, streams.StreamFPM); err != nil {
					t.Fatalf("FPM after the refusals: %v", err)
				}
			})
		}
	}
}
