package gaps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
)

// errAlreadyRunning is returned by a second call of Detector.Run.
var errAlreadyRunning = errors.New("gaps: detector already running")

// ConsumerName names the detector in the durable runner: metrics label consumer="gaps", dead letters
// on fpmevents.deadletter.consumer.gaps.
const ConsumerName = "gaps"

// handBatch is the most FPMs the runner hands to Handle at once.
const handBatch = 256

// Detector is the gap detector: a durable.Consumer, run by a durable.Runner as one member of the
// partition group Config.Group on stream FPM (consumers/partition), that tracks the sequence of every
// publisher of the partitions it owns, reads the bridge's drop markers (markerReader; markers of
// publishers it does not own are ignored, their owner reads them too), publishes one event per gap on
// FPM_EVENTS and checkpoints each publisher's State in the state bucket (stateStore) before it marks
// the messages the state reflects done.
//
// Every method of the Consumer runs on the runner's loop goroutine, which owns all run state; a
// Detector runs once.
type Detector struct {
	cfg     Config
	js      jetstream.JetStream
	logger  *slog.Logger     // Config.Logger
	now     func() time.Time // durable.Settings.Clock
	metrics *metrics
	rules   rules
	ready   chan struct{}
	running atomic.Bool
	runner  *durable.Runner
	store   *stateStore
	markers *markerReader

	// Run state, owned by the runner's loop.
	owned      map[int]bool // partitions assigned (their publishers' states preloaded) and not released or lost
	releasing  int          // the partition Release is checkpointing, -1 when none
	keys       map[streams.Key]*entry
	subjects   map[string]*subjectKey // subject -> key, parsed once
	dirty      []*entry
	held       int  // messages waiting for their checkpoint
	backlog    bool // the last batch handed was full: more messages are waiting
	lastCommit time.Time
	flight     *inflight // the checkpoint being written, if any
	newEvents  bool      // events emitted since the last checkpoint started
	fault      error     // a failure found outside Handle and Tick (the marker reader's): the next one returns it
	// mkLastStoredMs is the stream time of the newest drop marker applied. mkDelivered is the marker
	// reader's delivery sequence of the last marker that reached the loop, and mkDeliveredFrom the
	// server-side consumer that delivered it (an ordered consumer is recreated, under a new name, after
	// a reset).
	mkLastStoredMs  int64
	mkDelivered     uint64
	mkDeliveredFrom string
	// mkCaughtUpMs is the stream time up to which every stored marker had reached the loop when the
	// marker reader was last seen caught up (markerReader.caughtUpAt).
	mkCaughtUpMs int64
	mkBuf        []jetstream.Msg
	// markerSubjects are the drop marker subjects with a marker stored before the marker reader
	// started or read by it since: a publisher loaded without one has no marker to catch up.
	markerSubjects map[string]bool
	// orphans are the held messages of publishers whose reload failed: marked done once the publisher
	// is loaded again (the load re-reads the stream from its checkpoint), retried every tick.
	orphans map[streams.Key][]*durable.Msg
}

// subjectKey is what a subject says: its publisher (ok: it names one), and that publisher's entry
// while loaded (FPM subjects).
type subjectKey struct {
	key streams.Key
	ok  bool
	e   *entry
}

var (
	_ durable.Consumer          = (*Detector)(nil)
	_ durable.PartitionObserver = (*Detector)(nil)
)

