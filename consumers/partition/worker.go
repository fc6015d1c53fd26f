package partition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// worker runs one partition assigned to its member: it stands by until the partition has no live
// owner (or its owner released it, or the owner is this member's own earlier session), takes it by
// writing the owner record with compare-and-set, points the partition's push consumer at a subject
// of its own, resets the consumer to its ack floor and owns the partition in a session (hand to the
// handler) until it is released, loses it, or must resync.
type worker struct {
	m         *Member
	p         int
	name      string
	hard      context.Context // the member's: done means give everything up abruptly
	rel       context.Context // done once released (or hard)
	relCancel context.CancelFunc
	intr      chan struct{} // end the current session abruptly (disconnected), keep the partition

	// Standby: since when the owner's subject has been seen bound while the owner's record is stale
	// (zero: it has not).
	silentSince time.Time
}

func newWorker(m *Member, p int, hard context.Context) *worker {
	rel, cancel := context.WithCancel(hard)
	return &worker{m: m, p: p, name: m.cfg.ConsumerName(p), hard: hard, rel: rel, relCancel: cancel, intr: make(chan struct{}, 1)}
}

// release asks the worker to give its partition up gracefully and exit.
func (w *worker) release() { w.relCancel() }

func (w *worker) released() bool { return w.rel.Err() != nil }

func (w *worker) interrupt() {
	select {
	case w.intr <- struct{}{}:
	default:
	}
}

// sleep waits d or until released.
func (w *worker) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.rel.Done():
	}
}

// fatal reports errors after which retrying cannot help.
func fatal(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrConnectionClosed)
}

func (w *worker) run(h Handler) error {
	defer w.relCancel()
	waits := retrywait.Doubling(100*time.Millisecond, 2*time.Second)
	retry := func(what string, err error) {
		w.m.log.Debug("partition: retrying", "partition", w.p, "op", what, "err", err)
		w.sleep(waits.NextBackOff())
	}
	for !w.released() {
		st, err := w.look()
		if err != nil {
			if fatal(err) {
				return fmt.Errorf("partition %d: %w", w.p, err)
			}
			retry("look", err)
			continue
		}
		waits.Reset()
		if !w.mayTake(st, time.Now()) {
			w.sleep(w.m.cfg.standbyPoll())
			continue
		}
		select { // an interrupt from before this session does not concern it
		case <-w.intr:
		default:
		}
		if err := w.own(st, h); err != nil {
			var r retryable
			if !errors.As(err, &r) {
				return err
			}
			retry("own", err)
		}
		// A session that ended for a resync, or was cut short, is taken again at once (the record
		// is this member's); a released worker leaves the loop.
	}
	return nil
}

// look is what a standby reads each time: the partition consumer and its owner record.
type look struct {
	info    *jetstream.ConsumerInfo
	rec     *ownerRecord
	rev     uint64
	written time.Time // when the server stored rec
}

func (w *worker) look() (look, error) {
	ctx, cancel := context.WithTimeout(w.rel, apiTimeout)
	defer cancel()
	c, err := w.m.streams[w.p].PushConsumer(ctx, w.name)
	if err != nil {
		return look{}, err
	}
	rec, rev, written, err := w.m.readOwner(ctx, w.p)
	if err != nil {
		return look{}, err
	}
	return look{info: c.CachedInfo(), rec: rec, rev: rev, written: written}, nil
}

// mayTake decides, from one look, whether this member takes the partition now:
//
//   - at once when nobody owns it (no record, nothing bound), when its owner released it, or when the
//     record is this member's own (a session of it that ended, or, with a stable id, its previous
//     incarnation's);
//   - when nobody subscribes to the owner's subject and the owner has not rewritten its record for
//     PinnedTTL (it does every PinnedTTL/2): it crashed, stopped or was cut off. A fresh record
//     whose subject has no subscriber yet is an owner between its claim and its subscription;
//   - when the owner's subject has a subscriber but the record has been stale for the longer of
//     3 x PinnedTTL and ReleaseTimeout + PinnedTTL: an owner that is alive but cannot write its
//     record, or a subscriber that is not the owner (a `nats sub '>'`). The server refuses to move a
//     subject that has a subscriber, so the claim then waits until it unsubscribes: an owner whose
//     record was taken ends its session at its next record refresh (PinnedTTL/2).
//
// Exclusivity does not rest on this decision: only the member whose compare-and-set of the record
// succeeds points the consumer at itself, the server moves the consumer's subject only while nobody
// subscribes to it, and it delivers to that one subject. The record's age is the server's storage
// time against this host's clock: hosts' clocks must agree to well within PinnedTTL.
func (w *worker) mayTake(st look, now time.Time) bool {
	cfg := w.m.cfg
	bound := st.info.PushBound
	if st.rec != nil {
		bound = bound && st.info.Config.DeliverSubject == st.rec.Deliver
	}
	if st.rec == nil && !bound || st.rec != nil && (st.rec.Released || st.rec.Member == w.m.id) {
		w.silentSince = time.Time{}
		return true
	}
	fresh := st.rec != nil && now.Sub(st.written) < cfg.PinnedTTL
	if !bound || fresh {
		w.silentSince = time.Time{}
		return !bound && !fresh
	}
	if w.silentSince.IsZero() {
		w.silentSince = now
	}
	return now.Sub(w.silentSince) >= max(3*cfg.PinnedTTL, cfg.ReleaseTimeout+cfg.PinnedTTL)
}

