package durable

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// session is one ownership of a partition: the messages delivered in it that are not acknowledged
// yet, in delivery order. Done and Reject (any goroutine) mark slots under mu; the loop acknowledges.
// A lost session acknowledges nothing more: its messages belong to the next owner, and under
// cumulative acks an ack could acknowledge what that owner has not made durable.
type session struct {
	p        int
	ctx      context.Context // the partition handler's: cancelled when the partition is lost
	r        *Runner
	lost     atomic.Bool
	released chan struct{} // closed by the loop once a graceful release is complete

	// Loop only.
	lastSeq   uint64 // highest own-stream sequence delivered (retention-loss check)
	seqKnown  bool
	releasing bool
	floor     uint64   // the partition consumer's ack floor when the session started
	attempt   attempts // the session's takeover record
	careful   bool     // crash loop: hand one message at a time, recording each as the suspect

	mu      sync.Mutex
	base    uint64 // delivery index of q[head]
	head    int
	q       []slot
	rejects []rejected
	dirty   bool // something was marked done since the last ack pass
	acked   int  // messages acknowledged since takeAcked
}

type slot struct {
	m     *Msg
	done  bool
	acked bool      // explicit acks: acknowledged individually, waiting for the prefix to pass it
	since time.Time // delivered or last in-progress ack
}

type rejected struct {
	m      *Msg
	reason error
}

func newSession(r *Runner, ctx context.Context, p int) *session {
	return &session{p: p, ctx: ctx, r: r, released: make(chan struct{})}
}

// add appends a delivered message and returns its index.
func (s *session) add(m *Msg, now time.Time) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.q = append(s.q, slot{m: m, since: now})
	return s.base + uint64(len(s.q)-1-s.head)
}

// addBatch appends delivered messages and sets their indexes.
func (s *session) addBatch(msgs []Msg, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		s.q = append(s.q, slot{m: m, since: now})
		m.idx = s.base + uint64(len(s.q)-1-s.head)
	}
}

func (s *session) slotLocked(idx uint64) *slot {
	if idx < s.base {
		return nil
	}
	if i := s.head + int(idx-s.base); i < len(s.q) {
		return &s.q[i]
	}
	return nil
}

func (s *session) done(idx uint64) {
	s.mu.Lock()
	wake := false
	if sl := s.slotLocked(idx); sl != nil && !sl.done {
		sl.done = true
		wake = !s.dirty // else a wake is pending, or the loop's ack pass has not run yet: it sees this one
		s.dirty = true
	}
	s.mu.Unlock()
	if wake {
		s.r.wake()
	}
}

func (s *session) reject(m *Msg, reason error) {
	s.mu.Lock()
	if sl := s.slotLocked(m.idx); sl != nil && !sl.done {
		s.rejects = append(s.rejects, rejected{m: m, reason: reason})
	}
	s.mu.Unlock()
	s.r.wake()
}

// takeRejects returns the rejections waiting for their dead letter.
func (s *session) takeRejects() []rejected {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.rejects
	s.rejects = nil
	return out
}

// ackable returns what to acknowledge now. Cumulative: the last message of the done prefix (one ack
// covers it and everything before). Explicit: every done message not acknowledged yet. The done
// prefix is forgotten either way.
func (s *session) ackable(cumulative bool) (acks []*Msg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty {
		return nil
	}
	s.dirty = false
	n := s.head
	for n < len(s.q) && s.q[n].done {
		n++
	}
	if cumulative {
		if n > s.head {
			acks = append(acks, s.q[n-1].m)
			for i := s.head; i < n; i++ {
				if !s.q[i].acked {
					s.acked++
				}
			}
		}
	} else {
		for i := s.head; i < len(s.q); i++ {
			if sl := &s.q[i]; sl.done && !sl.acked {
				sl.acked = true
				s.acked++
				acks = append(acks, sl.m)
			}
		}
	}
	if n > s.head {
		clear(s.q[s.head:n])
		s.base += uint64(n - s.head)
		s.head = n
		switch {
		case s.head == len(s.q):
			s.q, s.head = s.q[:0], 0
		case s.head >= 1024 && s.head >= len(s.q)/2:
			k := copy(s.q, s.q[s.head:])
			clear(s.q[k:])
			s.q, s.head = s.q[:k], 0
		}
	}
	return acks
}

// terminated marks message idx done and settled by a Term (explicit acks) or by the cumulative ack
// that will cover it: it is not counted as acknowledged.
func (s *session) terminated(idx uint64) {
	s.mu.Lock()
	if sl := s.slotLocked(idx); sl != nil {
		sl.done, sl.acked = true, true
		s.dirty = true
	}
	s.mu.Unlock()
}

// takeAcked returns how many messages were acknowledged since the last call.
func (s *session) takeAcked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.acked
	s.acked = 0
	return n
}

// held returns the messages not done that were delivered (or last kept alive) before cutoff, and
// restarts their clocks: they get an in-progress ack.
func (s *session) held(cutoff, now time.Time) []*Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Msg
	for i := s.head; i < len(s.q); i++ {
		if sl := &s.q[i]; !sl.done && sl.since.Before(cutoff) {
			sl.since = now
			out = append(out, sl.m)
		}
	}
	return out
}

// pending is the number of delivered messages not yet done.
func (s *session) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := s.head; i < len(s.q); i++ {
		if !s.q[i].done {
			n++
		}
	}
	return n
}
