package gaps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/streams"
)

// ErrAlreadyRunning is returned by a second call of Detector.Run.
var ErrAlreadyRunning = errors.New("gaps: detector already running")

// burst is how many messages the loop takes without blocking before it considers a checkpoint.
const burst = 512

// Detector is the gap detector: one member of the partition group Config.Group on stream FPM
// (consumers/partition) that tracks the sequence of every publisher of the partitions it owns, reads
// the bridge's drop markers (an ordered consumer on FPM_EVENTS; markers of publishers it does not own
// are ignored, their owner reads them too), publishes one event per gap on FPM_EVENTS and checkpoints
// each publisher's State in the state bucket before acking what it reflects.
//
// Run owns all run state; a Detector runs once.
type Detector struct {
	cfg     Config
	js      jetstream.JetStream
	logger  *slog.Logger
	now     func() time.Time
	part    *owned
	metrics *metrics
	rules   rules
	ready   chan struct{}
	running atomic.Bool
	id      string // member id (optional)

	// Handler goroutines -> loop.
	in     chan pitem
	lostCh chan *psess
	quit   chan struct{} // closed when the loop has ended: handlers stop sending

	// Run state, owned by Run's goroutine.
	fpmStream, evStream, kvStream jetstream.Stream
	partStream                    jetstream.Stream // the stream the partition consumers live on
	member                        *partition.Member
	mkCons                        jetstream.Consumer
	mkF                           *fetcher
	keys                          map[streams.Key]*entry
	subjects                      map[string]subjectKey // subject -> key, parsed once
	dirty                         []*entry
	held                          int // messages waiting for their checkpoint
	lastCommit                    time.Time
	flight                        *inflight // the checkpoint being written, if any
	stopping                      bool      // the graceful stop: checkpoint every changed state
	revoking                      int       // sessions being revoked gracefully
	consumed                      bool      // the member's Consume has returned
	newEvents                     bool      // events emitted since the last checkpoint started
	mkLastStoredMs                int64     // stream time of the newest drop marker delivered to the loop
	// mkDelivered is the marker consumer's delivery sequence of the last marker that reached the
	// loop, and which server-side consumer delivered it (an ordered consumer is recreated, under a new
	// name, after a reset).
	mkDelivered     uint64
	mkDeliveredFrom string
	// markerSubjects are the drop marker subjects with a marker stored before the marker consumer
	// started or read by it since: a publisher loaded without one has no marker to catch up.
	markerSubjects map[string]bool
	// orphans are the held messages of publishers whose reload failed: released once the publisher
	// is loaded again (the load re-reads the stream from its checkpoint), retried every tick.
	orphans map[streams.Key][]heldMsg
}

type subjectKey struct {
	key streams.Key
	ok  bool
}

// entry is one owned publisher: its State (as last checkpointed, plus what the loop applied since),
// the KV revision of the checkpoint and the messages waiting for the next one.
type entry struct {
	key     streams.Key
	part    int // its partition
	kvSubj  string
	st      State
	t       tracker
	rev     uint64
	isDirty bool // in Detector.dirty: held messages or changes wait for a commit
	changed bool // st differs from the checkpoint at rev
	// written is when st was last checkpointed (or loaded).
	written time.Time
	// catchUp: FPMs of this publisher may exist between st.StreamSeq and the next one delivered (a
	// fresh load after a restart, a takeover or a lost checkpoint race); read them from the stream
	// before applying the next delivered one (or before calling it stale).
	catchUp   bool
	lastLocal time.Time // when the loop last applied an FPM of it (wall clock, for the live stale check)
	msgs      []heldMsg
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

// WithMemberID names the detector in its partition group (default <hostname>-<pid>-<random>).
func WithMemberID(id string) Option {
	return func(d *Detector) error {
		d.id = id
		return nil
	}
}

// New checks cfg and returns a Detector on js. Nothing is created on the server until Run; the
// streams must exist (streams.Ensure). Options: WithLogger, WithClock, WithMemberID.
func New(cfg Config, js jetstream.JetStream, opts ...Option) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.PartitionConfig().Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
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
		orphans:  map[streams.Key][]heldMsg{},
		subjects: map[string]subjectKey{},
		part:     &owned{cfg: cfg, sess: map[int]*psess{}},
		in:       make(chan pitem, 1024),
		lostCh:   make(chan *psess, partition.MaxPartitions),
		quit:     make(chan struct{}),
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

// Ready is closed once Run has joined the group and started reading.
func (d *Detector) Ready() <-chan struct{} { return d.ready }

// ioCtx bounds one server call made from the loop.
func (d *Detector) ioCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d.cfg.PublishTimeout)
}

