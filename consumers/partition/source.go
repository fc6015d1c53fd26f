package partition

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
)

// A partition stream copies the group's stream through a source that the partition stream's leader
// keeps up. When that source's consumer is lost (the source stream's leader stopped) and setting it
// up again fails while the cluster recovers, nats-server retries later and later (5 s x 2 x failures,
// up to 2 minutes), and every retry scheduled during the outage still has to pass once the cluster is
// back: the partition stream, and with it the whole group, stays behind for that long although
// everything answers again. A new leader of the partition stream sets the source up at once, with
// its failures forgotten. So the members watch the source and, once it has been inactive for
// sourceStallAfter, ask the partition stream's leader to step down.

const (
	// sourceCheckEvery is how often a member looks at its partition stream's sources (the server's own
	// health check of a source runs every 10 s, its heartbeats every second).
	sourceCheckEvery = 10 * time.Second
	// sourceStallAfter is how long a source may stay inactive (no consumer, no heartbeat) before the
	// member asks for a new leader, and how long it then waits before asking again.
	sourceStallAfter = 2 * sourceCheckEvery
)

// sourceWatch follows the sources of a member's partition stream (a group that copies, on a cluster).
type sourceWatch struct {
	m             *Member
	inactiveSince time.Time // when a source was first seen without a consumer; zero while none is
	lastStepDown  time.Time
}

// check looks at the partition stream's sources once and asks its leader to step down when one has
// been inactive past sourceStallAfter. A single-server stream has no other leader to move to.
func (s *sourceWatch) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	info, err := s.m.streams[0].Info(ctx) // the partition stream, every partition's
	if err != nil || info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
		return
	}
	// A source with a consumer says how long it has been inactive (Active: since it last delivered or
	// sent a heartbeat); one without a consumer (Active negative) is timed from when this member first
	// saw it so.
	now := time.Now()
	stalled, noConsumer := false, false
	for _, si := range info.Sources {
		switch {
		case si.Active < 0:
			noConsumer = true
		case si.Active > sourceStallAfter:
			stalled = true
		}
	}
	if !noConsumer {
		s.inactiveSince = time.Time{}
	} else if s.inactiveSince.IsZero() {
		s.inactiveSince = now
	}
	stalled = stalled || noConsumer && now.Sub(s.inactiveSince) >= sourceStallAfter
	if !stalled || now.Sub(s.lastStepDown) < sourceStallAfter {
		return
	}
	s.lastStepDown = now
	name := info.Config.Name
	s.m.log.Warn("partition: the partition stream's source has been inactive; asking its leader to step down so that the next one sets it up at once",
		"stream", name, "leader", info.Cluster.Leader)
	if _, err := s.m.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+name, nil); err != nil && !errors.Is(err, nats.ErrNoResponders) {
		s.m.log.Warn("partition: partition stream step down", "stream", name, "err", err)
	}
}
