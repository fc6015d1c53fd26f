package trace

import "sync"

// A segment is opened only at a roll or at a writer's start (Dynamo's rule: a writer starts at the
// highest index plus one and never appends to a segment an earlier run left). Within one process the
// trace writer ends and starts again without being restarted: a partition of its group is lost and
// taken again (the server restarted, the connection was cut, a frozen process thawed, the owner
// record could not be refreshed), handed on and taken back, or the component is restarted by
// `fpmbus up`'s supervision. None of those is a writer's start: the new writer of a producer goes on
// in the segment the previous one left, as one uninterrupted writer would have, instead of opening a
// new segment each time (which --max-segments would then prune, acknowledged lines and all).
//
// It may only append where nobody else wrote meanwhile: the segment must still be the producer's
// newest one (another instance that took the partition over in between started a newer one) and hold
// exactly the whole members the previous writer left (no torn tail the takeover repair cut differently,
// no other writer's bytes). That is checked when the new writer is created and again when it opens the
// file; otherwise it starts a new segment, as at a start. Lines the previous writer made durable but
// could not acknowledge come again and are recognised by the takeover recovery as before, wherever
// they are.

// processSegments is where this process's trace writers left their producers' segments, by segment
// prefix: a writer that ends (a partition lost or released, a Consumer stopped) puts each producer's
// segment here, and the next writer of that producer in the process takes it and continues it. A
// Consumer has its own unless Config.Segments shares one among Consumers that succeed one another
// in the process (the incarnations of a restarted component). Safe for concurrent use.
type processSegments struct {
	mu   sync.Mutex
	left map[string]segmentState
}

// NewProcessSegments returns an empty processSegments.
func NewProcessSegments() *processSegments {
	return &processSegments{left: map[string]segmentState{}}
}

// put records where a writer left prefix's segment.
func (ps *processSegments) put(prefix string, st segmentState) {
	if ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.left[prefix] = st
}

// take returns and forgets where a writer left prefix's segment: one writer continues it.
func (ps *processSegments) take(prefix string) (segmentState, bool) {
	if ps == nil {
		return segmentState{}, false
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st, ok := ps.left[prefix]
	delete(ps.left, prefix)
	return st, ok
}