// Run detects gaps until ctx is done, then stops gracefully within StopTimeout: every owned partition
// is handed on after its publishers are checkpointed, their events published and their messages
// acked; it returns nil. Messages not acked are redelivered to the next owner and skipped if already
// reflected, so a stop anywhere (even kill -9) neither loses a gap nor reports one twice.
//
// Run creates the state bucket if missing and joins the partition group; each time it is given a
// partition it loads the state of that partition's publishers (publishing events a previous owner
// checkpointed but may not have stored) and catches them up from the stream.
func (d *Detector) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(d.quit)
	if err := d.setup(ctx); err != nil {
		return err
	}
	ccx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	consumed := make(chan error, 1)
	go func() { consumed <- d.member.Consume(ccx, d.handle) }()
	d.lastCommit = d.now()
	d.logger.Info("gap detector started", "group", d.cfg.Group, "filter", d.cfg.FilterSubject,
		"partitions", d.cfg.Partitions, "member", d.member.ID(),
		"stale_after", d.cfg.StaleAfter, "marker_grace", d.cfg.MarkerGrace)
	close(d.ready)

	err := d.loop(ctx, consumed)
	if err != nil {
		ccancel()
		d.abort(consumed)
		return err
	}
	return d.shutdown()
}

// setup creates the state bucket, looks up the streams, starts reading drop markers and joins the
// partition group.
func (d *Detector) setup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := streams.EnsureKeyValue(sctx, d.js, d.cfg.StateBucketConfig()); err != nil {
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
	// Drop markers: every instance reads all of them from now on (markers stored before are read by
	// direct get when a publisher is loaded) and applies those of the publishers it owns.
	evInfo, err := d.evStream.Info(sctx, jetstream.WithSubjectFilter(d.cfg.MarkerFilter()))
	if err != nil {
		return fmt.Errorf("gaps: stream %s: %w", streams.StreamEvents, err)
	}
	d.markerSubjects = make(map[string]bool, len(evInfo.State.Subjects))
	for subj := range evInfo.State.Subjects {
		d.markerSubjects[subj] = true
	}
	if d.mkCons, err = d.evStream.OrderedConsumer(sctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{d.cfg.MarkerFilter()},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    evInfo.State.LastSeq + 1,
	}); err != nil {
		return fmt.Errorf("gaps: read drop markers on %s: %w", streams.StreamEvents, err)
	}
	itM, err := d.mkCons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("gaps: read drop markers on %s: %w", streams.StreamEvents, err)
	}
	d.mkF = startFetcher("drop marker", itM, 256)
	if err := d.retireExplicitAckConsumers(sctx); err != nil {
		d.mkF.stop()
		return err
	}
	opts := []partition.Option{partition.WithLogger(d.logger)}
	if d.id != "" {
		opts = append(opts, partition.WithMemberID(d.id))
	}
	if d.member, err = partition.Join(sctx, d.js, d.cfg.PartitionConfig(), opts...); err != nil {
		d.mkF.stop()
		return fmt.Errorf("gaps: join group %s: %w", d.cfg.Group, err)
	}
	if d.partStream, err = d.js.Stream(sctx, d.cfg.PartitionConfig().ConsumerStream()); err != nil {
		d.mkF.stop()
		return fmt.Errorf("gaps: group %s: %w", d.cfg.Group, err)
	}
	return nil
}

// retireExplicitAckConsumers deletes the group's partition consumers that an older fpmbus declared
// with explicit acks: the server cannot change a consumer's ack policy, and Join would refuse the
// group. Join then declares them anew, from the stream's first message; the state bucket makes the
// re-read harmless (what a publisher's checkpoint covers is skipped, what follows it is re-read anyway).
// An instance of the older version still consuming them fails and must be upgraded too.
func (d *Detector) retireExplicitAckConsumers(ctx context.Context) error {
	pc := d.cfg.PartitionConfig()
	s, err := d.js.Stream(ctx, pc.ConsumerStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // a partition stream not created yet: no consumer either
	}
	if err != nil {
		return fmt.Errorf("gaps: group %s: %w", d.cfg.Group, err)
	}
	for p := range pc.Partitions {
		name := pc.ConsumerName(p)
		c, err := s.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("gaps: group %s: consumer %s: %w", d.cfg.Group, name, err)
		}
		if c.CachedInfo().Config.AckPolicy == jetstream.AckAllPolicy {
			continue
		}
		d.logger.Warn("gap detector: recreating a consumer declared with per-message acks by an older fpmbus; the stream is re-read from the start, what the state covers is skipped",
			"stream", pc.ConsumerStream(), "consumer", name)
		if err := s.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("gaps: group %s: delete consumer %s: %w", d.cfg.Group, name, err)
		}
	}
	return nil
}

