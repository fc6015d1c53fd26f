package trace

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/tracefile"
)

// delivery is one message as the writer sees it: what it reads, and how it says the message is done
// (its line, or the line that replaces it, is durable) or can never be written. *durable.Msg is one;
// a backfill's replayed messages have nothing to settle.
type delivery interface {
	tracefile.Message
	Done()
	Reject(reason error)
}

// record is one message of the FPM stream, checked and ready to become a trace line
// (tracefile.Record), and the delivery that settles it.
type record struct {
	tracefile.Record
	d delivery
}

// parseRecord checks d as tracefile.ParseRecord does (the rule by which `fpmbus trace verify` files
// stream messages too) and keeps d to settle it. An error means the message can never be written (bad
// subject or body): the caller rejects it.
func parseRecord(d delivery, md tracefile.MsgMeta, producerOverride string, keys tracefile.SubjectKeys) (record, error) {
	r, err := tracefile.ParseRecord(d, md, producerOverride, keys)
	return record{Record: r, d: d}, err
}

// writer turns the records of one ordered stream of messages — an owned partition's (Consumer) or a
// backfill's range — into lines in their producers' segments, and says each message done once the
// line holding it is durable (for a message that needs no line of its own, once the lines appended
// before it are). It is owned by one goroutine: the runner's loop, or Backfill's; its flusher writes
// and fsyncs off that goroutine.
type writer struct {
	cfg   Config
	set   settings
	log   *slog.Logger
	m     *metrics
	start time.Time // lines' "timestamp" counts from it (writer-relative, as in Dynamo)

	producers map[string]*producer // by unsanitized producer id
	bySegment map[string]*producer // by segment prefix: ids that sanitize alike share files
	dirty     []*producer          // exactly the producers with dirty set
	waiting   int                  // messages waiting for their line (or the lines before them) to be durable
	unflushed int                  // of those, messages whose lines are not yet handed to the flusher
	fl        *flusher
	again     bool // a flush was asked for while one was in flight: it starts when that one completes
	lineBuf   []byte
	sampler   *sampler         // sampled mode only
	takeover  *takeover        // recognises what an earlier owner wrote; nil for a backfill
	existing  *existingLines   // a backfill's: the lines its output holds already; nil for the live writer
	segs      *processSegments // where this process's writers left their producers' segments; nil: none
	// onPrune, if set, is told of every segment retention removed, after the writer reported it.
	onPrune func(prunedSegment)

	// own owns the producers' prefixes (tracefile/owner.go): a producer's SegmentWriter is made only once its
	// prefix is owned, and claims, the prefixes this writer took, are given up when it ends. nil: no
	// ownership is taken (tests that drive a writer alone). rejectHeld: a prefix another process owns
	// rejects that producer's messages, and the others go on (the live writer); else it ends the
	// writer (a backfill).
	own        *tracefile.Owner
	claims     map[string]bool
	rejectHeld bool
	// unrepaired are the producers whose repair was refused (unrepaired.go), shared by the writers of
	// a Consumer; nil: none are (a backfill, whose repair refuses it as a whole).
	unrepaired unrepaired

	linesWritten uint64 // totals of this writer
}

// producer is one producer's segment writer and the messages waiting for its lines to be durable.
type producer struct {
	sw      *SegmentWriter
	pending []pendingDone // in line order
	lines   int           // lines appended since the last flush
	dirty   bool
}

// pendingDone is a message that is done once its producer's line number line is durable
// (sw.Durable() >= line): the message's own line, or for a message that needs no line (sampled mode:
// superseded, unchanged counter, late), the lines appended before it.
type pendingDone struct {
	d    delivery
	line uint64
}

// messageError is the reason one message can never be written: it is rejected (dead-lettered) and
// the other messages go on. Any other error is a fault of the instance and ends it.
type messageError struct{ err error }

func (e *messageError) Error() string { return e.err.Error() }
func (e *messageError) Unwrap() error { return e.err }

