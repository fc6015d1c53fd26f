package gaps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// ErrAlreadyRunning is returned by a second call of Detector.Run.
var ErrAlreadyRunning = errors.New("gaps: detector already running")

// burst is how many messages the loop takes without blocking before it considers a checkpoint.
const burst = 512

// Detector is the gap detector: durable pull consumers on FPM (the messages) and FPM_EVENTS (the
// bridge's drop markers) that track every owned publisher's sequence, publish one event per gap on
// FPM_EVENTS and checkpoint each publisher's State in the state bucket before acking what it reflects.
//
// Run owns all run state; a Detector runs once.
type Detector struct {
	cfg     Config
	js      jetstream.JetStream
	logger  *slog.Logger
	now     func() time.Time
	part    Partition
	metrics *metrics
	rules   rules
	ready   chan struct{}
	running atomic.Bool

	// Run state, owned by Run's goroutine.
	fpmStream, evStream, kvStream jetstream.Stream
	fpmCons, mkCons               jetstream.Consumer
	fpmF, mkF                     *fetcher
	keys                          map[streams.Key]*entry
	subjects                      map[string]subjectKey // subject -> key, parsed once
	dirty                         []*entry
	held                          int // messages waiting for their checkpoint
	lastCommit                    time.Time
	flight                        *inflight // the checkpoint being written, if any
	stopping                      bool      // the graceful stop: checkpoint every changed state
	newEvents                     bool      // events emitted since the last checkpoint started
	fpmLastSeq                    uint64    // highest FPM stream sequence delivered to the loop
	mkLastSeq                     uint64    // highest FPM_EVENTS sequence delivered to the loop
	mkLastStoredMs                int64     // its stream time
}

type subjectKey struct {
	key streams.Key
	ok  bool
}

// entry is one owned publisher: its State (as last checkpointed, plus what the loop applied since),
// the KV revision of the checkpoint and the messages waiting for the next one.
type entry struct {
	key     streams.Key
	kvSubj  string
	st      State
	t       tracker
	rev     uint64
	isDirty bool // in Detector.dirty: held messages or changes wait for a commit
	changed bool // st differs from the checkpoint at rev
	// written is when st was last checkpointed (or loaded).
	written time.Time
	// catchUp: FPMs of this publisher may exist between st.StreamSeq and the next one delivered (a
	// fresh load after a restart, a rebalance or a lost checkpoint race); read them from the stream
	// before applying the next delivered one.
	catchUp   bool
	lastLocal time.Time // when the loop last applied an FPM of it (wall clock, for the live stale check)
	msgs      []jetstream.Msg
}

// Option configures a Detector beyond Config.
type Option func(*Detector) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(d *Detector) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidConfig)
		}
		d.logger = l
		return nil
	}
}

// WithClock sets the wall clock used only for when to check (stale publishers, commit pacing); event
// content never comes from it.
func WithClock(now func() time.Time) Option {
	return func(d *Detector) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidConfig)
		}
		d.now = now
		return nil
	}
}

// WithPartition replaces the static partition of Config (PartitionIndex/PartitionCount) with p, for
// example a dynamic partitioner. The durable names still follow Config.
func WithPartition(p Partition) Option {
	return func(d *Detector) error {
		if p == nil {
			return fmt.Errorf("%w: nil partition", ErrInvalidConfig)
		}
		d.part = p
		return nil
	}
}

// New checks cfg and returns a Detector on js. Nothing is created on the server until Run; the
// streams must exist (streams.Apply). Options: WithLogger, WithClock, WithPartition.
func New(cfg Config, js jetstream.JetStream, opts ...Option) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidConfig)
	}
	d := &Detector{
		cfg:      cfg,
		js:       js,
		logger:   slog.Default(),
		now:      time.Now,
		rules:    cfg.rules(),
		ready:    make(chan struct{}),
		keys:     map[streams.Key]*entry{},
		subjects: map[string]subjectKey{},
	}
	if cfg.PartitionCount > 1 {
		d.part = Static{Index: cfg.PartitionIndex, Count: cfg.PartitionCount}
	} else {
		d.part = All{}
	}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("gaps: register metrics: %w", err)
	}
	d.metrics = m
	return d, nil
}

// Ready is closed once Run has loaded the state, declared the consumers and started fetching.
func (d *Detector) Ready() <-chan struct{} { return d.ready }

// ioCtx bounds one server call made from the loop.
func (d *Detector) ioCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d.cfg.PublishTimeout)
}