// loop handles messages, partition changes and ticks until the member has stopped (nil: graceful)
// or something fails. ctx done starts the graceful stop: the member hands every partition on.
func (d *Detector) loop(ctx context.Context, consumed <-chan error) error {
	tick := time.NewTicker(min(d.cfg.tick(), d.cfg.CommitInterval))
	defer tick.Stop()
	done := ctx.Done()
	var stopErr chan error
	for {
		select {
		case it := <-d.in:
			if err := d.handleItem(it); err != nil {
				return err
			}
			if err := d.more(); err != nil {
				return err
			}
		case s := <-d.lostCh:
			d.lose(s)
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
		case <-done:
			done = nil
			d.stopping = true
			stopErr = make(chan error, 1)
			go func() {
				sctx, cancel := context.WithTimeout(context.Background(), d.cfg.StopTimeout+d.cfg.PublishTimeout)
				defer cancel()
				stopErr <- d.member.Stop(sctx)
			}()
		case err := <-consumed:
			d.consumed = true
			if stopErr != nil {
				<-stopErr
			}
			for {
				select {
				case s := <-d.lostCh:
					d.lose(s)
					continue
				default:
				}
				break
			}
			if err != nil {
				return fmt.Errorf("gaps: group %s: %w", d.cfg.Group, err)
			}
			if done != nil {
				return fmt.Errorf("gaps: group %s: member stopped", d.cfg.Group)
			}
			return nil
		}
		d.ackSafe()
		d.settleRevokes()
		d.maybeCommit()
	}
}

