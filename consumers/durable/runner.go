package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// apiTimeout bounds one JetStream API call made by the runner itself.
const apiTimeout = 5 * time.Second

// errStopped is what a partition handler returns when the runner stopped under it.
var errStopped = errors.New("durable: runner stopped")

// Runner runs one Consumer as a member of its partition group. Run owns the loop goroutine, which
// makes every call into the Consumer; partition handlers (one goroutine per owned partition, the
// partition package's) only move messages to the loop. A Runner runs once.
type Runner struct {
	cfg      Config
	js       jetstream.JetStream
	c        Consumer
	obs      PartitionObserver // nil when the stage keeps no per-partition state
	group    partition.Config  // cfg.Group as the partition package takes it; defaults filled once joined
	log      *slog.Logger
	reg      prometheus.Registerer
	memberID string
	now      func() time.Time
	m        *metrics

	running atomic.Bool
	ready   chan struct{}
	items   chan item
	wakeCh  chan struct{}
	doCh    chan func()
	quit    chan struct{} // closed when the loop has ended: handlers stop waiting for it
	member  atomic.Pointer[partition.Member]

	// readsOwnStream: the group's consumers read its own stream (one partition), so a message's
	// sequence there is its own; a partition stream's copy carries it in a header.
	readsOwnStream bool

	// Loop only.
	sessions map[int]*session
	fatal    error
	kv       jetstream.KeyValue // attemptsBucket, once a session started
}

type itemKind int

const (
	itemGain itemKind = iota
	itemBatch
	itemRelease
	itemLost
)

// item is what a partition handler sends to the loop; one channel keeps each handler's items in order.
type item struct {
	kind itemKind
	s    *session
	msgs []jetstream.Msg
}

// New checks cfg and returns a Runner for c on js. A group with Partitions 0 gets one per shard of its
// stream: on stream FPM New asks the server how many shards it has (Shards, when not set). Nothing is
// declared on the server before Run.
func New(cfg Config, js jetstream.JetStream, c Consumer, opts ...Option) (*Runner, error) {
	if js == nil || c == nil {
		return nil, fmt.Errorf("%w: nil JetStream or consumer", errInvalidConfig)
	}
	g, err := cfg.Group.resolve(js)
	if err != nil {
		return nil, fmt.Errorf("durable: %s: FPM shards: %w", cfg.Name, err)
	}
	cfg.Group = g
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		cfg:      cfg.withDefaults(),
		js:       js,
		c:        c,
		ready:    make(chan struct{}),
		items:    make(chan item),
		wakeCh:   make(chan struct{}, 1),
		doCh:     make(chan func(), 16),
		quit:     make(chan struct{}),
		sessions: map[int]*session{},
	}
	r.obs, _ = c.(PartitionObserver)
	set, err := ApplyOptions(errInvalidConfig, opts)
	if err != nil {
		return nil, err
	}
	r.group = r.cfg.Group.partition()
	r.log, r.reg, r.memberID, r.now = r.cfg.Logger.With("consumer", cfg.Name), cfg.Registerer, set.MemberID, time.Now
	r.m = newMetrics(cfg.Name)
	return r, nil
}

// Ready is closed once Run has joined the group and is taking partitions.
func (r *Runner) Ready() <-chan struct{} { return r.ready }

// Owned lists the partitions this runner owns now.
func (r *Runner) Owned() []int {
	if m := r.member.Load(); m != nil {
		return m.Owned()
	}
	return nil
}

// Do runs fn on the loop goroutine, between two calls into the Consumer: a stage's own goroutines
// hand their results back this way. It returns false (fn not run) once the runner has stopped.
func (r *Runner) Do(fn func()) bool {
	select {
	case r.doCh <- fn:
		return true
	case <-r.quit:
		return false
	}
}

func (r *Runner) wake() {
	select {
	case r.wakeCh <- struct{}{}:
	default:
	}
}