// Run detects gaps until ctx is done, then stops gracefully within StopTimeout: it stops fetching,
// applies the messages already received, checkpoints, publishes the pending events, acks and returns
// nil. Messages not acked are redelivered and skipped if already reflected, so a stop anywhere
// (even kill -9) neither loses a gap nor reports one twice.
//
// Before fetching, Run creates the state bucket if missing and loads the state of every owned
// publisher in it (publishing events a previous run checkpointed but may not have stored).
func (d *Detector) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := d.setup(ctx); err != nil {
		return err
	}
	itF, err := d.fpmCons.Messages(jetstream.PullMaxMessages(d.cfg.pullBatch()))
	if err != nil {
		return fmt.Errorf("gaps: fetch from consumer %s: %w", d.cfg.FPMDurable(), err)
	}
	itM, err := d.mkCons.Messages(jetstream.PullMaxMessages(min(d.cfg.pullBatch(), 256)))
	if err != nil {
		itF.Stop()
		return fmt.Errorf("gaps: fetch from consumer %s: %w", d.cfg.MarkerDurable(), err)
	}
	d.fpmF = startFetcher("FPM", itF, 256)
	d.mkF = startFetcher("drop marker", itM, 256)
	d.lastCommit = d.now()
	d.logger.Info("gap detector started", "group", d.cfg.Group, "filter", d.cfg.FilterSubject,
		"partition", fmt.Sprintf("%d/%d", d.cfg.PartitionIndex, d.cfg.PartitionCount),
		"stale_after", d.cfg.StaleAfter, "marker_grace", d.cfg.MarkerGrace, "publishers", len(d.keys))
	close(d.ready)

	if err := d.loop(ctx); err != nil {
		d.abort()
		return err
	}
	return d.shutdown()
}

// setup creates the state bucket, looks up the streams, loads the owned publishers' state and
// declares the consumers.
func (d *Detector) setup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := d.js.CreateOrUpdateKeyValue(sctx, d.cfg.StateBucketConfig()); err != nil {
		return fmt.Errorf("gaps: state bucket %s: %w", d.cfg.StateBucket, err)
	}
	var err error
	if d.kvStream, err = d.js.Stream(sctx, "KV_"+d.cfg.StateBucket); err != nil {
		return fmt.Errorf("gaps: state bucket %s: %w", d.cfg.StateBucket, err)
	}
	if d.fpmStream, err = d.js.Stream(sctx, streams.StreamFPM); err != nil {
		return fmt.Errorf("gaps: stream %s: %w", streams.StreamFPM, err)
	}
	if d.evStream, err = d.js.Stream(sctx, streams.StreamEvents); err != nil {
		return fmt.Errorf("gaps: stream %s: %w", streams.StreamEvents, err)
	}
	if d.fpmCons, err = d.js.CreateOrUpdateConsumer(sctx, streams.StreamFPM, d.cfg.FPMConsumerConfig()); err != nil {
		return fmt.Errorf("gaps: declare consumer %s on %s: %w", d.cfg.FPMDurable(), streams.StreamFPM, err)
	}
	if d.mkCons, err = d.js.CreateOrUpdateConsumer(sctx, streams.StreamEvents, d.cfg.MarkerConsumerConfig()); err != nil {
		return fmt.Errorf("gaps: declare consumer %s on %s: %w", d.cfg.MarkerDurable(), streams.StreamEvents, err)
	}
	info, err := d.fpmCons.Info(sctx)
	if err != nil {
		return fmt.Errorf("gaps: consumer %s: %w", d.cfg.FPMDurable(), err)
	}
	if err := d.preload(sctx); err != nil {
		return err
	}
	// Messages a previous run acked after its last checkpoint of a publisher are not redelivered:
	// re-read them from the stream, up to the last one the consumer delivered.
	for _, e := range d.keys {
		if err := d.catchUpFPM(e, info.Delivered.Stream+1); err != nil {
			return err
		}
	}
	return nil
}

// loop handles messages and ticks until ctx is done (nil) or something fails.
func (d *Detector) loop(ctx context.Context) error {
	tick := time.NewTicker(min(d.cfg.tick(), d.cfg.CommitInterval))
	defer tick.Stop()
	for {
		select {
		case m, ok := <-d.fpmF.msgs:
			if !ok {
				return d.fpmF.failure()
			}
			if err := d.handleFPM(m); err != nil {
				return err
			}
			if err := d.more(); err != nil {
				return err
			}
		case m, ok := <-d.mkF.msgs:
			if !ok {
				return d.mkF.failure()
			}
			if err := d.handleMarker(m); err != nil {
				return err
			}
			if err := d.more(); err != nil {
				return err
			}
		case <-d.flightDone():
			if err := d.finishCommit(); err != nil {
				d.logger.Warn("gap detector: checkpoint failed; retrying (messages stay unacked)", "err", err)
			}
		case <-tick.C:
			d.onTick()
		case <-ctx.Done():
			return nil
		}
		d.maybeCommit()
	}
}