// more takes up to burst messages that are already waiting, without blocking.
func (d *Detector) more() error {
	for n := 0; n < burst; n++ {
		select {
		case it := <-d.in:
			n += len(it.ms)
			if err := d.handleItem(it); err != nil {
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
// an eighth of MaxAckPending waits, when a partition is being handed on, or when CommitInterval has
// passed.
func (d *Detector) maybeCommit() {
	if len(d.dirty) == 0 || d.flight != nil {
		return
	}
	now := d.now()
	idle := len(d.in) == 0 && len(d.mkF.msgs) == 0
	if !idle && d.held < d.cfg.MaxAckPending/8 && now.Sub(d.lastCommit) < d.cfg.CommitInterval && !d.eventsWaiting() && d.revoking == 0 {
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

// handleFPM applies one delivered FPM m, h in its session.
func (d *Detector) handleFPM(m jetstream.Msg, h heldMsg) error {
	p := h.s.p
	meta, err := m.Metadata()
	if err != nil {
		d.unusable(m, h, "FPM", fmt.Errorf("metadata: %w", err))
		return nil
	}
	seq := meta.Sequence.Stream
	if d.cfg.Partitions > 1 { // a partition stream: the FPM sequence is in Nats-Stream-Source
		if seq, err = partition.StreamSequence(m); err != nil {
			d.unusable(m, h, "FPM", err)
			return nil
		}
	}
	key, ok := d.subjectKeyOf(m.Subject(), streams.FPMRoot)
	if !ok {
		d.unusable(m, h, "FPM", fmt.Errorf("subject %q is not fpm.<namespace>.<component>.<worker_id>.<dp_rank>", m.Subject()))
		return nil
	}
	e, err := d.entry(key)
	if err != nil {
		// Not acked and not skippable: give the partition up (Run fails, another member takes it).
		return fmt.Errorf("gaps: load state of %s: %w", key, err)
	}
	if e.part != p {
		d.logger.Warn("gap detector: publisher delivered on another partition than computed", "key", key.String(), "partition", p, "computed", e.part)
	}
	d.hold(e, h)
	if seq <= e.st.StreamSeq {
		d.metrics.skipped.Inc()
		return nil
	}
	if e.catchUp {
		if err := d.catchUpFPM(e, seq); err != nil {
			return err
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

// hold keeps h until e's next checkpoint.
func (d *Detector) hold(e *entry, h heldMsg) {
	e.msgs = append(e.msgs, h)
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

// handleMarker applies one delivered drop marker (an ordered consumer: nothing to ack; a publisher
// loaded later reads the markers after its MarkerSeq by direct get).
func (d *Detector) handleMarker(m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		return nil
	}
	seq := meta.Sequence.Stream
	d.mkDelivered, d.mkDeliveredFrom = meta.Sequence.Consumer, meta.Consumer
	d.mkLastStoredMs = max(d.mkLastStoredMs, meta.Timestamp.UnixMilli())
	d.markerSubjects[m.Subject()] = true
	key, ok := d.subjectKeyOf(m.Subject(), streams.EventsRoot+".drop")
	if !ok {
		d.metrics.invalid.WithLabelValues(streams.StreamEvents).Inc()
		d.logger.Warn("gap detector: drop marker with a bad subject ignored", "subject", m.Subject())
		return nil
	}
	if !d.part.Owns(key) {
		return nil
	}
	e, err := d.entry(key)
	if err != nil {
		return fmt.Errorf("gaps: load state of %s: %w", key, err)
	}
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
	dm, err := streams.ParseDropMarker(body)
	if err != nil {
		e.st.MarkerSeq = seq
		d.metrics.invalid.WithLabelValues(streams.StreamEvents).Inc()
		d.logger.Warn("gap detector: bad drop marker skipped", "subject", subject, "stream_seq", seq, "err", err)
		return
	}
	if dm.Key != e.key {
		d.logger.Warn("gap detector: drop marker key differs from its subject; the subject wins", "subject", subject, "marker_key", dm.Key)
	}
	e.t.addMarker(dm, seq)
	d.metrics.markers.Inc()
}

// unusable skips a message that can never be used: it is acknowledged with the ones around it (a
// Term would acknowledge every message before it too, under cumulative acks).
func (d *Detector) unusable(m jetstream.Msg, h heldMsg, stream string, err error) {
	d.metrics.invalid.WithLabelValues(stream).Inc()
	d.logger.Warn("gap detector: unusable message skipped", "subject", m.Subject(), "err", err)
	h.s.acks.done(h.idx)
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
	for _, s := range d.part.sess {
		if s.lost.Load() { // normally seen on lostCh already
			d.lose(s)
		}
	}
	d.retryOrphans()
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
	for _, e := range stale {
		if !d.silent(e) {
			continue
		}
		if e.t.markStale() {
			nStale++
			d.touch(e)
		}
	}
	if pending > 0 {
		wm := d.mkLastStoredMs
		if ts, ok := d.caughtUpAt(d.mkCons, d.mkF, d.mkDeliveredFrom, d.mkDelivered); ok {
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

// silent reports whether the stream holds no FPM of e after the last one applied (reading those a
// takeover left to catch up first): then it is stale, whatever the partition consumer still holds.
func (d *Detector) silent(e *entry) bool {
	if e.catchUp {
		before := e.st.StreamSeq
		if err := d.catchUpFPM(e, math.MaxUint64); err != nil {
			d.logger.Warn("gap detector: catch-up read failed", "key", e.key.String(), "err", err)
			e.catchUp = true
			return false
		}
		if e.st.StreamSeq != before {
			e.lastLocal = d.now()
			return false
		}
	}
	ctx, cancel := d.ioCtx()
	defer cancel()
	_, err := d.fpmStream.GetMsg(ctx, e.st.StreamSeq+1, jetstream.WithGetMsgSubject(streams.FPMSubject(e.key)))
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

// caughtUpAt reports whether every message stored for consumer c has reached the loop, and the
// server's time when that was true: nothing is pending and the server delivered nothing after the
// last message that reached the loop (delivery sequence delivered of consumer from).
//
// Delivery sequences, not stream sequences: c is filtered, and the server moves its stream position
// past the messages it does not match (the detector's own gap events on FPM_EVENTS) whenever it looks
// for the next one (every pull), so a stream position beyond the last marker delivered does not mean
// a marker is on its way.
func (d *Detector) caughtUpAt(c jetstream.Consumer, f *fetcher, from string, delivered uint64) (time.Time, bool) {
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
	if info.NumPending > 0 {
		return time.Time{}, false
	}
	if info.Name != from {
		delivered = 0 // nothing reached the loop from this consumer yet (a new one after a reset)
	}
	if info.Delivered.Consumer > delivered {
		return time.Time{}, false
	}
	return info.TimeStamp, true
}

// shutdown ends a graceful stop: the member has handed every partition on (each after its
// publishers were checkpointed and acked); stop reading markers and flush the acks.
func (d *Detector) shutdown() error {
	d.mkF.stop()
	if d.flight != nil {
		<-d.flight.done
		_ = d.finishCommit()
	}
	d.forgetAll()
	d.flushAcks()
	d.logger.Info("gap detector stopped")

	return nil
}

// abort ends a failed run: the member gives its partitions up abruptly; nothing more is checkpointed
// and held messages stay unacked (the next owner gets them again).
func (d *Detector) abort(consumed <-chan error) {
	if d.member != nil && !d.consumed {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = d.member.Stop(ctx)
		<-consumed
	}
	d.mkF.stop()
	if d.flight != nil {
		<-d.flight.done
		_ = d.finishCommit()
	}
	d.forgetAll()
	d.flushAcks()
}

func (d *Detector) forgetAll() {
	for _, e := range d.keys {
		d.drop(e)
	}
	clear(d.part.sess)
}

// flushAcks waits until the server has received the acks sent so far.
func (d *Detector) flushAcks() {
	if nc := d.js.Conn(); nc != nil && !nc.IsClosed() {
		if err := nc.FlushTimeout(d.cfg.StopTimeout); err != nil {
			d.logger.Warn("gap detector: flushing acks to the server", "err", err)
		}
	}
}