// Run joins the group and consumes until ctx ends, then stops gracefully within StopTimeout: it stops
// fetching, releases every partition (Release, acks, hand-over), calls Close and returns nil. It
// returns an error when the Consumer failed, the group could not be joined or the connection closed
// for good; the partitions then go to other instances and what was not done is redelivered there.
func (r *Runner) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer close(r.quit)
	popts := []partition.Option{partition.WithLogger(r.log)}
	if r.memberID != "" {
		popts = append(popts, partition.WithMemberID(r.memberID))
	}
	member, err := partition.Join(ctx, r.js, r.group, popts...)
	if err != nil {
		return fmt.Errorf("durable: %s: join group %s: %w", r.cfg.Name, r.group.Group, err)
	}
	r.member.Store(member)
	r.group = member.Config() // defaults filled in
	r.readsOwnStream = r.group.ConsumerStream() == r.group.Stream
	if r.reg != nil {
		for _, c := range r.m.collectors() {
			if err := r.reg.Register(c); err != nil {
				return fmt.Errorf("durable: %s: register metrics: %w", r.cfg.Name, err)
			}
			defer r.reg.Unregister(c)
		}
	}
	consumed := make(chan error, 1)
	go func() { consumed <- member.Consume(context.Background(), r.handle) }()
	close(r.ready)
	r.log.Info("consumer running", "group", r.group.Group, "stream", r.group.Stream,
		"partitions", r.group.Partitions, "member", member.ID())

	loopCtx, cancelLoop := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLoop()
	var tick <-chan time.Time
	if r.cfg.TickInterval > 0 {
		t := time.NewTicker(r.cfg.TickInterval)
		defer t.Stop()
		tick = t.C
	}
	keepAlive := time.NewTicker(max(r.group.AckWait/6, 100*time.Millisecond))
	defer keepAlive.Stop()

	stopping := false
	stopDone := make(chan struct{})
	stop := func(graceful bool) {
		if stopping {
			return
		}
		stopping = true
		sctx, cancel := context.WithTimeout(context.Background(), r.cfg.StopTimeout)
		if !graceful {
			cancel() // abrupt: every partition is given up at once, nothing more is written
		}
		go func() {
			defer cancel()
			defer close(stopDone)
			_ = member.Stop(sctx)
		}()
	}
	done := ctx.Done()
	var memberErr error
loop:
	for {
		select {
		case it := <-r.items:
			if err := r.apply(loopCtx, it); err != nil && r.fatal == nil {
				r.fatal = err
				stop(false)
			}
		case <-r.wakeCh:
		case fn := <-r.doCh:
			fn()
		case <-tick:
			if r.fatal == nil {
				if err := r.c.Tick(loopCtx, r.now()); err != nil {
					r.fatal = fmt.Errorf("durable: %s: tick: %w", r.cfg.Name, err)
					stop(false)
				}
			}
		case <-keepAlive.C:
			r.keepAlive()
		case memberErr = <-consumed:
			break loop
		case <-done:
			done = nil
			r.log.Info("consumer stopping", "timeout", r.cfg.StopTimeout)
			stop(true)
		}
		if r.fatal == nil {
			r.settle(loopCtx)
		}
	}
	if stopping {
		<-stopDone
	}
	for _, s := range r.sessions { // a session the member ended without a release or loss item
		r.forget(s)
	}
	cctx, cancel := context.WithTimeout(context.Background(), r.cfg.StopTimeout)
	defer cancel()
	closeErr := r.c.Close(cctx)
	switch {
	case r.fatal != nil:
		return r.fatal
	case memberErr != nil:
		return fmt.Errorf("durable: %s: %w", r.cfg.Name, memberErr)
	case closeErr != nil:
		return fmt.Errorf("durable: %s: close: %w", r.cfg.Name, closeErr)
	case !stopping:
		return fmt.Errorf("durable: %s: group membership ended", r.cfg.Name)
	}
	r.log.Info("consumer stopped")
	return nil
}

// handle is the partition.Handler: it moves the partition's messages to the loop in batches and,
// when the partition is revoked, waits until the loop has released it.
func (r *Runner) handle(ctx context.Context, p int, msgs <-chan jetstream.Msg) error {
	s := newSession(r, ctx, p)
	if !r.send(ctx, item{kind: itemGain, s: s}) {
		return r.lose(s)
	}
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return r.release(ctx, s)
			}
			// Sized for the messages already waiting: a full batch is one allocation, not five.
			batch := make([]jetstream.Msg, 1, min(1+len(msgs), r.cfg.Batch))
			batch[0] = m
			closed := false
		more:
			for len(batch) < r.cfg.Batch {
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
			if !r.send(ctx, item{kind: itemBatch, s: s, msgs: batch}) {
				return r.lose(s)
			}
			if closed {
				return r.release(ctx, s)
			}
		case <-ctx.Done():
			return r.lose(s)
		}
	}
}

func (r *Runner) send(ctx context.Context, it item) bool {
	select {
	case r.items <- it:
		return true
	case <-ctx.Done():
		return false
	case <-r.quit:
		return false
	}
}

func (r *Runner) release(ctx context.Context, s *session) error {
	if !r.send(ctx, item{kind: itemRelease, s: s}) {
		return r.lose(s)
	}
	select {
	case <-s.released:
		return nil
	case <-ctx.Done():
		return r.lose(s)
	case <-r.quit:
		return r.lose(s)
	}
}

