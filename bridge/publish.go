package bridge

import (
	"cmp"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

const (
	// publishBatch is the most items the publisher takes from the buffer at once.
	publishBatch = 512
	// publishTick is how often the publisher closes idle drop ranges, refreshes the server's
	// max_payload and checks the stop deadline.
	publishTick = 100 * time.Millisecond
	// maxRejects is how often one message may fail on its own before the bridge gives it up (an FPM
	// becomes a dead letter) instead of retrying it forever: the server refused it (an API error other
	// than 503), or its ack never came while a publish sent after it was acknowledged.
	maxRejects = 3
	// finalMarkerWait bounds the wait for the acks of the drop markers published at stop.
	finalMarkerWait = 2 * time.Second
)

// ackEvent is the outcome of one asynchronous publish, delivered by nats.go's ack handlers, or the
// server's answer to a batch commit (reply set: the commit's reply subject; data and hdr the answer).
type ackEvent struct {
	msg   *nats.Msg
	ack   *jetstream.PubAck
	err   error
	at    time.Time // when nats.go delivered the outcome: the moment the bridge learnt it
	reply string
	data  []byte
	hdr   nats.Header
}

// publisher moves items from the buffer to JetStream in order, with at most MaxInFlight publishes
// awaiting an ack. On a failed or timed-out publish it stops taking new items, waits until every
// publish in flight is resolved, waits for the connection (exponential backoff), and republishes the
// failed items in their original order with their original Nats-Msg-Id; JetStream deduplicates the ones
// that were stored after all. It never drops an item on a publish error and never stops on one: only
// the connection closing for good stops it. A message that cannot be published (the client refuses it,
// or it failed maxRejects times on its own) is given up: an FPM becomes a dead letter (stage size or
// publish), a dead letter is lost (reason rejected), a drop marker is logged. A message is never
// handed to nats.go if its protocol line would exceed the server's max_control_line (see limits.go),
// the one per-message error on which the server closes the connection.
//
// The fields under "owned" belong to the publisher goroutine (or, after it has exited, to Run).
// nats.go's ack handlers only append to events, under evMu, and never block.
type publisher struct {
	b           *Bridge
	js          jetstream.JetStream
	maxInFlight int

	evMu     sync.Mutex
	events   []ackEvent
	evNotify chan struct{} // capacity 1

	inFlight   atomic.Int64 // == pending(), for Stats and the in-flight gauge
	inBatchesN atomic.Int64 // == inBatches, for tests
	serverMax  atomic.Int64 // the server's max_payload as last seen (0 before the first connect)
	markersPub atomic.Uint64

	// owned
	window     map[*nats.Msg]*item // single publishes awaiting an ack
	retry      []*item             // failed publishes, republished in order once the broker is back
	resend     []*item             // FPMs of batches the server refused, republished one by one
	markers    []*item             // drop markers not yet published
	unstored   []*item             // drop markers given up at stop, for the marker spool
	dlq        []*item             // dead letters of FPMs given up, not yet published
	held       int64               // the sizes of the items in window, retry and dlq: at most MaxBufferBytes plus one item
	sendN      uint64              // publishes attempted so far; item.sent numbers them
	ackedN     uint64              // the highest item.sent acknowledged
	recovering bool
	retryAt    time.Time
	// recoveringSince is when the current recovery began; stalls counts the recoveries that lasted
	// longer than liveProbe (a full disk, a broker restart): after one, each agreed run checks once
	// whether another bridge recorded it anew meanwhile (runs.go, afterStall).
	recoveringSince time.Time
	// outageSince is recoveringSince on the bridge's clock, resumedAt when the last recovery ended:
	// the runs received before it ended and agreed since it began wait for the other bridges'
	// evidence from when the first of them was agreed (runs.go).
	outageSince     time.Time
	resumedAt       time.Time
	stalls          int
	stallUnanswered int // the stall after which the runs bucket did not answer afterStall
	bo              *backoff.ExponentialBackOff
	final           bool // finishing: failures are logged, not retried
	fatal           error
	scratch         []*item
	evScratch       []ackEvent
	// ledger is what this bridge saw acknowledged (acked.go); reconnects the connection's reconnect
	// count when the lost_after_ack check last ran; ticks counts publishTicks towards the next
	// checkpoint.
	ledger     *ledger
	reconnects uint64
	ticks      int

	// Group commit (batch.go). atomic: the FPM streams taking batches (nil: none); batches: those in
	// flight by reply subject, batchesPer per stream, inBatches their FPMs; batchSub the commits'
	// reply subscription on batchInbox.*; batchBase + batchN name each batch; singlesUntil: one by one
	// until then.
	atomic       map[string]bool
	batches      map[string]*batch
	batchesPer   map[string]int
	inBatches    int
	batchSub     *nats.Subscription
	batchInbox   string
	batchBase    string
	batchN       uint64
	singlesUntil time.Time
}

func newPublisher(b *Bridge) *publisher {
	return &publisher{
		b:           b,
		maxInFlight: b.cfg.MaxInFlight,
		evNotify:    make(chan struct{}, 1),
		window:      make(map[*nats.Msg]*item, b.cfg.MaxInFlight),
		ledger:      newLedger(),
		bo: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(50*time.Millisecond),
			backoff.WithMaxInterval(5*time.Second),
			backoff.WithMaxElapsedTime(0),
		),
	}
}

