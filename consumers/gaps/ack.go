package gaps

import (
	"github.com/nats-io/nats.go/jetstream"
)

// The partition consumers ack cumulatively (partition.Config.CumulativeAcks, the server's AckAll
// policy): acking a message acknowledges every message delivered before it in the session. That saves
// the server one ack per FPM, most of what a consumer costs it; the price is that a message may only
// be acked once every message delivered before it is safe too.

// ackLog is one partition session's delivered messages not yet acknowledged, in delivery order. The
// loop marks a message done once its effect is durable (its publisher's checkpoint written, its
// events stored, or nothing to keep), and acks the last message of the longest done prefix.
// Only Run's goroutine uses it.
type ackLog struct {
	base uint64 // delivery index of q[head]
	head int
	q    []ackSlot
}

type ackSlot struct {
	m    jetstream.Msg
	done bool
}

// heldMsg is a delivered FPM waiting for its publisher's checkpoint: its session and its index in
// the session's ackLog.
type heldMsg struct {
	s   *psess
	idx uint64
}

// add appends a delivered message and returns its index.
func (l *ackLog) add(m jetstream.Msg) uint64 {
	l.q = append(l.q, ackSlot{m: m})
	return l.base + uint64(len(l.q)-1-l.head)
}

// done marks message idx safe to acknowledge.
func (l *ackLog) done(idx uint64) {
	if idx < l.base {
		return // acknowledged already
	}
	if i := l.head + int(idx-l.base); i < len(l.q) {
		l.q[i].done = true
	}
}

// advance forgets the done prefix and returns its last message, the one to ack (nil: nothing new).
func (l *ackLog) advance() jetstream.Msg {
	n := l.head
	for n < len(l.q) && l.q[n].done {
		n++
	}
	if n == l.head {
		return nil
	}
	last := l.q[n-1].m
	clear(l.q[l.head:n])
	l.base += uint64(n - l.head)
	l.head = n
	switch {
	case l.head == len(l.q):
		l.q, l.head = l.q[:0], 0
	case l.head >= 1024 && l.head >= len(l.q)/2:
		k := copy(l.q, l.q[l.head:])
		clear(l.q[k:])
		l.q, l.head = l.q[:k], 0
	}
	return last
}

// release marks held messages safe to acknowledge, if their session is still the partition's
// current one (a lost session's messages go to the next owner; acking them could acknowledge what
// that owner has not made durable).
func (d *Detector) release(msgs []heldMsg) {
	for _, h := range msgs {
		if d.part.sess[h.s.p] == h.s && !h.s.lost.Load() {
			h.s.acks.done(h.idx)
		}
	}
}

// ackSafe acknowledges, per owned partition, every message up to the end of its done prefix.
func (d *Detector) ackSafe() {
	for _, s := range d.part.sess {
		if s.lost.Load() {
			continue
		}
		if m := s.acks.advance(); m != nil {
			_ = m.Ack()
		}
	}
}
