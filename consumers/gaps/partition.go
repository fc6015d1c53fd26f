package gaps

import (
	"github.com/fpmbus/fpmbus/streams"
)

// Partition decides which publishers a detector owns. The detector processes the FPMs and drop markers
// of the publishers it owns, in stream order, and leaves the others alone. Ownership changes while
// the detector runs: a key it gains is loaded from the state bucket and caught up from the streams; a
// key it loses is checkpointed (graceful) or simply forgotten (lost), its state in the bucket for the
// next owner.
type Partition interface {
	Owns(k streams.Key) bool
}

// All owns every publisher.
type All struct{}

// Owns reports true.
func (All) Owns(streams.Key) bool { return true }

// owned is the detector's Partition: the partitions of the group (consumers/partition) whose sessions
// it runs now. Only Run's goroutine uses it.
type owned struct {
	cfg  Config
	sess map[int]*psess
}

// Owns reports whether k's partition is owned and not lost.
func (o *owned) Owns(k streams.Key) bool {
	s := o.sess[o.cfg.PartitionOf(k)]
	return s != nil && !s.lost.Load()
}
