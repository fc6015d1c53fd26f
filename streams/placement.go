package streams

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Placing a stream's replicas on a cluster.
//
// A cluster answers JetStream requests once it has elected its meta leader, but it can place a
// stream's replicas only on servers that have reported their JetStream to that leader since: for a
// moment after the nodes start (or one restarts), creating an R3 stream is refused with "no suitable
// peers for placement". Stream creation and updates (plan.Execute, Ensure) therefore try again for
// PlacementWait before they give up, and then say what the refusal means. A cluster with fewer
// servers than replicas is refused for good, and the error names that cause too.

// PlacementWait bounds how long a stream create or update waits for the cluster to place its replicas.
const PlacementWait = 30 * time.Second

// ErrNoPeers is wrapped when the cluster did not place a stream's replicas within PlacementWait.
var ErrNoPeers = errors.New("streams: the cluster has no servers to place the stream's replicas on")

// ErrCodeNoPeers is nats-server's "no suitable peers for placement": the cluster cannot place the
// replicas now (too few servers up, or not yet known to the meta leader).
const ErrCodeNoPeers jetstream.ErrorCode = 10005

// placementRetry is the pause between two attempts.
const placementRetry = 250 * time.Millisecond

// placed runs f, which creates or updates what (a stream or bucket) with replicas replicas, again
// while the server refuses it for want of peers, until PlacementWait has passed or ctx ends.
func placed[T any](ctx context.Context, what string, replicas int, f func(context.Context) (T, error)) (T, error) {
	deadline := time.Now().Add(PlacementWait)
	for {
		v, err := f(ctx)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != ErrCodeNoPeers {
			return v, err
		}
		refused := fmt.Errorf("%w: %d replicas of %s (a cluster that has just started needs a moment; otherwise start its missing servers or use fewer replicas): %w",
			ErrNoPeers, max(replicas, 1), what, err)
		if time.Now().After(deadline) {
			return v, refused
		}
		t := time.NewTimer(placementRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, refused
		case <-t.C:
		}
	}
}