// New checks cfg and returns a Detector on js. Nothing is created on the server until Run; the
// streams must exist (streams.Apply). Options: durable.WithMemberID, durable.WithClock (the wall clock
// used only for when to check: stale publishers, commit pacing; event content never comes from it).
func New(cfg Config, js jetstream.JetStream, opts ...durable.Option) (*Detector, error) {
	set, err := durable.CheckStage(cfg.Validate, js, ErrInvalidConfig, opts)
	if err != nil {
		return nil, err
	}
	if cfg.FPMShards == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), max(cfg.PublishTimeout, 5*time.Second))
		n, err := streams.FPMShardsOf(ctx, js)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("gaps: FPM shards: %w", err)
		}
		cfg.FPMShards = n
	}
	d := &Detector{
		cfg:       cfg,
		js:        js,
		rules:     cfg.rules(),
		ready:     make(chan struct{}),
		store:     &stateStore{js: js, cfg: cfg},
		owned:     map[int]bool{},
		releasing: -1,
		keys:      map[streams.Key]*entry{},
		orphans:   map[streams.Key][]*durable.Msg{},
		subjects:  map[string]*subjectKey{},
	}
	d.logger, d.now = cmp.Or(cfg.Logger, slog.Default()), set.Clock
	rc := cfg.runnerConfig()
	rc.Logger, rc.Registerer = d.logger, cfg.Registerer
	r, err := durable.New(rc, js, d, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	d.runner = r
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("gaps: register metrics: %w", err)
	}
	d.metrics = m
	return d, nil
}

// Ready is closed once Run has joined the group and is taking partitions.
func (d *Detector) Ready() <-chan struct{} { return d.ready }

// Run detects gaps until ctx is done, then stops gracefully within StopTimeout: every owned partition
// is handed on after its publishers are checkpointed, their events published and their messages
// acked; it returns nil. Messages not acked are redelivered to the next owner and skipped if already
// reflected, so a stop anywhere (even kill -9) neither loses a gap nor reports one twice.
//
// Run creates the state bucket if missing, starts reading drop markers and runs the detector's
// durable.Runner; each time it is given a partition it loads the state of that partition's
// publishers (publishing events a previous owner checkpointed but may not have stored) and catches
// them up from the stream.
func (d *Detector) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	if err := d.setup(ctx); err != nil {
		return err
	}
	defer d.markers.stop()
	ended := make(chan struct{})
	announced := make(chan struct{})
	go func() {
		defer close(announced)
		select {
		case <-d.runner.Ready():
			d.logger.Info("gap detector started", "group", d.cfg.Group, "filter", d.cfg.FilterSubject,
				"partitions", d.cfg.Partitions, "stale_after", d.cfg.StaleAfter, "marker_grace", d.cfg.MarkerGrace)
			close(d.ready)
		case <-ended:
		}
	}()
	err := d.runner.Run(ctx)
	close(ended)
	<-announced
	d.flushAcks()
	if err != nil {
		return err
	}
	d.logger.Info("gap detector stopped")
	return nil
}

// setup creates the state bucket, looks up the streams and starts reading drop markers.
func (d *Detector) setup(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := d.store.open(sctx); err != nil {
		return err
	}
	// Drop markers: every instance reads all of them from now on (markers stored before are read by
	// direct get when a publisher is loaded) and applies those of the publishers it owns.
	evInfo, err := d.store.events.Info(sctx, jetstream.WithSubjectFilter(d.cfg.MarkerFilter()))
	if err != nil {
		return fmt.Errorf("gaps: stream %s: %w", streams.StreamEvents, err)
	}
	d.markerSubjects = make(map[string]bool, len(evInfo.State.Subjects))
	for subj := range evInfo.State.Subjects {
		d.markerSubjects[subj] = true
	}
	if d.markers, err = startMarkerReader(sctx, d.store.events, d.cfg.MarkerFilter(), evInfo.State.LastSeq+1,
		func() { d.runner.Do(d.applyMarkers) }); err != nil {
		return err
	}
	d.lastCommit = d.now()
	return nil
}

// flushAcks waits until the server has received the acks sent so far.
func (d *Detector) flushAcks() {
	if nc := d.js.Conn(); nc != nil && !nc.IsClosed() {
		if err := nc.FlushTimeout(d.cfg.StopTimeout); err != nil {
			d.logger.Warn("gap detector: flushing acks to the server", "err", err)
		}
	}
}