// onAck and onErr are nats.go's async publish handlers. They run on nats.go goroutines (onErr with
// nats.go's publisher lock held), so they only record the event.
func (p *publisher) onAck(_ jetstream.JetStream, m *nats.Msg, pa *jetstream.PubAck) {
	p.pushEvent(ackEvent{msg: m, ack: pa, at: time.Now()})
}

func (p *publisher) onErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	p.pushEvent(ackEvent{msg: m, err: err})
}

func (p *publisher) pushEvent(ev ackEvent) {
	p.evMu.Lock()
	p.events = append(p.events, ev)
	p.evMu.Unlock()
	select {
	case p.evNotify <- struct{}{}:
	default:
	}
}

// run is the publisher goroutine. When drain is closed (the readers have stopped), it publishes what
// is left and returns once everything is acknowledged, or at *deadline, after reporting what is still
// unpublished as dropped (finish). It also returns, with p.fatal set, if the connection is closed.
func (p *publisher) run(drain <-chan struct{}, deadline *time.Time, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(publishTick)
	defer tick.Stop()
	retryTimer := time.NewTimer(time.Hour)
	retryTimer.Stop()
	defer retryTimer.Stop()
	// Wake up as soon as the connection is back instead of at the end of a backoff interval.
	status := p.b.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer p.b.nc.RemoveStatusListener(status)
	p.refreshServerMax()
	draining := false
	for {
		p.handleEvents()
		p.checkAfterReconnect()
		now := time.Now()
		p.expireBatches(now)
		if !draining {
			select {
			case <-drain:
				draining = true
				p.b.buf.closeIdle(now, true)
			default:
			}
		}
		if draining && !now.Before(*deadline) {
			p.finish()
			return
		}
		if p.recovering {
			p.recover(now)
			if p.fatal != nil {
				return
			}
		}
		if !p.recovering {
			p.publishMarkers()
			p.publishDeadLetters()
			p.fill()
		}
		if draining && p.idle() {
			return
		}

		var bufC <-chan struct{}
		if !p.recovering && p.pending() < p.maxInFlight {
			bufC = p.b.buf.notify
		}
		var retryC <-chan time.Time
		if p.recovering && p.pending() == 0 {
			retryTimer.Reset(time.Until(p.retryAt))
			retryC = retryTimer.C
		}
		var drainC <-chan struct{}
		if !draining {
			drainC = drain
		}
		select {
		case <-p.evNotify:
		case <-bufC:
		case <-retryC:
		case <-drainC:
		case st := <-status:
			if st == nats.CONNECTED && p.recovering {
				p.bo.Reset()
				p.retryAt = time.Now()
			}
		case now := <-tick.C:
			p.b.buf.closeIdle(now, false)
			p.refreshServerMax()
			if p.ticks++; time.Duration(p.ticks)*publishTick >= ackCheckpointInterval {
				p.ticks = 0
				if p.b.ckpt != nil {
					p.b.ckpt.offer(p.ledger)
				}
			}
		}
	}
}