// lose marks s lost and tells the loop, which forgets the partition without writing.
func (r *Runner) lose(s *session) error {
	s.lost.Store(true)
	select {
	case r.items <- item{kind: itemLost, s: s}:
	case <-r.quit:
	}
	if err := s.ctx.Err(); err != nil {
		return err
	}
	return errStopped
}

// apply handles one item on the loop. Once the runner has failed, only losses are applied.
func (r *Runner) apply(ctx context.Context, it item) error {
	s := it.s
	if it.kind == itemLost || s.lost.Load() {
		if r.sessions[s.p] == s {
			r.forget(s)
		}
		if it.kind == itemRelease {
			close(s.released)
		}
		return nil
	}
	if r.fatal != nil {
		if it.kind == itemRelease {
			r.forget(s)
			close(s.released)
		}
		return nil
	}
	switch it.kind {
	case itemGain:
		if old := r.sessions[s.p]; old != nil {
			r.forget(old)
		}
		r.sessions[s.p] = s
		var floor uint64
		err := r.retry(ctx, s, "ack floor", func() (err error) {
			floor, err = r.ackFloor(ctx, s.p)
			return err
		})
		if err != nil {
			return fmt.Errorf("durable: %s: partition %d: %w", r.cfg.Name, s.p, err)
		}
		if r.cfg.DetectRetentionLoss {
			s.lastSeq, s.seqKnown = floor, true
		}
		if err := r.retry(ctx, s, "takeover record", func() error { return r.startAttempt(ctx, s, floor) }); err != nil {
			return fmt.Errorf("durable: %s: %w", r.cfg.Name, err)
		}
		if r.obs != nil {
			err := r.retry(ctx, s, "stage's partition state", func() error {
				err := r.obs.Assigned(ctx, s.p)
				if err != nil {
					r.obs.Lost(s.p) // forget what a failed load left, before trying again
				}
				return err
			})
			if err != nil {
				return fmt.Errorf("durable: %s: partition %d assigned: %w", r.cfg.Name, s.p, err)
			}
		}
		r.log.Debug("partition acquired", "partition", s.p)
		return nil
	case itemRelease:
		defer close(s.released)
		if r.sessions[s.p] != s {
			return nil
		}
		s.releasing = true
		if r.obs != nil {
			rctx, cancel := context.WithTimeout(ctx, r.group.ReleaseTimeout)
			err := r.obs.Release(rctx, s.p)
			cancel()
			if err != nil {
				return fmt.Errorf("durable: %s: partition %d release: %w", r.cfg.Name, s.p, err)
			}
		}
		r.settleSession(ctx, s)
		r.endedCleanly(ctx, s)
		delete(r.sessions, s.p)
		r.log.Debug("partition handed on", "partition", s.p, "left_unacked", s.pending())
		return nil
	}
	if r.sessions[s.p] != s {
		return nil // a batch of an ended session: left unacked for the next owner
	}
	return r.handleBatch(ctx, s, it.msgs)
}

// gainRetryFor bounds how long taking a partition retries a failing server call: while a cluster
// elects a leader for a stream or bucket, or a replica catches up, requests go unanswered (no
// responders, timeouts) for seconds; one such answer must not stop the instance.
const gainRetryFor = 30 * time.Second