// more takes up to burst messages that are already waiting, without blocking.
func (d *Detector) more() error {
	for range burst {
		select {
		case m, ok := <-d.fpmF.msgs:
			if !ok {
				return d.fpmF.failure()
			}
			if err := d.handleFPM(m); err != nil {
				return err
			}
		case m, ok := <-d.mkF.msgs:
			if !ok {
				return d.mkF.failure()
			}
			if err := d.handleMarker(m); err != nil {
				return err
			}
		default:
			return nil
		}
	}
	return nil
}

// flightDone is the in-flight checkpoint's done channel (nil, never ready, when there is none).
func (d *Detector) flightDone() <-chan struct{} {
	if d.flight == nil {
		return nil
	}
	return d.flight.done
}

// maybeCommit starts a checkpoint, unless one is in flight, when events wait to be published, when
// an eighth of MaxAckPending waits, or when CommitInterval has passed.
func (d *Detector) maybeCommit() {
	if len(d.dirty) == 0 || d.flight != nil {
		return
	}
	now := d.now()
	idle := len(d.fpmF.msgs) == 0 && len(d.mkF.msgs) == 0
	if !idle && d.held < d.cfg.MaxAckPending/8 && now.Sub(d.lastCommit) < d.cfg.CommitInterval && !d.eventsWaiting() {
		return
	}
	d.lastCommit = now
	d.startCommit()
}

// eventsWaiting reports whether events were emitted since the last checkpoint started.
func (d *Detector) eventsWaiting() bool { return d.newEvents }

// outboxPending reports whether any publisher has events not yet stored.
func (d *Detector) outboxPending() bool {
	for _, e := range d.keys {
		if len(e.st.Outbox) > 0 {
			return true
		}
	}
	return false
}

// touch records that e's state changed since its checkpoint.
func (d *Detector) touch(e *entry) {
	e.changed = true
	d.markDirty(e)
}

func (d *Detector) markDirty(e *entry) {
	if !e.isDirty {
		e.isDirty = true
		d.dirty = append(d.dirty, e)
	}
}

// subjectKeyOf parses (once per subject) the publisher key of an FPM or drop marker subject.
func (d *Detector) subjectKeyOf(subject, root string) (streams.Key, bool) {
	if sk, ok := d.subjects[subject]; ok {
		return sk.key, sk.ok
	}
	k, err := streams.ParseKeySubject(subject, root)
	if len(d.subjects) > 1<<16 {
		clear(d.subjects)
	}
	d.subjects[subject] = subjectKey{key: k, ok: err == nil}
	return k, err == nil
}

// handleFPM applies one delivered FPM.
func (d *Detector) handleFPM(m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		d.terminate(m, "FPM", fmt.Errorf("metadata: %w", err))
		return nil
	}
	seq := meta.Sequence.Stream
	d.fpmLastSeq = max(d.fpmLastSeq, seq)
	key, ok := d.subjectKeyOf(m.Subject(), streams.FPMRoot)
	if !ok {
		d.terminate(m, "FPM", fmt.Errorf("subject %q is not fpm.<namespace>.<component>.<worker_id>.<dp_rank>", m.Subject()))
		return nil
	}
	if !d.part.Owns(key) {
		d.unload(key)
		_ = m.Ack()
		return nil
	}
	e, err := d.entry(key)
	if err != nil {
		d.logger.Warn("gap detector: cannot load publisher state; message will be redelivered", "key", key.String(), "err", err)
		_ = m.NakWithDelay(time.Second)
		return nil
	}
	d.hold(e, m)
	if seq <= e.st.StreamSeq {
		d.metrics.skipped.Inc()
		return nil
	}
	if e.catchUp {
		if err := d.catchUpFPM(e, seq); err != nil {
			d.logger.Warn("gap detector: catch-up read failed; state reloaded later", "key", key.String(), "err", err)
			d.drop(e, true)
			return nil
		}
	}
	o, err := observation(m.Headers(), m.Data(), seq, meta.Timestamp)
	d.touch(e)
	if err != nil {
		e.st.StreamSeq = seq
		d.metrics.invalid.WithLabelValues(streams.StreamFPM).Inc()
		d.logger.Warn("gap detector: FPM without usable sequence headers skipped", "subject", m.Subject(), "stream_seq", seq, "err", err)
		return nil
	}
	d.apply(e, &o)
	e.lastLocal = d.now()
	return nil
}

