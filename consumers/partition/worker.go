package partition

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// probeWait is how long one standby pull waits for the partition to be pinned to this member.
const probeWait = time.Second

// worker runs one partition assigned to its member: it waits, as a pinned-client standby, until the
// server pins the partition consumer to it, then owns the partition in a session (reset to the ack
// floor, pull, hand to the handler) until it is released, loses the pin, or must resync.
type worker struct {
	m         *Member
	p         int
	name      string
	hard      context.Context // the member's: done means give everything up abruptly
	rel       context.Context // done once released (or hard)
	relCancel context.CancelFunc
	intr      chan struct{} // end the current session abruptly (disconnected), keep the partition
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
	backoff := 100 * time.Millisecond
	retry := func(what string, err error) {
		w.m.log.Debug("partition: retrying", "partition", w.p, "op", what, "err", err)
		w.sleep(backoff)
		backoff = min(backoff*2, 2*time.Second)
	}
	var cons jetstream.Consumer
	for cons == nil {
		if w.released() {
			return nil
		}
		ctx, cancel := context.WithTimeout(w.rel, apiTimeout)
		c, err := w.m.stream.Consumer(ctx, w.name) // own handle: nats.go keeps the pin id per handle
		cancel()
		switch {
		case err == nil:
			cons = c
		case fatal(err):
			return fmt.Errorf("partition %d: consumer %s: %w", w.p, w.name, err)
		default:
			retry("lookup", err)
		}
	}
	var lastCheck time.Time
	for !w.released() {
		pinned, err := w.probe(cons)
		if err != nil {
			if fatal(err) {
				return fmt.Errorf("partition %d: %w", w.p, err)
			}
			retry("probe", err)
			continue
		}
		backoff = 100 * time.Millisecond
		if !pinned {
			if time.Since(lastCheck) >= w.m.cfg.PinnedTTL/2 {
				lastCheck = time.Now()
				w.unstick(cons)
			}
			continue
		}
		if w.released() {
			w.unpin() // pinned while being released: hand it on at once
			return nil
		}
		for again := true; again && !w.released(); {
			select { // an interrupt from before this session does not concern it
			case <-w.intr:
			default:
			}
			// A resync keeps the pin and takes the partition again at once: what the session left
			// unacked is not deliverable until the reset, so a probe would not get it.
			again, err = w.own(cons, h)
			if err != nil {
				var r retryable
				if !errors.As(err, &r) {
					return err
				}
				retry("own", err)
			}
		}
	}
	return nil
}

// unstick makes an unowned partition deliverable at once, so that the next probe wins the pin. The
// server pins a partition only when it delivers a message:
//
//   - if the last owner crashed holding every remaining message unacked and nothing new arrives,
//     nothing is deliverable until AckWait expires: a reset to the ack floor makes them deliverable;
//   - if it crashed (or left) with everything acked and nothing new arrives, nothing is ever
//     deliverable, and a handler that acts on time (a gap detector's stale publishers, a gap waiting
//     for its grace) would never run for the partition: a reset to the last acked message delivers
//     that one again (a redelivery of a durable message, which the handler recognises and skips).
//
// Either way only when the consumer has no pinned client (nobody owns it).
func (w *worker) unstick(cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(w.rel, apiTimeout)
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil || info.NumAckPending == 0 && (info.NumPending > 0 || info.AckFloor.Stream == 0) {
		return // nothing to own yet, or something deliverable that will pin the partition
	}
	for _, g := range info.PriorityGroups {
		if g.PinnedClientID != "" {
			return
		}
	}
	if info.NumAckPending > 0 {
		if _, err := w.m.stream.ResetConsumer(ctx, w.name); err != nil {
			w.m.log.Debug("partition: unstick reset", "partition", w.p, "err", err)
			return
		}
		w.m.log.Debug("partition: unowned with unacked messages: reset", "partition", w.p, "unacked", info.NumAckPending)
		return
	}
	if _, err := w.m.stream.ResetConsumerToSequence(ctx, w.name, info.AckFloor.Stream); err != nil {
		w.m.log.Debug("partition: unstick idle reset", "partition", w.p, "err", err)
		return
	}
	w.m.log.Debug("partition: unowned and idle: last acked message made deliverable", "partition", w.p, "seq", info.AckFloor.Stream)
}

