package trace

import "math/bits"

// seqState remembers, by stream sequence, which messages the writer holds (received, line not yet
// durable or ack not yet sent) and which it is done with (acked or terminated in this run, or found
// already written by the startup recovery). It is how a redelivered message is written at most once:
//
//   - a redelivery of a message that is done is acked again and skipped: its ack was lost (a crash
//     after the fsync, a connection cut) and its line is on disk already;
//   - a redelivery of a message still held (the ack wait expired while its flush was blocked, e.g. by
//     a full disk) is dropped: the held copy's ack settles it (JetStream acks by stream sequence, so
//     the older delivery's ack counts).
//
// Two bit planes cover the sequences [base, base+64*len). Sequences at or below the consumer's ack
// floor can never be redelivered; trim forgets them, so the planes span about the consumer's unacked
// range (the floor is polled from the server). Sequence 0 means "unknown" and is ignored. seqState is
// owned by the consumer loop.
type seqState struct {
	base uint64   // sequence of bit 0 of word 0; a multiple of 64
	held []uint64 // received, not yet finished
	done []uint64 // finished: acked or terminated, or written by an earlier run
	// limit bounds the planes (bits); beyond it the lowest sequences are forgotten (counted in forgot).
	limit  int
	forgot uint64
}

// defaultSeqLimit is 2^27 sequences: 16 MiB per plane, hours of unacked range at fleet rates.
const defaultSeqLimit = 1 << 27

func newSeqState(limit int) *seqState {
	if limit <= 0 {
		limit = defaultSeqLimit
	}
	return &seqState{limit: limit}
}

// at returns the word and bit of seq, growing the planes to cover it; ok is false if seq cannot be
// covered (0, or below what was forgotten).
func (s *seqState) at(seq uint64, grow bool) (int, uint64, bool) {
	if seq == 0 {
		return 0, 0, false
	}
	if len(s.held) == 0 {
		if !grow {
			return 0, 0, false
		}
		s.base = seq &^ 63
	}
	if seq < s.base {
		if !grow {
			return 0, 0, false
		}
		need := int((s.base - (seq &^ 63)) / 64)
		if (len(s.held)+need)*64 > s.limit {
			return 0, 0, false // older than the window: forgotten
		}
		s.held = append(make([]uint64, need, need+len(s.held)), s.held...)
		s.done = append(make([]uint64, need, need+len(s.done)), s.done...)
		s.base = seq &^ 63
	}
	w := int((seq - s.base) / 64)
	if w >= len(s.held) {
		if !grow {
			return 0, 0, false
		}
		for w >= len(s.held) {
			s.held = append(s.held, 0)
			s.done = append(s.done, 0)
		}
		if over := len(s.held)*64 - s.limit; over > 0 {
			s.drop((over + 63) / 64)
			w = int((seq - s.base) / 64)
		}
	}
	return w, 1 << (seq % 64), true
}

// drop forgets the lowest n words.
func (s *seqState) drop(n int) {
	n = min(n, len(s.held))
	for i := range n {
		s.forgot += uint64(bits.OnesCount64(s.done[i] | s.held[i]))
	}
	s.held = append(s.held[:0], s.held[n:]...)
	s.done = append(s.done[:0], s.done[n:]...)
	s.base += uint64(n) * 64
}

// status reports whether seq is held and whether it is done.
func (s *seqState) status(seq uint64) (held, done bool) {
	w, b, ok := s.at(seq, false)
	if !ok {
		return false, false
	}
	return s.held[w]&b != 0, s.done[w]&b != 0
}

// hold marks seq received.
func (s *seqState) hold(seq uint64) {
	if w, b, ok := s.at(seq, true); ok {
		s.held[w] |= b
	}
}

// finish marks seq done (acked or terminated).
func (s *seqState) finish(seq uint64) {
	if w, b, ok := s.at(seq, true); ok {
		s.held[w] &^= b
		s.done[w] |= b
	}
}

// release forgets that seq is held (it was naked: the next delivery is new work).
func (s *seqState) release(seq uint64) {
	if w, b, ok := s.at(seq, false); ok {
		s.held[w] &^= b
	}
}

// trim forgets every sequence at or below the consumer's ack floor: they are never redelivered.
func (s *seqState) trim(floor uint64) {
	if len(s.held) == 0 || floor < s.base+64 {
		return
	}
	n := int((floor + 1 - s.base) / 64) // whole words at or below floor
	n = min(n, len(s.held))
	s.held = append(s.held[:0], s.held[n:]...)
	s.done = append(s.done[:0], s.done[n:]...)
	s.base += uint64(n) * 64
	if len(s.held) == 0 {
		s.base = 0
	}
}

// span is the number of sequences the planes cover (for tests and metrics).
func (s *seqState) span() int { return len(s.held) * 64 }