// hold keeps m until e's next checkpoint.
func (d *Detector) hold(e *entry, m jetstream.Msg) {
	e.msgs = append(e.msgs, m)
	d.held++
	d.markDirty(e)
}

func (d *Detector) apply(e *entry, o *Observation) {
	c := e.st.Counters
	e.t.observe(o)
	n := e.st.Counters
	d.metrics.messages.Add(float64(n.Messages - c.Messages))
	d.metrics.heartbeats.Add(float64(n.Heartbeats - c.Heartbeats))
	d.metrics.duplicates.Add(float64(n.Duplicates - c.Duplicates))
	d.metrics.outOfOrder.Add(float64(n.OutOfOrder - c.OutOfOrder))
}

// handleMarker applies one delivered drop marker.
func (d *Detector) handleMarker(m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		d.terminate(m, streams.StreamEvents, fmt.Errorf("metadata: %w", err))
		return nil
	}
	seq := meta.Sequence.Stream
	d.mkLastSeq = max(d.mkLastSeq, seq)
	d.mkLastStoredMs = max(d.mkLastStoredMs, meta.Timestamp.UnixMilli())
	key, ok := d.subjectKeyOf(m.Subject(), streams.EventsRoot+".drop")
	if !ok {
		d.terminate(m, streams.StreamEvents, fmt.Errorf("subject %q is not a drop marker subject", m.Subject()))
		return nil
	}
	if !d.part.Owns(key) {
		d.unload(key)
		_ = m.Ack()
		return nil
	}
	e, err := d.entry(key)
	if err != nil {
		d.logger.Warn("gap detector: cannot load publisher state; marker will be redelivered", "key", key.String(), "err", err)
		_ = m.NakWithDelay(time.Second)
		return nil
	}
	d.hold(e, m)
	if seq <= e.st.MarkerSeq {
		d.metrics.skipped.Inc()
		return nil
	}
	d.applyMarker(e, m.Data(), seq, m.Subject())
	return nil
}

// applyMarker parses and applies a drop marker body stored at FPM_EVENTS sequence seq.
func (d *Detector) applyMarker(e *entry, body []byte, seq uint64, subject string) {
	d.touch(e)
	dm, err := ParseDropMarker(body)
	if err != nil {
		e.st.MarkerSeq = seq
		d.metrics.invalid.WithLabelValues(streams.StreamEvents).Inc()
		d.logger.Warn("gap detector: bad drop marker skipped", "subject", subject, "stream_seq", seq, "err", err)
		return
	}
	if dm.Key.Key() != e.key {
		d.logger.Warn("gap detector: drop marker key differs from its subject; the subject wins", "subject", subject, "marker_key", dm.Key)
	}
	e.t.addMarker(dm, seq)
	d.metrics.markers.Inc()
}

// terminate ends a message that can never be used (it is not redelivered).
func (d *Detector) terminate(m jetstream.Msg, stream string, err error) {
	d.metrics.invalid.WithLabelValues(stream).Inc()
	d.logger.Warn("gap detector: unusable message terminated", "subject", m.Subject(), "err", err)
	_ = m.TermWithReason("fpmbus gaps: " + err.Error())
}

// observation reads an FPM's sequence, epoch, observed time and bridge from its headers (Fpm-Seq,
// Fpm-Epoch, Fpm-Received-At-Ms, Fpm-Bridge) and whether its body is a heartbeat. Without
// Fpm-Seq the payload's counter_id is used; without Fpm-Received-At-Ms the stream time.
func observation(h map[string][]string, body []byte, streamSeq uint64, stored time.Time) (Observation, error) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	o := Observation{StreamSeq: streamSeq, StoredMs: stored.UnixMilli(), Bridge: get(streams.HeaderBridge)}
	if s := get(streams.HeaderSeq); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderSeq, s, err)
		}
		o.Seq = v
	} else {
		f, err := parseCounter(body)
		if err != nil {
			return o, fmt.Errorf("no %s header and %w", streams.HeaderSeq, err)
		}
		o.Seq = f
	}
	if s := get(streams.HeaderEpoch); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderEpoch, s, err)
		}
		o.Epoch = v
	}
	o.ObservedAtMs = o.StoredMs
	if s := get(streams.HeaderReceivedAt); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return o, fmt.Errorf("%s %q: %w", streams.HeaderReceivedAt, s, err)
		}
		o.ObservedAtMs = v
	}
	o.SeqMismatch = get(streams.HeaderSeqMismatch) != ""
	o.Heartbeat = isHeartbeat(body)
	return o, nil
}

