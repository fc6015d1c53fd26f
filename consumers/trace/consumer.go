package trace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// ErrAlreadyRunning is returned by a second call of Writer.Run.
var ErrAlreadyRunning = errors.New("trace: writer already running")

// Writer is the trace writer: a durable pull consumer on stream FPM that turns every message into a
// dynamo.fpm.trace.v1 line in its producer's segments (full mode) or the newest message per key and
// interval (sampled mode), and acks a message only once the line holding it (or replacing it) is
// fsynced.
//
// Run owns every file and all run state; a Writer runs once.
type Writer struct {
	cfg     Config
	js      jetstream.JetStream
	logger  *slog.Logger
	now     func() time.Time
	level   int
	open    func(path string) (file, error)
	metrics *metrics
	ready   chan struct{}
	running atomic.Bool

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
	msg jetstream.Msg
	seq uint64
}

// ackDurable acks the pending messages whose lines are durable and keeps the others.
func (p *producer) ackDurable() (acked int, err error) {
	durable := p.sw.Durable()
	i := 0
	for ; i < len(p.pending) && p.pending[i].seq <= durable; i++ {
		if aerr := p.pending[i].msg.Ack(); aerr != nil && err == nil {
			err = aerr
		}
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

// New checks cfg and returns a Writer on js. Nothing is created on the server or on disk until Run.
// Options: WithLogger, WithClock, WithCompressionLevel.
func New(cfg Config, js jetstream.JetStream, opts ...Option) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidConfig)
	}
	w := &Writer{
		cfg:       cfg,
		js:        js,
		logger:    slog.Default(),
		now:       time.Now,
		level:     DefaultCompressionLevel,
		open:      createFile,
		ready:     make(chan struct{}),
		producers: map[string]*producer{},
		bySegment: map[string]*producer{},
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
		w.sampler = newSampler(cfg.SampleInterval)
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
// Before fetching, Run probes that the output directory is writable and repairs the newest segment
// of every producer found there (RepairOutput). An error from the disk or the server ends Run with
// that error; messages whose lines are not durable are then left unacked (redelivered).
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	if err := ProbeOutput(w.cfg.OutputPath); err != nil {
		return err
	}
	if _, err := RepairOutput(w.cfg.OutputPath, w.logger); err != nil {
		return fmt.Errorf("trace: startup repair: %w", err)
	}
	cons, err := w.js.CreateOrUpdateConsumer(ctx, streams.StreamFPM, w.cfg.ConsumerConfig())
	if err != nil {
		return fmt.Errorf("trace: declare consumer %s on %s: %w", w.cfg.Durable, streams.StreamFPM, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(w.cfg.pullBatch()))
	if err != nil {
		return fmt.Errorf("trace: fetch from consumer %s: %w", w.cfg.Durable, err)
	}
	f := startFetcher(it, w.cfg.pullBatch(), w.cfg.ProducerID)
	w.start = w.now()
	w.logger.Info("trace writer started", "mode", w.cfg.Mode, "output", w.cfg.OutputPath,
		"consumer", w.cfg.Durable, "filter", w.cfg.FilterSubject)
	w.fl = startFlusher()
	close(w.ready)

	if err := w.loop(ctx, f); err != nil {
		w.abort(f)
		return err
	}
	return w.shutdown(f)
}

// loop handles messages and flush ticks until ctx is done (nil) or something fails.
func (w *Writer) loop(ctx context.Context, f *fetcher) error {
	tick := time.NewTicker(w.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case m, ok := <-f.msgs:
			if !ok {
				return f.failure()
			}
			if err := w.handle(m); err != nil {
				return err
			}
		case res := <-w.fl.done:
			if err := w.completeFlush(res); err != nil {
				return err
			}
		case <-tick.C:
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
// the unsubscribe (a drained subscription receives all of them), flush, ack, close.
func (w *Writer) shutdown(f *fetcher) error {
	var err error
	w.drain(f, func(m fetched) bool {
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
	cerr := w.closeAll()
	if err == nil {
		err = cerr
	}
	w.flushAcks()
	if err != nil {
		return err
	}
	w.logger.Info("trace writer stopped")
	return nil
}

// flushAcks waits until the server has received the acks sent so far (they are fire-and-forget
// publishes, buffered by the client): an ack lost because the process exits right after Run means a
// line written twice.
func (w *Writer) flushAcks() {
	if nc := w.js.Conn(); nc != nil && !nc.IsClosed() {
		if err := nc.FlushTimeout(w.cfg.StopTimeout); err != nil {
			w.logger.Warn("trace writer: flushing acks to the server", "err", err)
		}
	}
}

// handle turns one message into a line (or a pending sample). A message that can never be written is
// terminated: redelivery cannot fix it.
func (w *Writer) handle(f fetched) error {
	r := f.rec
	if f.err != nil {
		m := r.msg
		w.metrics.invalid.Inc()
		w.logger.Warn("trace writer: invalid FPM message terminated", "subject", m.Subject(), "err", f.err)
		if terr := m.TermWithReason("fpmbus trace: " + f.err.Error()); terr != nil {
			w.logger.Warn("trace writer: terminate", "subject", m.Subject(), "err", terr)
		}
		return nil
	}
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

// drain stops pulling and passes every message still arriving to fn (until fn returns false or
// StopTimeout passes), then stops the fetcher. Once the drain is complete the server knows the pull
// subscription is gone, so nothing more is delivered to it, and a nak is redelivered to someone else.
func (w *Writer) drain(f *fetcher, fn func(fetched) bool) {
	f.drain()
	timer := time.NewTimer(w.cfg.StopTimeout)
	defer timer.Stop()
loop:
	for {
		select {
		case m, ok := <-f.msgs:
			if !ok || !fn(m) {
				break loop
			}
		case <-timer.C:
			w.logger.Warn("trace writer: stop timeout; messages not yet handled will be redelivered after the ack wait",
				"stop_timeout", w.cfg.StopTimeout, "ack_wait", w.cfg.ackWait())
			break loop
		}
	}
	f.stop()
}

// abort ends a failed run: messages whose lines are durable are acked, the others (and those still
// arriving) naked so that they are redelivered at once; the files are closed without a flush (a member
// written now would be acked by nobody, and its messages are redelivered anyway).
func (w *Writer) abort(f *fetcher) {
	// Nak only once the drain is complete: the server then knows this subscription is gone and
	// redelivers to another one instead of back into the one being drained.
	var unhandled []jetstream.Msg
	w.drain(f, func(m fetched) bool {
		unhandled = append(unhandled, m.rec.msg)
		return true
	})
	for _, m := range unhandled {
		_ = m.Nak()
	}
	_ = w.awaitFlush() // its durable lines are acked
	w.fl.stop()
	for _, p := range w.bySegment {
		_, _ = p.ackDurable()
		for _, pa := range p.pending {
			_ = pa.msg.Nak()
		}
		p.pending = nil
		p.sw.closeFile()
		p.sw.closed = true
	}
	if w.sampler != nil {
		w.sampler.nakAll()
	}
	w.flushAcks()
}

// closeAll closes every segment writer (they have been flushed).
func (w *Writer) closeAll() error {
	var err error
	for _, p := range w.bySegment {
		err = errors.Join(err, p.sw.Close())
	}
	return err
}
