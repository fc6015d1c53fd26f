package trace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// ErrAlreadyRunning is returned by a second call of Writer.Run (or Backfill).
var ErrAlreadyRunning = errors.New("trace: writer already running")

// errStopping tells a caller of awaitFlush that the loop's context is done while a flush is blocked
// (retrying a failed write): the lines stay buffered for the graceful stop.
var errStopping = errors.New("trace: stopping")

// Write retry defaults (see WithWriteRetry).
const (
	DefaultRetryInitial = 100 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
)

// floorPollInterval is how often Run reads the consumer's ack floor to forget settled sequences.
const floorPollInterval = 5 * time.Second

// Writer is the trace writer: a durable pull consumer on stream FPM that turns every message into a
// dynamo.fpm.trace.v1 line in its producer's segments (full mode) or the newest message per key and
// interval (sampled mode), and acks a message only once the line holding it (or replacing it) is
// fsynced. A redelivered message whose line is already written is acked and skipped (seqState,
// recover.go); a failed write is retried with backoff, without acking, until the disk takes it again.
//
// Run (or Backfill) owns every file and all run state; a Writer runs once.
type Writer struct {
	cfg        Config
	js         jetstream.JetStream
	logger     *slog.Logger
	now        func() time.Time
	level      int
	open       func(path string) (file, error)
	retry      func() backoff.BackOff
	meta       metaOf
	floorEvery time.Duration
	wrap       func(msgSource) msgSource // tests: lose acks, inject redeliveries
	metrics    *metrics
	ready      chan struct{}
	running    atomic.Bool

	// Scale-out (group.go): the membership of RunGroup; in a partition session, the parent's start
	// (fixedStart), no naks (a partition's messages are only redelivered by the next owner's reset)
	// and the takeover check.
	member     *partition.Member
	fixedStart time.Time
	noNak      bool
	takeover   *takeover

	// Run state, owned by Run's goroutine.
	start     time.Time
	producers map[string]*producer // by unsanitized producer id
	bySegment map[string]*producer // by sanitized id: ids that sanitize alike share files
	dirty     []*producer          // exactly the producers with dirty set
	waiting   int                  // messages waiting for their line (or the lines before them) to be durable
	unflushed int                  // of those, messages whose lines are not yet handed to the flusher
	fl        *flusher
	lineBuf   []byte
	sampler   *sampler // sampled mode only
	seqs      *seqState
	recovery  RecoveryResult
	// interrupt ends a wait for the flush in flight: the context during the loop, the stop deadline
	// during the graceful stop; with stopping set the flush is then given up.
	interrupt <-chan struct{}
	stopping  bool
	// Totals of this run.
	linesWritten, invalidCount uint64
}

// producer is one producer's segment writer and the messages waiting for its lines to be durable.
type producer struct {
	sw      *SegmentWriter
	pending []pendingAck // in line order
	lines   int          // lines appended since the last flush
	dirty   bool
}

// pendingAck is a message acked once its producer's line number seq is durable (sw.Durable() >= seq):
// the message's own line, or for a message that needs no line (sampled mode: superseded, unchanged
// counter, late), the lines appended before it.
type pendingAck struct {
	msg  jetstream.Msg
	seq  uint64 // line number in p.sw
	sseq uint64 // stream sequence (seqState), 0 if unknown
}

// ackDurable acks the pending messages whose lines are durable and keeps the others.
func (p *producer) ackDurable(seqs *seqState) (acked int, err error) {
	durable := p.sw.Durable()
	i := 0
	for ; i < len(p.pending) && p.pending[i].seq <= durable; i++ {
		if aerr := p.pending[i].msg.Ack(); aerr != nil && err == nil {
			err = aerr
		}
		seqs.finish(p.pending[i].sseq)
		p.pending[i].msg = nil
	}
	n := copy(p.pending, p.pending[i:])
	clear(p.pending[n:])
	p.pending = p.pending[:n]
	return i, err
}

// Option configures a Writer beyond Config.
type Option func(*Writer) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(w *Writer) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidConfig)
		}
		w.logger = l
		return nil
	}
}

// WithClock sets the clock used for the lines' writer-relative "timestamp" (tests pin it).
func WithClock(now func() time.Time) Option {
	return func(w *Writer) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidConfig)
		}
		w.now = now
		return nil
	}
}

// WithCompressionLevel sets the gzip level of new members (1 fastest … 9 smallest; default
// DefaultCompressionLevel).
func WithCompressionLevel(level int) Option {
	return func(w *Writer) error {
		if level < 1 || level > 9 {
			return fmt.Errorf("%w: gzip level %d: want 1 to 9", ErrInvalidConfig, level)
		}
		w.level = level
		return nil
	}
}