type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

type endKind int

const (
	endReleased endKind = iota // graceful: release the record afterwards
	endResync                  // graceful: keep the record, take the partition again (reset)
	endLost                    // abrupt: handler context cancelled, record left as it is
)

type event struct {
	kind endKind
	err  error // fatal for the member, with endLost
}

// own runs one ownership session of the partition: claim the owner record (compare-and-set on the
// revision st was read at), point the consumer at a fresh subject of this member's, reset it to its
// ack floor (so every message not acked by a previous owner comes again, in stream order, before any
// newer one) and hand messages to h until the session ends. It returns nil at once when another
// member claimed the record first (the next look sees who).
func (w *worker) own(st look, h Handler) error {
	m := w.m
	subj := m.nc.NewInbox()
	ctx, cancel := context.WithTimeout(w.hard, apiTimeout)
	rev, err := m.writeOwner(ctx, w.p, ownerRecord{Member: m.id, Deliver: subj}, st.rev)
	cancel()
	switch {
	case errors.Is(err, errOwnerTaken):
		return nil
	case err != nil:
		return retryable{fmt.Errorf("partition %d: claim: %w", w.p, err)}
	}
	cc := st.info.Config
	cc.DeliverSubject = subj
	ctx, cancel = context.WithTimeout(w.hard, apiTimeout)
	cons, err := m.streams[w.p].UpdatePushConsumer(ctx, cc)
	if err == nil {
		_, err = m.streams[w.p].ResetConsumer(ctx, w.name)
	}
	cancel()
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSubjectBound {
		m.log.Warn("partition: the previous owner's subject still has a subscriber; the partition moves once it leaves (a `nats sub` on _INBOX.> or >?)",
			"partition", w.p, "subject", st.info.Config.DeliverSubject)
	}
	if err != nil {
		if fatal(err) {
			return fmt.Errorf("partition %d: take %s: %w", w.p, w.name, err)
		}
		return retryable{fmt.Errorf("partition %d: take %s: %w", w.p, w.name, err)}
	}
	// Nothing reached the subject before the reset: it had no subscriber. From the first delivery on,
	// deliveries are numbered without gaps; the first one's number is the session's start.
	s := &session{
		ch:         make(chan jetstream.Msg, m.cfg.MaxAckPending),
		partStream: m.cfg.PartitionStream() != "",
		ev:         make(chan event, 1),
	}
	sub, err := subscribe(m.nc, subj, cc.IdleHeartbeat, s.onMsg, s.onEnd)
	if err != nil {
		return retryable{fmt.Errorf("partition %d: subscribe: %w", w.p, err)}
	}
	hctx, hcancel := context.WithCancel(w.hard)
	defer hcancel()
	hdone := make(chan error, 1)
	go func() { hdone <- h(hctx, w.p, s.ch) }()
	m.setOwned(w.p, true)
	defer m.setOwned(w.p, false)
	m.log.Debug("partition: acquired", "partition", w.p, "epoch", rev)

	refresh := time.NewTicker(m.cfg.PinnedTTL / 2)
	defer refresh.Stop()
	var ev event
	var herr error
	handlerDone := false
wait:
	for {
		select {
		case <-w.rel.Done():
			ev.kind = endReleased
			if w.hard.Err() != nil {
				ev.kind = endLost
			}
			break wait
		case ev = <-s.ev:
			break wait
		case <-w.intr:
			ev.kind = endLost
			break wait
		case herr = <-hdone:
			handlerDone = true
			if herr == nil {
				herr = errHandlerReturned
			}
			ev.kind = endLost
			break wait
		case <-refresh.C:
			// The record is the epoch: rewriting it at its revision fails only when another member took
			// the partition (it then gets the deliveries): stop at once. A bucket that cannot be written
			// for the moment changes nothing: the subject is still this member's.
			ctx, cancel := context.WithTimeout(w.hard, apiTimeout)
			n, err := m.writeOwner(ctx, w.p, ownerRecord{Member: m.id, Deliver: subj}, rev)
			cancel()
			if errors.Is(err, errOwnerTaken) {
				m.log.Warn("partition: taken over by another member", "partition", w.p)
				ev.kind = endLost
				break wait
			}
			if err == nil {
				rev = n
			}
		}
	}
	if ev.kind != endLost {
		// Graceful: the handler gets no more messages, drains what it has, makes it durable and acks.
		// Deliveries go on meanwhile and are dropped (unacked, they come again after the next owner's
		// reset).
		s.close()
		t := time.NewTimer(m.cfg.ReleaseTimeout)
		select {
		case herr = <-hdone:
			handlerDone = true
		case <-t.C:
			m.log.Warn("partition: handler did not finish within the release timeout; giving the partition up",
				"partition", w.p, "timeout", m.cfg.ReleaseTimeout)
			ev.kind = endLost
		case <-w.hard.Done():
			ev.kind = endLost
		case <-w.intr:
			ev.kind = endLost
		}
		t.Stop()
	}
	if !handlerDone {
		hcancel()
		s.close()
		if herr = <-hdone; errors.Is(herr, context.Canceled) {
			herr = nil // the handler saw its context cancelled, as asked
		}
	}
	if ev.kind != endLost && herr == nil && ev.err == nil {
		w.settleAcks(cons, s.handedUpTo())
	}
	sub.stop()
	if herr != nil {
		// The handler has returned: nothing of this partition runs here any more, so hand it on now
		// rather than after PinnedTTL. What it did not ack is redelivered by the next owner's reset.
		if ev.kind != endLost || handlerDone {
			w.releaseRecord(rev)
		}
		return fmt.Errorf("partition %d: handler: %w", w.p, herr)
	}
	if ev.err != nil {
		return fmt.Errorf("partition %d: %w", w.p, ev.err)
	}
	if ev.kind == endReleased {
		w.releaseRecord(rev)
	}
	m.log.Debug("partition: ended", "partition", w.p, "kind", ev.kind, "redeliveries_dropped", s.droppedRedeliveries(), "gap", s.gap)
	return nil
}