// probe is one standby pull of one message. The server delivers it only once the partition is pinned
// to this member (it then stays pinned: the message is not acked and is redelivered after the reset).
func (w *worker) probe(cons jetstream.Consumer) (bool, error) {
	ctx, cancel := context.WithTimeout(w.hard, probeWait)
	defer cancel()
	b, err := cons.Fetch(1, jetstream.FetchPriorityGroup(PriorityGroup), jetstream.FetchContext(ctx))
	if err != nil {
		return false, err
	}
	n := 0
	for range b.Messages() {
		n++
	}
	if n > 0 {
		return true, nil
	}
	switch err := b.Error(); {
	case err == nil, errors.Is(err, jetstream.ErrPinIDMismatch), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled), errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoMessages):
		return false, nil
	default:
		return false, err
	}
}

type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

type endKind int

const (
	endReleased endKind = iota // graceful: unpin afterwards
	endResync                  // graceful: keep the pin, take the partition again (reset)
	endLost                    // abrupt: handler context cancelled, no unpin
)

type event struct {
	kind endKind
	err  error // fatal for the member, with endLost
}

// own runs one ownership session of the partition: reset the consumer to its ack floor (so every
// message not acked by a previous owner comes again, in stream order, before any newer one), pull,
// and hand messages to h until the session ends.
func (w *worker) own(cons jetstream.Consumer, h Handler) (resync bool, err error) {
	m := w.m
	ctx, cancel := context.WithTimeout(w.hard, apiTimeout)
	resp, err := m.stream.ResetConsumer(ctx, w.name)
	cancel()
	if err != nil {
		if fatal(err) {
			return false, fmt.Errorf("partition %d: reset %s: %w", w.p, w.name, err)
		}
		return false, retryable{fmt.Errorf("partition %d: reset %s: %w", w.p, w.name, err)}
	}
	// After a reset the server numbers deliveries from 1 again. (The reset response's Delivered can
	// transiently still count the probe's delivery, so it is not used.) A first delivery numbered
	// otherwise means someone else was served in between: the session resyncs.
	s := &session{
		ch:         make(chan jetstream.Msg, m.cfg.MaxAckPending),
		next:       1,
		partStream: m.cfg.PartitionStream() != "",
		ev:         make(chan event, 1),
	}
	cc, err := cons.Consume(s.onMsg,
		jetstream.PullPriorityGroup(PriorityGroup),
		jetstream.PullMaxMessages(m.cfg.Batch),
		jetstream.PullExpiry(max(m.cfg.PinnedTTL/3, time.Second)),
		jetstream.ConsumeErrHandler(s.onErr))
	if err != nil {
		return false, retryable{fmt.Errorf("partition %d: consume: %w", w.p, err)}
	}
	hctx, hcancel := context.WithCancel(w.hard)
	defer hcancel()
	hdone := make(chan error, 1)
	go func() { hdone <- h(hctx, w.p, s.ch) }()
	m.setOwned(w.p, true)
	defer m.setOwned(w.p, false)
	m.log.Debug("partition: acquired", "partition", w.p, "from_seq", resp.ResetSeq)

	var ev event
	var herr error
	handlerDone := false
	select {
	case <-w.rel.Done():
		ev.kind = endReleased
		if w.hard.Err() != nil {
			ev.kind = endLost
		}
	case ev = <-s.ev:
	case <-w.intr:
		ev.kind = endLost
	case herr = <-hdone:
		handlerDone = true
		if herr == nil {
			herr = ErrHandlerReturned
		}
		ev.kind = endLost
	}
	if ev.kind != endLost {
		// Graceful: the handler gets no more messages, drains what it has, makes it durable and acks.
		// Pulls go on meanwhile so the pin stays ours; what they deliver is dropped (unacked, it comes
		// again after the next owner's reset).
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
	stopConsume(cc)
	if herr != nil {
		// The handler has returned: nothing of this partition runs here any more, so hand it on now
		// rather than after PinnedTTL. What it did not ack is redelivered by the next owner's reset.
		if ev.kind != endLost || handlerDone {
			w.unpin()
		}
		return false, fmt.Errorf("partition %d: handler: %w", w.p, herr)
	}
	if ev.err != nil {
		return false, fmt.Errorf("partition %d: %w", w.p, ev.err)
	}
	if ev.kind != endLost {
		w.settleAcks(cons, s.handedUpTo())
	}
	if ev.kind == endReleased {
		w.unpin()
	}
	m.log.Debug("partition: ended", "partition", w.p, "kind", ev.kind, "redeliveries_dropped", s.droppedRedeliveries(), "gap", s.gap)
	return ev.kind == endResync, nil
}

func stopConsume(cc jetstream.ConsumeContext) {
	cc.Stop()
	t := time.NewTimer(apiTimeout)
	defer t.Stop()
	select {
	case <-cc.Closed():
	case <-t.C:
	}
}

// settleAcks waits (briefly) until the server has applied the handler's acks, so that the next
// owner's reset does not redeliver messages that were in fact made durable and acked.
func (w *worker) settleAcks(cons jetstream.Consumer, handed uint64) {
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
			w.m.log.Debug("partition: acks not settled before unpin", "partition", w.p, "handed", handed)
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// unpin hands the partition on: the server pins it to the next waiting member at once. It first
// resets the consumer to its ack floor (the pin is still ours), so that whatever this member leaves
// unacked (delivered while it drained, or given up by a failed handler) is deliverable now rather than
// after AckWait: the server pins a partition only when it has a message to deliver.
func (w *worker) unpin() {
	ctx, cancel := context.WithTimeout(w.hard, apiTimeout)
	defer cancel()
	if _, err := w.m.stream.ResetConsumer(ctx, w.name); err != nil {
		w.m.log.Debug("partition: reset before unpin", "partition", w.p, "err", err)
	}
	if err := w.m.stream.UnpinConsumer(ctx, w.name, PriorityGroup); err != nil {
		w.m.log.Debug("partition: unpin", "partition", w.p, "err", err)
	}
}

// session is one ownership of a partition: it moves messages from the pull subscription to the
// handler's channel in stream order, checking that no delivery was missed.
type session struct {
	mu          sync.Mutex
	ch          chan jetstream.Msg
	closed      bool   // ch is closed
	halted      bool   // no more messages are handed
	next        uint64 // the delivery (consumer) sequence expected next
	highest     uint64 // highest stream sequence handed
	partStream  bool   // the group reads a partition stream: messages are its copies
	redelivered int
	gap         [2]uint64 // expected and received delivery sequence of a gap
	ev          chan event
}

// onMsg runs on the subscription's goroutine and never blocks: ch holds MaxAckPending messages, the
// most the server has outstanding for this consumer. Deliveries are numbered without gaps from the
// reset; a gap means a delivery was lost on the way (e.g. during a reconnect) and would come back
// later out of order, so the session stops handing and ends for a resync (a new reset). A redelivery
// of a message already handed (its handler has not acked it within AckWait) is dropped: the handler
// still holds it.
func (s *session) onMsg(msg jetstream.Msg) {
	md, err := msg.Metadata()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halted {
		return
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

func (s *session) onErr(_ jetstream.ConsumeContext, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case errors.Is(err, jetstream.ErrPinIDMismatch), errors.Is(err, jetstream.ErrConsumerLeadershipChanged),
		errors.Is(err, jetstream.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionClosed):
		s.haltLocked(event{kind: endLost})
	case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
		s.haltLocked(event{kind: endLost, err: err})
	}
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
