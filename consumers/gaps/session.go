package gaps

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/streams"
)

// psess is one ownership of a partition (one call of the partition handler).
type psess struct {
	p        int
	revoking bool          // msgs closed: checkpoint, ack, then close done (loop only)
	scanned  bool          // the partition's keys in the state bucket are loaded (loop only)
	done     chan struct{} // closed by the loop once the partition's publishers are checkpointed and acked
	lost     atomic.Bool   // ctx cancelled: the loop forgets the partition without writing
	acks     ackLog        // delivered messages not yet acknowledged (loop only)
}

// pitem is what a handler sends to the loop: messages of its partition (those already waiting,
// in order), or the start or graceful end of the session. One channel keeps each handler's items in
// order.
type pitem struct {
	s    *psess
	ms   []jetstream.Msg
	kind int
}

// handBatch bounds the messages of one pitem.
const handBatch = 256

const (
	itemMsg = iota
	itemGain
	itemRevoke
)

// handle is the partition.Handler: it moves the partition's messages to the loop. msgs closed
// (graceful revoke): it waits until the loop has checkpointed the partition's publishers and acked
// their messages. ctx cancelled (lost): it tells the loop to forget them and returns at once.
func (d *Detector) handle(ctx context.Context, p int, msgs <-chan jetstream.Msg) error {
	s := &psess{p: p, done: make(chan struct{})}
	lose := func() error {
		s.lost.Store(true)
		select {
		case d.lostCh <- s:
		default: // the loop also checks s.lost
		}
		return ctx.Err()
	}
	send := func(it pitem) bool {
		select {
		case d.in <- it:
			return true
		case <-ctx.Done():
			return false
		case <-d.quit:
			return false
		}
	}
	if !send(pitem{s: s, kind: itemGain}) {
		return lose()
	}
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				if !send(pitem{s: s, kind: itemRevoke}) {
					return lose()
				}
				select {
				case <-s.done:
					return nil
				case <-ctx.Done():
					return lose()
				case <-d.quit:
					return lose()
				}
			}
			batch := make([]jetstream.Msg, 1, 16)
			batch[0] = m
			closed := false
		more:
			for len(batch) < handBatch {
				select {
				case m, ok := <-msgs:
					if !ok {
						closed = true
						break more
					}
					batch = append(batch, m)
				default:
					break more
				}
			}
			if !send(pitem{s: s, ms: batch}) {
				return lose()
			}
			if closed {
				if !send(pitem{s: s, kind: itemRevoke}) {
					return lose()
				}
				select {
				case <-s.done:
					return nil
				case <-ctx.Done():
					return lose()
				case <-d.quit:
					return lose()
				}
			}
		case <-ctx.Done():
			return lose()
		case <-d.quit:
			return lose()
		}
	}
}

// handleItem applies one item from a handler.
func (d *Detector) handleItem(it pitem) error {
	s := it.s
	if s.lost.Load() {
		if d.part.sess[s.p] == s {
			d.lose(s)
		}
		return nil
	}
	switch it.kind {
	case itemGain:
		return d.gain(s)
	case itemRevoke:
		if d.part.sess[s.p] != s {
			close(s.done)
			return nil
		}
		s.revoking = true
		d.revoking++
		for _, e := range d.keys {
			if e.part == s.p && (e.changed || len(e.st.Outbox) > 0) {
				e.changed = true
				d.markDirty(e)
			}
		}
		return nil
	}
	if d.part.sess[s.p] != s {
		return nil // a message of an ended session: left unacked for the next owner
	}
	for _, m := range it.ms {
		if err := d.handleFPM(m, heldMsg{s: s, idx: s.acks.add(m)}); err != nil {
			return err
		}
	}
	return nil
}

// gain starts owning partition s.p: the publishers of the partition with state in the bucket are
// loaded (their outboxes published, their drop markers caught up), so that one that stays silent is
// still found stale; their FPMs after the checkpoint are re-read before the first delivered one.
func (d *Detector) gain(s *psess) error {
	if old := d.part.sess[s.p]; old != nil {
		d.forget(old.p)
		if old.revoking {
			d.revoking--
		}
	}
	d.part.sess[s.p] = s
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.preload(ctx, s.p); err != nil {
		return err
	}
	s.scanned = true
	d.logger.Info("gap detector: partition acquired", "partition", s.p, "consumer", d.cfg.PartitionConfig().ConsumerName(s.p))
	return nil
}

// lose forgets partition s.p without writing anything (the session was lost: another instance may
// own it already). Unacked messages are redelivered to the next owner.
func (d *Detector) lose(s *psess) {
	if d.part.sess[s.p] != s {
		return
	}
	d.forget(s.p)
	if s.revoking {
		d.revoking--
	}
	delete(d.part.sess, s.p)
	d.logger.Info("gap detector: partition lost", "partition", s.p)
}

// forget drops every loaded publisher of partition p, without acking their held messages.
func (d *Detector) forget(p int) {
	for _, e := range d.keys {
		if e.part == p {
			d.drop(e)
		}
	}
}

// settleRevokes ends the graceful revokes whose publishers are all checkpointed, published and acked.
func (d *Detector) settleRevokes() {
	if d.revoking == 0 || d.flight != nil {
		return
	}
	busy := map[int]bool{}
	for _, e := range d.keys {
		if e.changed || e.isDirty || len(e.msgs) > 0 || len(e.st.Outbox) > 0 {
			busy[e.part] = true
		}
	}
	for k := range d.orphans {
		busy[d.partitionOf(k)] = true
	}
	for p, s := range d.part.sess {
		if !s.revoking || busy[p] {
			continue
		}
		d.forget(p)
		delete(d.part.sess, p)
		d.revoking--
		close(s.done)
		d.logger.Info("gap detector: partition handed on", "partition", p)
	}
}

// partitionOf is k's partition.
func (d *Detector) partitionOf(k streams.Key) int { return d.cfg.PartitionOf(k) }

var _ partition.Handler = (*Detector)(nil).handle