// WithWriteRetry sets the backoff of a failed segment write (disk full, I/O error, unwritable
// directory): exponential from initial to at most maxWait, with jitter, retried until it succeeds or
// the writer stops (defaults DefaultRetryInitial, DefaultRetryMax).
func WithWriteRetry(initial, maxWait time.Duration) Option {
	return func(w *Writer) error {
		if initial <= 0 || maxWait < initial {
			return fmt.Errorf("%w: write retry %v..%v: want 0 < initial <= max", ErrInvalidConfig, initial, maxWait)
		}
		w.retry = retryPolicy(initial, maxWait)
		return nil
	}
}

func retryPolicy(initial, maxWait time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = initial
		b.MaxInterval = maxWait
		b.MaxElapsedTime = 0 // until the disk takes the data again, or the writer stops
		b.Reset()
		return b
	}
}

// New checks cfg and returns a Writer on js. Nothing is created on the server or on disk until Run.
// Options: WithLogger, WithClock, WithCompressionLevel, WithWriteRetry.
func New(cfg Config, js jetstream.JetStream, opts ...Option) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidConfig)
	}
	w := &Writer{
		cfg:        cfg,
		js:         js,
		logger:     slog.Default(),
		now:        time.Now,
		level:      DefaultCompressionLevel,
		open:       createFile,
		retry:      retryPolicy(DefaultRetryInitial, DefaultRetryMax),
		meta:       jsMeta,
		floorEvery: floorPollInterval,
		ready:      make(chan struct{}),
		producers:  map[string]*producer{},
		bySegment:  map[string]*producer{},
		seqs:       newSeqState(0),
	}
	for _, o := range opts {
		if err := o(w); err != nil {
			return nil, err
		}
	}
	m, err := newMetrics(cfg.Registerer, cfg.Mode)
	if err != nil {
		return nil, fmt.Errorf("trace: register metrics: %w", err)
	}
	w.metrics = m
	if cfg.Mode == schemas.CaptureSampled {
		w.sampler = newSampler(cfg.SampleInterval, cfg.SampleInterval+2*cfg.FlushInterval)
	}
	return w, nil
}

// Ready is closed once Run has repaired the output, declared the consumer and started fetching. It is
// never closed if Run fails before that; wait for Run's result as well.
func (w *Writer) Ready() <-chan struct{} { return w.ready }

// ConsumerConfig is the durable consumer the Writer declares (idempotently) on stream FPM.
func (c Config) ConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.Durable,
		Description:   "fpmbus trace writer (" + c.Mode + " mode): FPM -> gzip JSONL segments",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.ackWait(),
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
		FilterSubject: c.FilterSubject,
	}
}

// pullBatch is how many messages the client asks the server for at a time.
func (c Config) pullBatch() int {
	return min(max(c.MaxAckPending/4, 1), 4096)
}

// Run writes traces until ctx is done, then stops gracefully within StopTimeout: it drains the pull
// subscription (every message the server sent before it saw the unsubscribe is still received),
// writes what it received (sampled mode: every pending sample), flushes and fsyncs, acks, waits until
// the server has the acks, closes the files and returns nil. What the StopTimeout cuts off stays
// unacked and is redelivered after AckWait.
//
// Before fetching, Run probes that the output directory is writable, repairs the newest segment of
// every producer found there (RepairOutput) and runs the recovery (recover.go): the unacked messages
// whose lines are already on disk are skipped when redelivered. A failed write is retried with backoff
// (WithWriteRetry) while nothing more is acked; an error that retrying cannot fix (another writer owns
// a segment, the server is gone) ends Run with that error, leaving messages whose lines are not durable
// unacked (redelivered).
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := w.prepareOutput(); err != nil {
		return err
	}
	cons, err := w.js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, w.cfg.ConsumerConfig())
	if err != nil {
		return fmt.Errorf("trace: declare consumer %s on %s: %w", w.cfg.Durable, streams.StreamFPM, err)
	}
	if w.recovery, err = w.recover(ctx, cons.CachedInfo()); err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(w.cfg.pullBatch()))
	if err != nil {
		return fmt.Errorf("trace: fetch from consumer %s: %w", w.cfg.Durable, err)
	}
	fp := startFloorPoller(cons, w.floorEvery)
	defer fp.stop()
	var src msgSource = it
	if w.wrap != nil {
		src = w.wrap(src)
	}
	w.logger.Info("trace writer started", "mode", w.cfg.Mode, "output", w.cfg.OutputPath,
		"consumer", w.cfg.Durable, "filter", w.cfg.FilterSubject)
	return w.consume(ctx, src, fp.floors, false)
}