// settleAcks waits (briefly) until the server has applied the handler's acks, so that the next
// owner's reset does not redeliver messages that were in fact made durable and acked.
func (w *worker) settleAcks(cons jetstream.PushConsumer, handed uint64) {
	if handed == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(w.hard, w.m.cfg.PinnedTTL/2)
	defer cancel()
	_ = w.m.nc.FlushWithContext(ctx)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.AckFloor.Stream >= handed {
			return
		}
		select {
		case <-ctx.Done():
			w.m.log.Debug("partition: acks not settled before release", "partition", w.p, "handed", handed)
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// releaseRecord hands the partition on: the record says released, so the next member takes it at
// once (its reset makes whatever this member left unacked deliverable again, first).
func (w *worker) releaseRecord(rev uint64) {
	ctx, cancel := context.WithTimeout(w.hard, apiTimeout)
	defer cancel()
	if _, err := w.m.writeOwner(ctx, w.p, ownerRecord{Member: w.m.id, Released: true}, rev); err != nil {
		w.m.log.Debug("partition: release", "partition", w.p, "err", err)
	}
}

// session is one ownership of a partition: it moves messages from the push subscription to the
// handler's channel in stream order, checking that no delivery was missed.
type session struct {
	mu          sync.Mutex
	ch          chan jetstream.Msg
	closed      bool   // ch is closed
	halted      bool   // no more messages are handed
	next        uint64 // the delivery (consumer) sequence expected next (0: any, the session's first)
	highest     uint64 // highest stream sequence handed
	partStream  bool   // the group reads a partition stream: messages are its copies
	redelivered int
	gap         [2]uint64 // expected and received delivery sequence of a gap
	ev          chan event
}

// onMsg runs on the subscription's goroutine and never blocks: ch holds MaxAckPending messages, the
// most the server has outstanding for this consumer. Deliveries are numbered without gaps from the
// session's first; a gap means a delivery was lost on the way (e.g. during a reconnect) and would come back
// later out of order, so the session stops handing and ends for a resync (a new reset). A redelivery
// of a message already handed (its handler has not acked it within AckWait) is dropped: the handler
// still holds it.
func (s *session) onMsg(msg *pushMsg) {
	md, err := msg.Metadata()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return
	}
	if err == nil && s.next == 0 {
		s.next = md.Sequence.Consumer
	}
	if err != nil || md.Sequence.Consumer != s.next {
		s.gap = [2]uint64{s.next, 0}
		if err == nil {
			s.gap[1] = md.Sequence.Consumer
		}
		s.haltLocked(event{kind: endResync})
		return
	}
	s.next++
	if md.Sequence.Stream <= s.highest {
		s.redelivered++
		return
	}
	select {
	case s.ch <- hand(msg, md, s.partStream):
		s.highest = md.Sequence.Stream
	default:
		s.haltLocked(event{kind: endResync})
	}
}

func (s *session) haltLocked(e event) {
	if s.halted {
		return
	}
	s.halted = true
	select {
	case s.ev <- e:
	default:
	}
}

// onEnd: the subscription lost its deliveries (missed heartbeats, a closed connection, a new consumer
// leader) or the consumer was deleted (err, fatal for the member).
func (s *session) onEnd(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.haltLocked(event{kind: endLost, err: err})
}

func (s *session) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.halted = true
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}

func (s *session) handedUpTo() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.highest
}

func (s *session) droppedRedeliveries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.redelivered
}