// newWriter returns a writer whose flusher is running; notify (nil: none) is called, from the
// flusher's goroutine, each time a flush completes and waits for collect.
func newWriter(cfg Config, set settings, log *slog.Logger, m *metrics, start time.Time, notify func()) *writer {
	w := &writer{
		cfg:       cfg,
		set:       set,
		log:       log,
		m:         m,
		start:     start,
		producers: map[string]*producer{},
		bySegment: map[string]*producer{},
	}
	if cfg.Mode == ModeSampled {
		w.sampler = newSampler(cfg.SampleInterval, cfg.SampleInterval+2*cfg.FlushInterval)
	}
	w.fl = startFlusher(set.retry, w.reportRetry, notify)
	return w
}

// reportRetry logs a failed write that will be retried (called from the flusher's goroutines).
func (w *writer) reportRetry(sw *SegmentWriter, err error, wait time.Duration) {
	w.m.retries.Inc()
	w.log.Warn("trace writer: write failed; its messages stay unacknowledged until it succeeds, retrying",
		"prefix", sw.Prefix(), "err", err, "retry_in", wait)
}

// handle turns one record into a line (or a pending sample). A redelivered message whose line an
// earlier owner already made durable is done at once, without a line.
func (w *writer) handle(r *record) error {
	if err := w.repairRefusedProducer(r); err != nil {
		return err
	}
	if w.takeover != nil {
		written, err := w.takeover.written(r)
		if err != nil {
			return err
		}
		if written {
			w.m.skippedWritten.Inc()
			r.d.Done()
			return nil
		}
	}
	if w.existing != nil {
		if w.sampler != nil {
			// Read the producer's files before its first sample: emit consults them.
			if _, err := w.existing.producer(tracefile.SegmentPrefix(w.cfg.OutputPath, r.Producer), r); err != nil {
				return err
			}
		} else if written, err := w.existing.written(r); err != nil || written {
			if written {
				r.d.Done()
			}
			return err
		}
	}
	if w.sampler != nil {
		return w.sampler.add(w, r)
	}
	return w.handleFull(r)
}

// handleFull is full mode (DYN_FPM_MODE=full): every valid message, idle heartbeats included, becomes
// one line in its producer's segments, in stream order; handleFull writes r's line and queues its Done
// behind that line, so the message is done once that line is durable. (Sampled mode is
// writer_sampled.go's.)
func (w *writer) handleFull(r *record) error {
	p, err := w.producerFor(r.Producer)
	if err != nil {
		return err
	}
	if err := w.write(p, r); err != nil {
		return err
	}
	p.pending = append(p.pending, pendingDone{d: r.d, line: p.sw.Appended()})
	return w.account(p, 1)
}