// checkAfterReconnect runs the lost_after_ack check over the ledger once after each reconnect, before
// anything is published on the new connection: the server may have restarted without what it had
// acknowledged. Publishing waits for it (at most reconnectCheckBudget); the buffer takes the input
// meanwhile.
func (p *publisher) checkAfterReconnect() {
	if p.b.acks == nil {
		return
	}
	rc := p.b.nc.Stats().Reconnects
	if rc == p.reconnects || !p.b.nc.IsConnected() {
		return
	}
	p.reconnects = rc
	n, err := p.b.checkLedger(p.ledger)
	switch {
	case err != nil:
		p.b.log.Error("lost_after_ack check after reconnect incomplete", "lost_reported", n, "error", err)
	case n > 0:
		p.b.log.Error("lost_after_ack check after reconnect: acknowledged FPMs are gone from the stream", "lost", n)
	}
}

func (p *publisher) refreshServerMax() {
	if p.b.nc.IsConnected() {
		p.serverMax.Store(p.b.nc.MaxPayload())
	}
}

// idle reports whether nothing is left to publish or acknowledge.
func (p *publisher) idle() bool {
	return p.pending() == 0 && len(p.retry) == 0 && len(p.resend) == 0 && len(p.markers) == 0 && len(p.dlq) == 0 &&
		p.b.buf.len() == 0 && p.b.buf.nOpen.Load() == 0 && !p.b.buf.pendingMarkers()
}

// send publishes it asynchronously and adds it to the window. A message whose protocol line would
// exceed the server's max_control_line is refused here (errSubjectTooLong): the server would close
// the connection on it.
func (p *publisher) send(it *item) error {
	if it.kind == kindFPM {
		clearBatchHeaders(it)
		if err := p.b.stamp(it); err != nil {
			return err
		}
	}
	if err := p.b.checkLine(it.msg); err != nil {
		return err
	}
	if _, err := p.js.PublishMsgAsync(it.msg); err != nil {
		return err
	}
	p.sendN++
	it.sent = p.sendN
	p.window[it.msg] = it
	p.storeInFlight()
	return nil
}

// permanent reports whether a synchronous publish error can never succeed for this message.
func permanent(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, errSubjectTooLong) || errors.Is(err, nats.ErrBadSubject) ||
		errors.Is(err, nats.ErrHeadersNotSupported) || errors.Is(err, nats.ErrBadHeaderMsg)
}

// fill publishes items from the buffer while the window has room, in messages (MaxInFlight) and in
// bytes: what the publisher holds is bounded by MaxBufferBytes like the buffer itself. With group
// commit (batch.go) a queue of at least minBatch items is taken whole and sent as batches; a shorter
// one waits while a batch is in flight (it joins the next batch) and otherwise goes one by one while
// fewer than maxSingles single publishes are in flight. FPMs that a batch's refusal left to republish
// one by one go first.
func (p *publisher) fill() {
	if p.b.opts.hold != nil {
		select {
		case <-p.b.opts.hold:
		default:
			return
		}
	}
	p.publishQueued(&p.resend)
	for {
		free := p.maxInFlight - p.pending()
		budget := p.b.cfg.MaxBufferBytes - p.held
		if free <= 0 || budget <= 0 || p.recovering {
			return
		}
		n := min(free, publishBatch)
		if p.atomic != nil {
			switch {
			case p.b.buf.len() >= minBatch && p.batchingNow(time.Now()):
				n = min(free, maxBatch*len(p.atomic))
			case p.inBatches > 0:
				return // a backlog is being committed: what arrives meanwhile waits for the next batch
			case len(p.window) >= maxSingles:
				return // the queue grows into a batch, or the acks make room
			default:
				n = min(n, maxSingles-len(p.window))
			}
		}
		batch := p.b.buf.popBytes(p.scratch[:0], n, budget)
		if len(batch) == 0 {
			return
		}
		for _, it := range batch {
			p.held += it.size
		}
		if rest, err := p.sendGrouped(batch); err != nil {
			p.retry = append(p.retry, rest...)
			p.enterRecovery(err)
		}
		clear(batch)
		p.scratch = batch[:0]
		if p.recovering {
			return
		}
	}
}

