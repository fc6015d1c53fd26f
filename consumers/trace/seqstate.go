package trace

import (
	"time"

	"github.com/fpmbus/fpmbus/tracefile"
)

// seqState is one producer's dedup after a takeover: which of its redelivered messages already have
// their line in its files. The partition consumer is reset to its ack floor when a writer takes it
// over, so every message the previous owner did not acknowledge comes again, in stream order; the
// previous owner may have made some of their lines durable without its acknowledgement reaching the
// server (a crash between the fsync and the ack, a connection cut). An owner writes a producer's
// messages in stream order and says none done before its line is durable, so in full mode those
// lines are exactly a prefix of the producer's redelivered messages: the check skips messages while
// their line identity (tracefile/identity.go) is among the lines read, and the first one that is not ends it.
// Every message skipped is therefore at or below the last stream sequence found written (last), and
// every later one is written.
//
// In sampled mode most messages have no line of their own, so there is no prefix: a message whose
// identity is found is skipped, the others go to the sampler, which the same lines seeded with each
// key's last written interval (a redelivered message of an interval already written is late). The
// check ends once every identity was found, or at the first message stored after the producer's last
// write (less recoverySlack for clock skew): nothing stored later can have a line.
type seqState struct {
	prefix    string
	ids       map[tracefile.LineIdentity]int // lines read and not matched yet; nil once the check is over
	sampled   bool
	lastWrite time.Time // modification time of the producer's newest segment
	last      uint64    // last stream sequence found written
	skipped   int
}

// written reports whether r's line is already on disk (r is then done without a line) and ends the
// check when nothing later can be.
func (s *seqState) written(r *record) bool {
	if s.ids == nil {
		return false
	}
	id := tracefile.IdentityOf(s.prefix, r.Key.Namespace, r.Key.Component, r.Producer, r.Observed, r.Body)
	if n := s.ids[id]; n > 0 {
		if n == 1 {
			delete(s.ids, id)
		} else {
			s.ids[id] = n - 1
		}
		s.last = max(s.last, r.Seq)
		s.skipped++
		if len(s.ids) == 0 {
			s.ids = nil
		}
		return true
	}
	if !s.sampled || r.Stored.After(s.lastWrite.Add(tracefile.RecoverySlack)) {
		s.ids = nil
	}
	return false
}

// checking reports whether the check is still on.
func (s *seqState) checking() bool { return s.ids != nil }