// write appends r's line to p's segments.
func (w *writer) write(p *producer, r *record) error {
	ts := max(w.set.Clock().Sub(w.start).Milliseconds(), 0)
	w.lineBuf = tracefile.AppendLine(w.lineBuf[:0], &r.Record, ts, string(w.cfg.Mode))
	if err := p.sw.appendRecord(w.lineBuf, r.Seq, r.Observed); err != nil {
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
func (w *writer) account(p *producer, n int) error {
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

// producerFor returns the producer of id, creating its SegmentWriter on first use: at the next free
// index (a writer's start), or continuing the segment a writer of this process left (processSegments).
func (w *writer) producerFor(id string) (*producer, error) {
	if p, ok := w.producers[id]; ok {
		return p, nil
	}
	prefix := tracefile.SegmentPrefix(w.cfg.OutputPath, id)
	p, ok := w.bySegment[prefix]
	if !ok {
		if err := w.claim(prefix); err != nil {
			if w.rejectHeld && tracefile.RefusesProducer(err) {
				w.own.Rejecting(prefix, err)
				return nil, &messageError{err}
			}
			return nil, err
		}
		sw, err := newSegmentWriter(prefix, w.cfg.RollBytes, w.cfg.MaxSegments, w.set.level, w.log)
		if err != nil {
			return nil, err
		}
		sw.open = w.set.open
		sw.onRoll = w.m.rolled.Inc
		if st, ok := w.segs.take(prefix); ok && !sw.continueFrom(st) {
			w.log.Info("trace writer: the segment this process wrote last for the producer changed since (another writer wrote it); a new segment is started",
				"prefix", prefix, "segment", tracefile.SegmentPath(prefix, st.index), "next", sw.Path())
		}
		p = &producer{sw: sw}
		w.bySegment[prefix] = p
		w.log.Debug("trace writer: new producer", "producer_id", id, "segment", sw.Path())
	}
	w.producers[id] = p
	return p, nil
}

// claim owns prefix for this writer (once).
func (w *writer) claim(prefix string) error {
	if w.own == nil || w.claims[prefix] {
		return nil
	}
	if err := w.own.Take(prefix); err != nil {
		return err
	}
	if w.claims == nil {
		w.claims = map[string]bool{}
	}
	w.claims[prefix] = true
	return nil
}

// claimOutput claims every producer already under the output (a first takeover with one partition,
// before the repair of their newest segments) and returns the prefixes claimed and those another
// process owns.
func (w *writer) claimOutput() (claimed []string, refused []error, err error) {
	producers, err := tracefile.Producers(w.cfg.OutputPath)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range producers {
		prefix := tracefile.OutputBase(w.cfg.OutputPath) + "." + p
		if err := w.claim(prefix); err != nil {
			if !tracefile.RefusesProducer(err) {
				return claimed, refused, err
			}
			refused = append(refused, err)
			continue
		}
		claimed = append(claimed, prefix)
	}
	return claimed, refused, nil
}

// releaseClaims gives up the prefixes this writer owns; its files are closed.
func (w *writer) releaseClaims() {
	for p := range w.claims {
		w.own.Release(p)
	}
	w.claims = nil
}

// markDone says done every message whose line (or lines before it) is durable, for every producer.
func (w *writer) markDone() {
	if w.waiting == 0 {
		return
	}
	for _, p := range w.bySegment {
		if len(p.pending) > 0 {
			w.waiting -= p.markDone()
		}
	}
}

// markDone says done p's pending messages whose lines are durable and keeps the others.
func (p *producer) markDone() int {
	durable := p.sw.Durable()
	i := 0
	for ; i < len(p.pending) && p.pending[i].line <= durable; i++ {
		p.pending[i].d.Done()
	}
	n := copy(p.pending, p.pending[i:])
	clear(p.pending[n:])
	p.pending = p.pending[:n]
	return i
}

// dropProducer gives p up after its file refused its name (nameRefused): every message waiting for
// one of its lines, or pending as a sample of it, is rejected with reason; its file is closed; a later
// message of the producer starts over (and is rejected again if the name is refused again).
func (w *writer) dropProducer(p *producer, reason error) {
	reason = &messageError{fmt.Errorf("trace: producer file %s: %w", p.sw.Prefix(), reason)}
	w.log.Warn("trace writer: a producer's segment file cannot be written; its messages are rejected",
		"prefix", p.sw.Prefix(), "messages", len(p.pending), "err", reason)
	for _, pd := range p.pending {
		pd.d.Reject(reason)
	}
	w.waiting -= len(p.pending)
	w.unflushed = max(w.unflushed-len(p.pending), 0)
	p.pending = nil
	if w.sampler != nil {
		w.sampler.drop(p, func(r *record) { r.d.Reject(reason) })
	}
	p.sw.closeFile()
	p.sw.closed = true
	if w.claims[p.sw.Prefix()] {
		delete(w.claims, p.sw.Prefix())
		w.own.Release(p.sw.Prefix())
	}
	delete(w.bySegment, p.sw.Prefix())
	for id, q := range w.producers {
		if q == p {
			delete(w.producers, id)
		}
	}
	p.dirty = false
	w.dirty = slices.DeleteFunc(w.dirty, func(q *producer) bool { return q == p })
}

// finish is the graceful end (a partition released, a backfill's range read): every pending sample
// written, every line flushed and fsynced, every message done, the files closed, the flusher stopped.
// When stop closes first, a flush still retrying a failed write is given up: its messages are not
// done (they stay unacknowledged), the files are closed without more writes, and the error is
// returned.
func (w *writer) finish(stop <-chan struct{}) error {
	var err error
	if w.sampler != nil {
		err = w.sampler.emitAll(w)
	}
	if err == nil {
		err = w.drain(stop)
	}
	if err != nil {
		w.abort()
		return err
	}
	err = w.closeAll()
	w.fl.stop()
	w.leave()
	w.releaseClaims()
	return err
}

// finishCut ends a writer whose messages stop mid-range (an interrupted backfill): as finish, except
// that samples still pending are not written (their intervals were not read to their end) and their
// messages stay not done.
func (w *writer) finishCut(stop <-chan struct{}) error {
	if err := w.drain(stop); err != nil {
		w.abort()
		return err
	}
	err := w.closeAll()
	w.fl.stop()
	w.leave()
	w.releaseClaims()
	return err
}

// abort ends the writer without writing more: a flush still retrying is given up (one in progress
// completes before abort returns, so nothing is written after it), the files are closed without a
// flush, and nothing more is said done. What was not done is redelivered to the partition's next
// owner, which recognises the lines already durable.
func (w *writer) abort() {
	if w.fl.inflight {
		w.fl.abandon()
		<-w.fl.done
		w.fl.inflight = false
	}
	w.fl.stop()
	for _, p := range w.bySegment {
		p.sw.closeFile()
		p.sw.closed = true
		p.pending = nil
		w.reportPruned(p.sw, p.sw.takeFilePruned()) // what an abandoned flush pruned (the file side is idle)
	}
	if w.sampler != nil {
		w.sampler.clear()
	}
	w.waiting, w.unflushed = 0, 0
	w.leave()
	w.releaseClaims()
}

// leave hands where each producer's segment stands to the next writer of the producer in this process
// (processSegments): the writer has ended and writes nothing more.
func (w *writer) leave() {
	for prefix, p := range w.bySegment {
		if st, ok := p.sw.state(); ok {
			w.segs.put(prefix, st)
		}
	}
	w.bySegment, w.producers = map[string]*producer{}, map[string]*producer{}
}

// reportPruned names the segments retention removed from sw's producer: every line in them has left
// the trace. An error-level log line per segment (its lines, their stream sequences and observation
// times), the metrics fpmbus_trace_segments_pruned_total and fpmbus_trace_pruned_lines_total, and
// onPrune (the Consumer's loss event; a backfill's result).
func (w *writer) reportPruned(sw *SegmentWriter, pruned []prunedSegment) {
	for _, ps := range pruned {
		ps.Producer = strings.TrimPrefix(filepath.Base(sw.Prefix()), filepath.Base(tracefile.OutputBase(w.cfg.OutputPath))+".")
		w.m.pruned.Inc()
		w.m.prunedLines.Add(float64(ps.Lines))
		w.log.Error("trace segment pruned by --max-segments: its lines are no longer in the trace", "segment", ps.Segment,
			"lines", ps.Lines, "first_seq", ps.FirstSeq, "last_seq", ps.LastSeq, "first_observed_unix_ms", ps.FirstObservedMs,
			"last_observed_unix_ms", ps.LastObservedMs, "damaged", ps.Damaged, "max_segments", w.cfg.MaxSegments, "prefix", sw.Prefix())
		if w.onPrune != nil {
			w.onPrune(ps)
		}
	}
}

// closeAll closes every segment writer (they have been flushed).
func (w *writer) closeAll() error {
	var err error
	for _, p := range w.bySegment {
		err = errors.Join(err, p.sw.Close())
		w.reportPruned(p.sw, p.sw.takePruned())
	}
	return err
}