// retry runs f until it succeeds, gainRetryFor has passed, the partition is lost or the server refuses
// this user a subject (retrying cannot help then). It returns f's last error.
func (r *Runner) retry(ctx context.Context, s *session, what string, f func() error) error {
	deadline := r.now().Add(gainRetryFor)
	waits := retrywait.Doubling(100*time.Millisecond, 2*time.Second)
	for {
		wait := waits.NextBackOff()
		err := f()
		if err == nil || errors.Is(err, natsconn.ErrRefused) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			s.lost.Load() || ctx.Err() != nil || !r.now().Add(wait).Before(deadline) {
			return err
		}
		r.log.Warn("taking a partition: retrying a server call", "partition", s.p, "call", what, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
	}
}

// forget drops s without acknowledging anything more and tells the stage.
func (r *Runner) forget(s *session) {
	s.lost.Store(true)
	if r.sessions[s.p] != s {
		return
	}
	delete(r.sessions, s.p)
	if r.obs != nil {
		r.obs.Lost(s.p)
	}
	r.log.Debug("partition lost", "partition", s.p)
}

func (r *Runner) handleBatch(ctx context.Context, s *session, raw []jetstream.Msg) error {
	now := r.now()
	// One allocation for the batch's messages and one lock to queue them: this runs for every
	// message the group delivers.
	msgs := make([]Msg, len(raw))
	for i, rm := range raw {
		msgs[i] = Msg{raw: rm, Partition: s.p, sess: s, received: now}
	}
	s.addBatch(msgs, now)
	batch := make([]*Msg, 0, len(raw))
	var lag, delivered, redelivered uint64
	for i, rm := range raw {
		m := &msgs[i]
		md, err := rm.Metadata()
		if err != nil {
			r.deadLetter(ctx, m, fmt.Errorf("message metadata: %w", err))
			continue
		}
		m.Delivered, m.Stored, lag = md.NumDelivered, md.Timestamp, md.NumPending
		m.StreamSeq = md.Sequence.Stream
		if !r.readsOwnStream { // a partition stream: the group stream's sequence is in a header
			if m.StreamSeq, err = partition.StreamSequence(rm); err != nil {
				r.deadLetter(ctx, m, err)
				continue
			}
		}
		delivered++
		if m.Delivered > 1 {
			redelivered++
		}
		if r.cfg.DetectRetentionLoss {
			r.checkRetention(ctx, s, md.Sequence.Stream)
		}
		m.ownSeq = md.Sequence.Stream
		switch {
		case m.Delivered > uint64(r.cfg.MaxDeliveries):
			r.deadLetter(ctx, m, fmt.Errorf("%w: delivered %d times, limit %d", errDeliveryLimit, m.Delivered, r.cfg.MaxDeliveries))
			continue
		case s.careful && s.attempt.Suspect == m.ownSeq:
			r.deadLetter(ctx, m, fmt.Errorf("%w: the partition was taken over %d times in a row without progress while this message was being handled",
				errDeliveryLimit, s.attempt.Sessions-1))
			continue
		}
		batch = append(batch, m)
	}
	r.m.delivered.Add(float64(delivered))
	if redelivered > 0 {
		r.m.redelivered.Add(float64(redelivered))
	}
	r.m.lag.Set(float64(lag))
	if len(batch) == 0 {
		return nil
	}
	if s.careful {
		for _, m := range batch {
			if err := r.suspect(ctx, s, m.ownSeq); err != nil {
				return fmt.Errorf("durable: %s: %w", r.cfg.Name, err)
			}
			if err := r.handle1(ctx, s, []*Msg{m}); err != nil {
				return err
			}
		}
		return nil
	}
	return r.handle1(ctx, s, batch)
}

func (r *Runner) handle1(ctx context.Context, s *session, batch []*Msg) error {
	t0 := time.Now()
	err := r.c.Handle(ctx, batch)
	r.m.handle.Observe(time.Since(t0).Seconds())
	if err != nil {
		return fmt.Errorf("durable: %s: partition %d: %w", r.cfg.Name, s.p, err)
	}
	return nil
}

// ackFloor is the stream sequence up to which partition p's consumer has acknowledged everything.
func (r *Runner) ackFloor(ctx context.Context, p int) (uint64, error) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	c, err := r.js.PushConsumer(cctx, r.group.ConsumerStreamOf(p), r.group.ConsumerName(p))
	if err != nil {
		return 0, err
	}
	return c.CachedInfo().AckFloor.Stream, nil
}

// settle dead-letters what was rejected and acknowledges what is done, for every owned partition.
func (r *Runner) settle(ctx context.Context) {
	for _, s := range r.sessions {
		r.settleSession(ctx, s)
	}
}

func (r *Runner) settleSession(ctx context.Context, s *session) {
	if s.lost.Load() {
		return
	}
	for _, rj := range s.takeRejects() {
		r.deadLetter(ctx, rj.m, rj.reason)
	}
	for _, m := range s.ackable(r.group.CumulativeAcks) {
		if err := m.raw.Ack(); err != nil {
			r.log.Debug("ack failed; the message will be redelivered and skipped", "partition", s.p, "err", err)
		}
		r.progressed(ctx, s, m.ownSeq)
	}
	if n := s.takeAcked(); n > 0 {
		r.m.acked.Add(float64(n))
	}
}

// keepAlive sends an in-progress ack for every message held longer than a third of AckWait, so that
// a message a stage holds on purpose (a merger's rank waiting for its run) is not redelivered.
func (r *Runner) keepAlive() {
	now := r.now()
	cutoff := now.Add(-r.group.AckWait / 3)
	for _, s := range r.sessions {
		if s.lost.Load() {
			continue
		}
		for _, m := range s.held(cutoff, now) {
			_ = m.raw.InProgress()
		}
	}
}