// Recovery returns what the startup recovery found (valid once Ready is closed).
func (w *Writer) Recovery() RecoveryResult { return w.recovery }

// prepareOutput is the startup disk step: the write probe and the torn-tail repair.
func (w *Writer) prepareOutput() error {
	if err := ProbeOutput(w.cfg.OutputPath); err != nil {
		return err
	}
	if _, err := RepairOutput(w.cfg.OutputPath, w.logger); err != nil {
		return fmt.Errorf("trace: startup repair: %w", err)
	}
	return nil
}

// consume runs the loop over src until ctx is done or, when bounded, src ends with errEndOfRange;
// then it stops gracefully (shutdown), or, after a failure, aborts. floors carries the consumer's ack
// floor (nil: none).
func (w *Writer) consume(ctx context.Context, src msgSource, floors <-chan uint64, bounded bool) error {
	f := startFetcher(src, w.cfg.pullBatch(), w.cfg.ProducerID, w.meta)
	w.start = w.fixedStart
	if w.start.IsZero() {
		w.start = w.now()
	}
	w.fl = startFlusher(w.retry, w.reportRetry)
	close(w.ready)
	if err := w.loop(ctx, f, floors, bounded); err != nil {
		w.abort(f)
		return err
	}
	return w.shutdown(f)
}

// reportRetry logs a failed write that will be retried (called from the flusher's goroutines).
func (w *Writer) reportRetry(sw *SegmentWriter, err error, wait time.Duration) {
	w.metrics.retries.Inc()
	w.logger.Warn("trace writer: write failed; nothing more is acked until it succeeds, retrying",
		"prefix", sw.Prefix(), "err", err, "retry_in", wait)
}