// byOrder orders items by their enqueue order: failed items are republished in it, and those left at
// stop are resolved in it.
func byOrder(a, b *item) int { return cmp.Compare(a.order, b.order) }

// sendInOrder sends items in order, rejecting those that can never be published, and stops at the
// first failure that may pass: it returns that item's index and the error (len(items) and nil when
// every item went).
func (p *publisher) sendInOrder(items []*item) (int, error) {
	for i, it := range items {
		err := p.send(it)
		if err == nil {
			continue
		}
		if !permanent(err) {
			return i, err
		}
		p.reject(it, err)
	}
	return len(items), nil
}

// publishMarkers publishes the drop markers closed since the last call, while the window has room.
func (p *publisher) publishMarkers() {
	for _, r := range p.b.buf.takeMarkers() {
		p.markers = append(p.markers, p.b.markerItem(r))
	}
	p.publishQueued(&p.markers)
}

// publishDeadLetters publishes the dead letters of given-up FPMs while the window has room.
func (p *publisher) publishDeadLetters() { p.publishQueued(&p.dlq) }

// publishQueued publishes the items of queue in order while the window has room, taking each off the
// queue once it is sent or rejected for good; on a failure that may pass it enters recovery and leaves
// the item at the head of the queue, to be sent again after it.
func (p *publisher) publishQueued(queue *[]*item) {
	for len(*queue) > 0 && p.pending() < p.maxInFlight && !p.recovering {
		it := (*queue)[0]
		if err := p.send(it); err != nil {
			if !permanent(err) {
				p.enterRecovery(err)
				return
			}
			p.reject(it, err)
		}
		*queue = (*queue)[1:]
	}
}

// enterRecovery stops new publishes until the failed ones are republished.
func (p *publisher) enterRecovery(err error) {
	if p.recovering || p.final {
		return
	}
	p.recovering = true
	p.recoveringSince, p.outageSince = time.Now(), p.b.now()
	p.retryAt = time.Now().Add(p.bo.NextBackOff())
	p.b.log.Warn("publish failed; holding new messages until the broker acknowledges again",
		"error", err, "in_flight", p.pending(), "buffered", p.b.buf.len())
}

// recover republishes the failed items, in their original order, once nothing is in flight and the
// connection is up; on a new failure it waits for the next backoff interval.
func (p *publisher) recover(now time.Time) {
	if p.pending() > 0 || now.Before(p.retryAt) {
		return
	}
	if p.b.nc.IsClosed() {
		p.fatal = errConnClosed
		return
	}
	if !p.b.nc.IsConnected() {
		p.retryAt = now.Add(p.bo.NextBackOff())
		return
	}
	p.refreshServerMax()
	slices.SortFunc(p.retry, byOrder)
	// Failed batches are retried whole: sendGrouped batches them again (see batch.go).
	if rest, err := p.sendGrouped(p.retry); err != nil {
		slices.SortFunc(rest, byOrder)
		n := copy(p.retry, rest)
		clear(p.retry[n:])
		p.retry = p.retry[:n]
		p.retryAt = now.Add(p.bo.NextBackOff())
		return
	}
	clear(p.retry)
	p.retry = p.retry[:0]
	p.recovering = false
	p.resumedAt = p.b.now()
	if now.Sub(p.recoveringSince) > liveProbe {
		p.stalls++
	}
	p.bo.Reset()
	p.b.log.Info("publishing resumed", "in_flight", p.pending(), "buffered", p.b.buf.len())
}