// onTick runs the wall-clock checks: stale publishers and marker graces that have passed.
func (d *Detector) onTick() {
	now := d.now()
	var stale []*entry
	pending, nStale := 0, 0
	for _, e := range d.keys {
		if e.changed && now.Sub(e.written) >= d.cfg.CheckpointInterval {
			d.markDirty(e) // idle since: checkpoint what it advanced
		}
		if e.st.Stale != nil {
			nStale++
		} else if e.st.Started && now.Sub(e.lastLocal) >= d.cfg.StaleAfter {
			stale = append(stale, e)
		}
		pending += len(e.st.Pending)
	}
	if len(stale) > 0 && d.caughtUp(d.fpmCons, d.fpmF, d.fpmLastSeq) {
		for _, e := range stale {
			if e.t.markStale() {
				nStale++
				d.touch(e)
			}
		}
	}
	if pending > 0 {
		wm := d.mkLastStoredMs
		if ts, ok := d.caughtUpAt(d.mkCons, d.mkF, d.mkLastSeq); ok {
			wm = max(wm, ts.UnixMilli())
		}
		pending = 0
		for _, e := range d.keys {
			if len(e.st.Pending) > 0 && e.t.expire(wm) > 0 {
				d.touch(e)
			}
			pending += len(e.st.Pending)
		}
	}
	d.metrics.stale.Set(float64(nStale))
	d.metrics.pending.Set(float64(pending))
	d.metrics.publishers.Set(float64(len(d.keys)))
}

func (d *Detector) caughtUp(c jetstream.Consumer, f *fetcher, last uint64) bool {
	_, ok := d.caughtUpAt(c, f, last)
	return ok
}

// caughtUpAt reports whether every message stored for consumer c has reached the loop, and the
// server's time when that was true.
func (d *Detector) caughtUpAt(c jetstream.Consumer, f *fetcher, last uint64) (time.Time, bool) {
	if len(f.msgs) > 0 {
		return time.Time{}, false
	}
	if nc := d.js.Conn(); nc != nil && !nc.IsConnected() {
		return time.Time{}, false
	}
	ctx, cancel := d.ioCtx()
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return time.Time{}, false
	}
	if info.NumPending > 0 || info.Delivered.Stream > last {
		return time.Time{}, false
	}
	return info.TimeStamp, true
}

// shutdown is the graceful stop: stop pulling, apply what was delivered, checkpoint, publish, ack.
func (d *Detector) shutdown() error {
	deadline := d.now().Add(d.cfg.StopTimeout)
	for _, f := range []*fetcher{d.fpmF, d.mkF} {
		f.drain()
	}
	timer := time.NewTimer(d.cfg.StopTimeout)
	defer timer.Stop()
	fpm, mk := d.fpmF.msgs, d.mkF.msgs
	for fpm != nil || mk != nil {
		select {
		case m, ok := <-fpm:
			if !ok {
				fpm = nil
				continue
			}
			_ = d.handleFPM(m)
		case m, ok := <-mk:
			if !ok {
				mk = nil
				continue
			}
			_ = d.handleMarker(m)
		case <-timer.C:
			d.logger.Warn("gap detector: stop timeout; messages not yet applied will be redelivered")
			fpm, mk = nil, nil
		}
	}
	d.fpmF.stop()
	d.mkF.stop()
	d.stopping = true
	for _, e := range d.keys {
		if e.changed {
			d.markDirty(e)
		}
	}
	var err error
	for len(d.dirty) > 0 || d.flight != nil {
		if err = d.commit(); err == nil && !d.outboxPending() && len(d.dirty) == 0 {
			break
		}
		if d.now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.nakHeld()
	d.flushAcks()
	if err != nil {
		return fmt.Errorf("gaps: final checkpoint: %w", err)
	}
	d.logger.Info("gap detector stopped")
	return nil
}

// abort ends a failed run: nothing more is checkpointed; held messages are naked (redelivered).
func (d *Detector) abort() {
	for _, f := range []*fetcher{d.fpmF, d.mkF} {
		f.stop()
	}
	if d.flight != nil {
		<-d.flight.done
		_ = d.finishCommit()
	}
	d.nakHeld()
	d.flushAcks()
}

func (d *Detector) nakHeld() {
	for _, e := range d.keys {
		for _, m := range e.msgs {
			_ = m.Nak()
		}
		d.held -= len(e.msgs)
		e.msgs = nil
	}
}

// flushAcks waits until the server has received the acks sent so far.
func (d *Detector) flushAcks() {
	if nc := d.js.Conn(); nc != nil && !nc.IsClosed() {
		if err := nc.FlushTimeout(d.cfg.StopTimeout); err != nil {
			d.logger.Warn("gap detector: flushing acks to the server", "err", err)
		}
	}
}