// loop handles messages and flush ticks until ctx is done (nil), a bounded source ends (nil) or
// something fails.
func (w *Writer) loop(ctx context.Context, f *fetcher, floors <-chan uint64, bounded bool) error {
	tick := time.NewTicker(w.cfg.FlushInterval)
	defer tick.Stop()
	w.interrupt = ctx.Done()
	for {
		select {
		case m, ok := <-f.msgs:
			if !ok {
				if bounded && f.ended() {
					return nil
				}
				return f.failure()
			}
			if err := w.handle(m); err != nil {
				return err
			}
		case res := <-w.fl.done:
			if err := w.completeFlush(res); err != nil {
				return err
			}
		case floor := <-floors:
			w.seqs.trim(floor)
		case <-tick.C:
			if w.takeover != nil && w.takeover.lost() {
				return errPartitionLost
			}
			if w.sampler != nil {
				if err := w.sampler.emitDue(w, w.now()); err != nil {
					return err
				}
			}
			if err := w.flush(); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// shutdown is the graceful stop: stop pulling, write every message the server delivered before it saw
// the unsubscribe (a drained subscription receives all of them), flush, ack, close. A flush that is
// still failing at the StopTimeout is given up (its messages stay unacked).
func (w *Writer) shutdown(f *fetcher) error {
	stop, cancel := context.WithTimeout(context.Background(), w.cfg.StopTimeout)
	defer cancel()
	w.interrupt, w.stopping = stop.Done(), true
	var err error
	w.drain(f, stop.Done(), func(m fetched) bool {
		err = w.handle(m)
		return err == nil
	})
	if err == nil && w.sampler != nil {
		err = w.sampler.emitAll(w)
	}
	if err == nil {
		err = w.flush()
	}
	if ferr := w.awaitFlush(); err == nil {
		err = ferr
	}
	w.fl.stop()
	if err != nil {
		w.closeFailed()
		if w.sampler != nil {
			w.sampler.nakAll(w)
		}
		w.flushAcks()
		return err
	}
	cerr := w.closeAll()
	w.flushAcks()
	if cerr != nil {
		return cerr
	}
	w.logger.Info("trace writer stopped")
	return nil
}

// flushAcks waits until the server has received the acks sent so far (they are fire-and-forget
// publishes, buffered by the client): an ack lost because the process exits right after Run means a
// redelivery (skipped by the next run's recovery, but work nonetheless).
func (w *Writer) flushAcks() {
	if nc := w.js.Conn(); nc != nil && !nc.IsClosed() {
		if err := nc.FlushTimeout(w.cfg.StopTimeout); err != nil {
			w.logger.Warn("trace writer: flushing acks to the server", "err", err)
		}
	}
}

// handle turns one message into a line (or a pending sample). A redelivery of a message that is done
// (acked, or written by an earlier run) is acked again and skipped; one of a message still held is
// dropped (the held copy's ack settles it). A message that can never be written is terminated:
// redelivery cannot fix it.
func (w *Writer) handle(f fetched) error {
	if w.takeover != nil && w.takeover.lost() {
		return errPartitionLost
	}
	r := f.rec
	if r.delivered > 1 {
		switch held, done := w.seqs.status(r.seq); {
		case done:
			w.metrics.skippedWritten.Inc()
			if err := r.msg.Ack(); err != nil {
				w.logger.Warn("trace writer: ack of a redelivered message already written", "seq", r.seq, "err", err)
			}
			return nil
		case held:
			w.metrics.skippedHeld.Inc()
			return nil
		}
	}
	if f.err != nil {
		m := r.msg
		w.metrics.invalid.Inc()
		w.invalidCount++
		w.logger.Warn("trace writer: invalid FPM message terminated", "subject", m.Subject(), "err", f.err)
		if terr := m.TermWithReason("fpmbus trace: " + f.err.Error()); terr != nil {
			w.logger.Warn("trace writer: terminate", "subject", m.Subject(), "err", terr)
		}
		w.seqs.finish(r.seq)
		return nil
	}
	if w.takeover != nil {
		switch written, err := w.takeover.written(&r); {
		case err != nil:
			return err
		case written:
			w.metrics.skippedWritten.Inc()
			w.seqs.finish(r.seq)
			if err := r.msg.Ack(); err != nil {
				w.logger.Warn("trace writer: ack of a message written by the previous owner", "seq", r.seq, "err", err)
			}
			return nil
		}
	}
	w.seqs.hold(r.seq)
	if w.sampler != nil {
		return w.sampler.add(w, &r)
	}
	return w.handleFull(&r)
}

// write appends r's line to p's segments.
func (w *Writer) write(p *producer, r *record) error {
	ts := max(w.now().Sub(w.start).Milliseconds(), 0)
	w.lineBuf = appendLine(w.lineBuf[:0], r, ts, w.cfg.Mode)
	if err := p.sw.Append(w.lineBuf); err != nil {
		return err
	}
	p.lines++
	if !p.dirty {
		p.dirty = true
		w.dirty = append(w.dirty, p)
	}
	return nil
}

// account notes n more messages of p waiting for a flush. p's lines go to the flusher when its buffer
// is full; every producer's when a quarter of MaxAckPending waits unflushed (the server stops
// delivering at MaxAckPending, and a flush may be in flight).
func (w *Writer) account(p *producer, n int) error {
	w.waiting += n
	w.unflushed += n
	if w.unflushed >= max(w.cfg.MaxAckPending/4, 1) {
		return w.flush()
	}
	if p.sw.Buffered() >= w.cfg.BufferSize {
		return w.submit([]*producer{p})
	}
	return nil
}

// producerFor returns the producer of id, creating its SegmentWriter (at the next free index) on first
// use.
func (w *Writer) producerFor(id string) (*producer, error) {
	if p, ok := w.producers[id]; ok {
		return p, nil
	}
	prefix := SegmentPrefix(w.cfg.OutputPath, id)
	p, ok := w.bySegment[prefix]
	if !ok {
		sw, err := newSegmentWriter(prefix, w.cfg.RollBytes, w.cfg.MaxSegments, w.level, w.logger)
		if err != nil {
			return nil, err
		}
		sw.open = w.open
		sw.onRoll = w.metrics.rolled.Inc
		p = &producer{sw: sw}
		w.bySegment[prefix] = p
		w.logger.Debug("trace writer: new producer", "producer_id", id, "segment", sw.Path())
	}
	w.producers[id] = p
	return p, nil
}

// drain stops pulling and passes every message still arriving to fn (until fn returns false or done is
// closed), then stops the fetcher. Once the drain is complete the server knows the pull subscription
// is gone, so nothing more is delivered to it, and a nak is redelivered to someone else.
func (w *Writer) drain(f *fetcher, done <-chan struct{}, fn func(fetched) bool) {
	f.drain()
loop:
	for {
		select {
		case m, ok := <-f.msgs:
			if !ok || !fn(m) {
				break loop
			}
		case <-done:
			w.logger.Warn("trace writer: stop timeout; messages not yet handled will be redelivered after the ack wait",
				"stop_timeout", w.cfg.StopTimeout, "ack_wait", w.cfg.ackWait())
			break loop
		}
	}
	f.stop()
}

// abort ends a failed run: messages whose lines are durable are acked, the others (and those still
// arriving) naked so that they are redelivered at once; a flush still retrying is given up, and the
// files are closed without a flush (a member written now would be acked by nobody, and its messages
// are redelivered anyway).
func (w *Writer) abort(f *fetcher) {
	closed := make(chan struct{})
	close(closed)
	w.interrupt, w.stopping = closed, true
	// Nak only once the drain is complete: the server then knows this subscription is gone and
	// redelivers to another one instead of back into the one being drained.
	var unhandled []fetched
	stop, cancel := context.WithTimeout(context.Background(), w.cfg.StopTimeout)
	w.drain(f, stop.Done(), func(m fetched) bool {
		unhandled = append(unhandled, m)
		return true
	})
	cancel()
	for _, m := range unhandled {
		if held, done := w.seqs.status(m.rec.seq); m.rec.delivered > 1 && (held || done) {
			continue // a redelivered copy of a message this writer holds or settled
		}
		if !w.noNak {
			_ = m.rec.msg.Nak()
		}
	}
	_ = w.awaitFlush() // its durable lines are acked
	w.fl.stop()
	w.closeFailed()
	if w.sampler != nil {
		w.sampler.nakAll(w)
	}
	w.flushAcks()
}

// closeFailed acks what is durable, naks what is not and closes every file without flushing.
func (w *Writer) closeFailed() {
	for _, p := range w.bySegment {
		n, _ := p.ackDurable(w.seqs)
		w.waiting -= n
		for _, pa := range p.pending {
			if !w.noNak {
				_ = pa.msg.Nak()
			}
			w.seqs.release(pa.sseq)
		}
		w.waiting -= len(p.pending)
		p.pending = nil
		p.sw.closeFile()
		p.sw.closed = true
	}
}

// closeAll closes every segment writer (they have been flushed).
func (w *Writer) closeAll() error {
	var err error
	for _, p := range w.bySegment {
		err = errors.Join(err, p.sw.Close())
	}
	return err
}

// release hands the given producers back (the seam for a partitioned group's "on revoked"): their
// pending samples are written, their lines flushed and fsynced, their messages acked, their files
// closed, and the writer forgets them (a later message of theirs starts a new segment).
func (w *Writer) release(ids []string) error {
	ps := map[*producer]bool{}
	var list []*producer
	for _, id := range ids {
		if p, ok := w.producers[id]; ok && !ps[p] {
			ps[p] = true
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		return nil
	}
	if w.sampler != nil {
		if err := w.sampler.emitProducers(w, ps); err != nil {
			return err
		}
	}
	if err := w.submit(list); err != nil {
		return err
	}
	if err := w.awaitFlush(); err != nil {
		return err
	}
	var err error
	for _, p := range list {
		n, aerr := p.ackDurable(w.seqs)
		w.waiting -= n
		if aerr != nil {
			w.logger.Warn("trace writer: ack failed; the message will be redelivered and skipped", "err", aerr)
		}
		if len(p.pending) > 0 {
			err = errors.Join(err, fmt.Errorf("trace: release %s: %d messages not durable", p.sw.Prefix(), len(p.pending)))
		}
		err = errors.Join(err, p.sw.Close())
		delete(w.bySegment, p.sw.Prefix())
	}
	for id, p := range w.producers {
		if ps[p] {
			delete(w.producers, id)
		}
	}
	if w.sampler != nil {
		w.sampler.forget(ps)
	}
	return err
}

// floorPoller reads the durable consumer's ack floor every so often, off the loop; the loop trims
// seqState with it. It owns one goroutine; stop ends it.
type floorPoller struct {
	floors chan uint64
	cancel context.CancelFunc
	done   chan struct{}
}

func startFloorPoller(cons jetstream.Consumer, every time.Duration) *floorPoller {
	ctx, cancel := context.WithCancel(context.Background())
	p := &floorPoller{floors: make(chan uint64, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ictx, icancel := context.WithTimeout(ctx, every)
			ci, err := cons.Info(ictx)
			icancel()
			if err != nil {
				continue
			}
			select {
			case <-p.floors: // replace a value not yet taken
			default:
			}
			select {
			case p.floors <- ci.AckFloor.Stream:
			default:
			}
		}
	}()
	return p
}

func (p *floorPoller) stop() {
	p.cancel()
	<-p.done
}