// handleEvents applies the outcomes delivered by the ack handlers since the last call.
func (p *publisher) handleEvents() {
	p.evMu.Lock()
	evs := p.events
	p.events = p.evScratch[:0]
	p.evMu.Unlock()
	for _, ev := range evs {
		if ev.reply != "" {
			p.batchEvent(ev)
			continue
		}
		it := p.window[ev.msg]
		if it == nil {
			continue // resolved earlier (for example reported dropped at stop)
		}
		delete(p.window, ev.msg)
		if ev.err == nil {
			p.acked(it, ev.ack.Sequence, ev.ack.Duplicate, ev.at)
		} else {
			p.failed(it, ev.err)
		}
	}
	p.storeInFlight()
	clear(evs)
	p.evScratch = evs[:0]
}

// acked applies the ack of item it, stored at stream sequence streamSeq (dup: an earlier publication
// of its id had been).
func (p *publisher) acked(it *item, streamSeq uint64, dup bool, at time.Time) {
	p.ackedN = max(p.ackedN, it.sent)
	p.held -= it.size
	switch it.kind {
	case kindFPM:
		it.streamSeq = streamSeq
		p.ledger.acked(it.key, it.agreed, it.seq, streamSeq)
		p.b.ranks[it.slot].countPublished(dup)
		p.b.metrics.receiveToAck.Observe(at.Sub(it.recv).Seconds())
		if p.b.opts.onAck != nil {
			p.b.opts.onAck(it, at)
		}
	case kindDeadLetter:
		p.b.ranks[it.slot].countDeadLettered()
	case kindMarker:
		p.markersPub.Add(1)
		p.b.metrics.markers.Inc()
		p.b.spoolStored(it)
		r := it.marker
		p.b.log.Warn("FPMs dropped by the bridge (drop marker stored)", "key", r.key.String(), "epoch", r.epoch,
			"first_seq", r.first, "last_seq", r.last, "count", r.count, "reason", r.reason)
	}
}

func (p *publisher) failed(it *item, err error) {
	if p.final {
		p.lost(it, err)
		return
	}
	// A failure is this message's own when the server refused it (an API error other than 503), or
	// when a publish sent after it was acknowledged: the connection works, only this message gets no
	// ack (for example a publish permission violation). While the broker is away nothing later is
	// acknowledged, so an outage never gives a message up.
	// An answer that says the stream could not decide yet (undecided) is never this message's own,
	// however many later publishes were acknowledged meanwhile.
	var apiErr *jetstream.APIError
	isAPI := errors.As(err, &apiErr)
	if (isAPI && !undecided(apiErr)) && (apiErr.Code != 503 || p.ackedN > it.sent) || (!isAPI && p.ackedN > it.sent) {
		it.errs++
		if it.errs >= maxRejects {
			p.reject(it, err)
			return
		}
	}
	p.retry = append(p.retry, it)
	p.enterRecovery(err)
}

// Server answers about a publish that say the stream could not decide on it now, not that it refuses
// it: the same message id being stored by another publish (a retry racing its original across a stream
// leader change; the retry then gets the duplicate's ack) and a replica that is not the leader (an
// election in progress). Neither constant is exported by nats.go.
const (
	errCodeDuplicateInProcess jetstream.ErrorCode = 10158 // JSStreamDuplicateMessageConflict
	errCodeNotLeader          jetstream.ErrorCode = 10009 // JSClusterNotLeaderErr
)

// undecided reports whether e is such an answer: retried like an outage, never counted towards
// maxRejects.
func undecided(e *jetstream.APIError) bool {
	return e.ErrorCode == errCodeDuplicateInProcess || e.ErrorCode == errCodeNotLeader
}

// reject gives up a message the server or client refuses for good. An FPM becomes a dead letter (stage
// size when it was too large, publish otherwise) carrying its body, so it is counted as invalid, never
// as dropped: it was not stored.
func (p *publisher) reject(it *item, err error) {
	p.b.log.Error("message rejected; giving it up", "subject", boundHeader(it.msg.Subject), "error", err)
	switch it.kind {
	case kindFPM:
		stage := streams.StagePublish
		if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, errSubjectTooLong) {
			stage = streams.StageSize
		}
		p.dlq = append(p.dlq, p.b.publishDeadLetter(it, stage, err))
	case kindDeadLetter:
		p.held -= it.size
		p.b.ranks[it.slot].countDeadLetterLost(reasonRejected)
	case kindMarker:
		p.lost(it, err)
	}
}

// lost logs a drop marker that could not be stored: the last place its information survives.
func (p *publisher) lost(it *item, err error) {
	if it.kind != kindMarker {
		return
	}
	if !permanent(err) {
		p.unstored = append(p.unstored, it)
	}
	r := it.marker
	p.b.log.Error("drop marker could not be stored", "key", r.key.String(), "epoch", r.epoch,
		"first_seq", r.first, "last_seq", r.last, "count", r.count, "reason", r.reason, "error", err)
}

// finish ends a stop that ran out of time (or a dead connection): every FPM not yet acknowledged is
// counted as dropped with reason shutdown and covered by a drop marker, and the markers are published
// if the broker is reachable. An FPM counted here may still have been stored if its ack was lost.
// finish runs on the publisher goroutine, or on Run's once the publisher goroutine has exited.
func (p *publisher) finish() {
	p.handleEvents()
	p.final = true
	left := make([]*item, 0, p.pending()+len(p.retry)+len(p.resend)+p.b.buf.len())
	for _, it := range p.window {
		left = append(left, it)
	}
	clear(p.window)
	for _, b := range p.batches {
		left = append(left, b.items...)
	}
	clear(p.batches)
	clear(p.batchesPer)
	p.inBatches = 0
	p.storeInFlight()
	left = append(left, p.retry...)
	p.retry = nil
	left = append(left, p.resend...)
	p.resend = nil
	left = append(left, p.dlq...)
	p.dlq = nil
	p.held = 0 // everything left is resolved below
	for {
		n := len(left)
		left = p.b.buf.pop(left, publishBatch)
		if len(left) == n {
			break
		}
	}
	slices.SortFunc(left, byOrder)
	now := time.Now()
	p.b.buf.closeIdle(now, true)
	var fpms, deadLetters int
	for _, it := range left {
		switch it.kind {
		case kindFPM:
			fpms++
			p.b.ranks[it.slot].countDropped(reasonShutdown)
			p.b.buf.recordDrop(it, reasonShutdown)
		case kindDeadLetter:
			deadLetters++
			p.b.ranks[it.slot].countDeadLetterLost(reasonShutdown)
		case kindMarker:
			p.markers = append(p.markers, it)
		}
	}
	p.b.buf.closeIdle(now, true)
	for _, r := range p.b.buf.takeMarkers() {
		p.markers = append(p.markers, p.b.markerItem(r))
	}
	if fpms > 0 || deadLetters > 0 {
		p.b.log.Error("stopped with unacknowledged messages; reported as dropped (reason shutdown)",
			"fpms", fpms, "dead_letters", deadLetters, "drop_markers", len(p.markers))
	}
	p.publishFinalMarkers()
}

// publishFinalMarkers publishes the remaining drop markers if the broker is reachable and waits up to
// finalMarkerWait for their acks; markers not stored are logged.
func (p *publisher) publishFinalMarkers() {
	if len(p.markers) == 0 {
		return
	}
	if p.b.nc.IsConnected() {
		for _, it := range p.markers {
			if err := p.send(it); err != nil {
				p.lost(it, err)
			}
		}
		p.markers = nil
		wait := min(p.b.cfg.AckTimeout, finalMarkerWait)
		if wait <= 0 {
			wait = finalMarkerWait
		}
		timeout := time.NewTimer(wait)
		defer timeout.Stop()
		for len(p.window) > 0 {
			select {
			case <-p.evNotify:
				p.handleEvents()
			case <-timeout.C:
				for _, it := range p.window {
					p.lost(it, errors.New("no ack before the stop deadline"))
				}
				clear(p.window)
				p.inFlight.Store(0)
			}
		}
		return
	}
	for _, it := range p.markers {
		p.lost(it, nats.ErrDisconnected)
	}
	p.markers = nil
}
