package trace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// Backfill: replay a range of stream FPM into trace segments through the live writer's own code path
// (parse, line, sampler, SegmentWriter, flusher), so that the "event" objects it writes are
// byte-identical to the ones the live writer wrote for that range: observed_at_unix_ms comes from the
// message's header, sampled intervals are aligned to event time. It reads with an ordered consumer —
// ephemeral, unacknowledged, invisible to every durable consumer — and acks nothing.
//
// Differences from the live writer, all on purpose: the outer "timestamp" counts from the backfill's
// start (it is writer-relative in Dynamo too); sampled mode has no wall-clock fallback (pending samples
// are written by event time, and the rest when the range ends), so a live writer that wrote a sample
// early by its clock and then dropped a late message of that interval can differ there; and the
// unchanged-counter rule starts fresh at the range's first interval.

// ErrBadRange is returned for a backfill range that selects nothing sensible.
var ErrBadRange = errors.New("trace: invalid backfill range")

// BackfillRange selects what a backfill replays from stream FPM: by stream sequence (StartSeq to
// EndSeq, inclusive) or by stream time (Since to Until, inclusive), not both. A zero bound is open: the
// start of the stream, or its last message when the backfill starts.
type BackfillRange struct {
	StartSeq, EndSeq uint64
	Since, Until     time.Time
}

func (r BackfillRange) validate() error {
	bySeq := r.StartSeq != 0 || r.EndSeq != 0
	byTime := !r.Since.IsZero() || !r.Until.IsZero()
	switch {
	case bySeq && byTime:
		return fmt.Errorf("%w: a sequence range and a time range together", ErrBadRange)
	case r.EndSeq != 0 && r.EndSeq < r.StartSeq:
		return fmt.Errorf("%w: end sequence %d before start sequence %d", ErrBadRange, r.EndSeq, r.StartSeq)
	case !r.Until.IsZero() && r.Until.Before(r.Since):
		return fmt.Errorf("%w: until %s before since %s", ErrBadRange, r.Until.Format(time.RFC3339Nano), r.Since.Format(time.RFC3339Nano))
	}
	return nil
}

// BackfillProgress is reported while a backfill reads its range.
type BackfillProgress struct {
	// Done messages of Total read so far (Total counts the range's messages on the filter when the
	// backfill started). Seq is the last stream sequence read.
	Done, Total uint64
	Seq         uint64
}

// BackfillResult says what a backfill did.
type BackfillResult struct {
	Messages          uint64 // read from the range
	Lines             uint64 // written (full mode: Messages minus invalid ones)
	Invalid           uint64 // not valid FPMs: skipped
	FirstSeq, LastSeq uint64 // stream sequences of the first and last message read (0: none)
}

// Backfill replays rng of stream FPM (Config.FilterSubject) into Config.OutputPath in Config.Mode (see
// above) and returns once every line is fsynced and the files are closed. progress, if not nil, is
// called from another goroutine, at most every 100 ms and once at the end. The durable consumer
// settings of Config (Durable, MaxAckPending, AckWait) are not used; MaxAckPending still sizes the
// pull batches and flushes. When ctx ends first, what was read is written and Backfill returns ctx's
// error. A Writer runs once: Run or Backfill.
func (w *Writer) Backfill(ctx context.Context, rng BackfillRange, progress func(BackfillProgress)) (BackfillResult, error) {
	var res BackfillResult
	if !w.running.CompareAndSwap(false, true) {
		return res, ErrAlreadyRunning
	}
	if err := rng.validate(); err != nil {
		return res, err
	}
	if err := w.prepareOutput(); err != nil {
		return res, err
	}
	s, err := w.js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return res, fmt.Errorf("trace: backfill: stream %s: %w", streams.StreamFPM, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return res, fmt.Errorf("trace: backfill: stream %s: %w", streams.StreamFPM, err)
	}
	last := info.State.LastSeq
	if rng.EndSeq != 0 {
		last = min(last, rng.EndSeq)
	}
	startCfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{w.cfg.FilterSubject}, DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case rng.StartSeq != 0:
		startCfg.DeliverPolicy, startCfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, rng.StartSeq
	case !rng.Since.IsZero():
		t := rng.Since
		startCfg.DeliverPolicy, startCfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	total, err := w.rangeCount(ctx, s, startCfg, rng, last)
	if err != nil {
		return res, fmt.Errorf("trace: backfill: count the range: %w", err)
	}
	if w.sampler != nil {
		w.sampler.hold = 0 // event time only
	}
	src := &rangeSource{last: last, until: rng.Until, total: total, progress: progress}
	if total > 0 {
		oc, err := s.OrderedConsumer(ctx, startCfg)
		if err != nil {
			return res, fmt.Errorf("trace: backfill: ordered consumer: %w", err)
		}
		it, err := oc.Messages(jetstream.PullMaxMessages(w.cfg.pullBatch()))
		if err != nil {
			return res, fmt.Errorf("trace: backfill: ordered consumer: %w", err)
		}
		src.it = it
	}
	w.logger.Info("trace backfill started", "mode", w.cfg.Mode, "output", w.cfg.OutputPath, "filter", w.cfg.FilterSubject,
		"start_seq", rng.StartSeq, "end_seq", last, "since", rng.Since, "until", rng.Until, "messages", total)
	err = w.consume(ctx, src, nil, true)
	res = src.result()
	res.Invalid = w.invalidCount
	res.Lines = w.linesWritten
	if progress != nil {
		progress(BackfillProgress{Done: res.Messages, Total: max(total, res.Messages), Seq: res.LastSeq})
	}
	if err == nil && !src.finished() {
		err = ctx.Err()
	}
	if err != nil {
		return res, err
	}
	w.logger.Info("trace backfill done", "messages", res.Messages, "lines", res.Lines, "invalid", res.Invalid,
		"first_seq", res.FirstSeq, "last_seq", res.LastSeq)
	return res, nil
}

// rangeCount counts the range's messages on the filter: those from its start minus those after its
// end, read from the pending counts of two ephemeral consumers (deleted at once).
func (w *Writer) rangeCount(ctx context.Context, s jetstream.Stream, start jetstream.OrderedConsumerConfig, rng BackfillRange, last uint64) (uint64, error) {
	pending := func(cfg jetstream.ConsumerConfig) (uint64, error) {
		cfg.FilterSubject = w.cfg.FilterSubject
		cfg.AckPolicy = jetstream.AckNonePolicy
		cfg.InactiveThreshold = time.Minute
		cfg.MemoryStorage = true
		c, err := s.CreateConsumer(ctx, cfg)
		if err != nil {
			return 0, err
		}
		ci := c.CachedInfo()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = s.DeleteConsumer(dctx, ci.Name)
		cancel()
		return ci.NumPending, nil
	}
	from, err := pending(jetstream.ConsumerConfig{DeliverPolicy: start.DeliverPolicy, OptStartSeq: start.OptStartSeq, OptStartTime: start.OptStartTime})
	if err != nil || from == 0 {
		return 0, err
	}
	after := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: last + 1}
	if !rng.Until.IsZero() {
		t := rng.Until.Add(time.Nanosecond)
		after = jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t}
	}
	rest, err := pending(after)
	if err != nil {
		return 0, err
	}
	if rest >= from {
		return 0, nil
	}
	return from - rest, nil
}

// rangeSource is a backfill's msgSource: the ordered consumer's messages up to the range's end, with
// acks made no-ops; then errEndOfRange.
type rangeSource struct {
	it       jetstream.MessagesContext // nil: an empty range
	last     uint64
	until    time.Time
	total    uint64
	progress func(BackfillProgress)

	mu            sync.Mutex
	n, first, seq uint64
	done          bool
	lastReport    time.Time
	stopOnce      sync.Once
	drained       bool
}

func (s *rangeSource) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	s.mu.Lock()
	done, drained := s.done, s.drained
	s.mu.Unlock()
	if done || s.it == nil {
		s.mark(true)
		return nil, errEndOfRange
	}
	if drained {
		return nil, jetstream.ErrMsgIteratorClosed
	}
	m, err := s.it.Next()
	if err != nil {
		return nil, err
	}
	md, err := m.Metadata()
	if err != nil {
		return nil, err
	}
	if md.Sequence.Stream > s.last || !s.until.IsZero() && md.Timestamp.After(s.until) {
		s.mark(true)
		return nil, errEndOfRange
	}
	s.mu.Lock()
	s.n++
	if s.first == 0 {
		s.first = md.Sequence.Stream
	}
	s.seq = md.Sequence.Stream
	if md.Sequence.Stream >= s.last || md.NumPending == 0 {
		s.done = true // this is the range's last message
	}
	report := s.progress != nil && time.Since(s.lastReport) >= 100*time.Millisecond
	if report {
		s.lastReport = time.Now()
	}
	p := BackfillProgress{Done: s.n, Total: max(s.total, s.n), Seq: s.seq}
	s.mu.Unlock()
	if report {
		s.progress(p)
	}
	return replayMsg{m}, nil
}

func (s *rangeSource) mark(done bool) {
	s.mu.Lock()
	s.done = s.done || done
	s.mu.Unlock()
	if s.it != nil {
		s.stopOnce.Do(s.it.Stop)
	}
}

// finished reports whether the whole range was read.
func (s *rangeSource) finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

func (s *rangeSource) result() BackfillResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return BackfillResult{Messages: s.n, FirstSeq: s.first, LastSeq: s.seq}
}

// Drain and Stop end the read early (the backfill's context ended).
func (s *rangeSource) Drain() {
	s.mu.Lock()
	s.drained = true
	s.mu.Unlock()
	if s.it != nil {
		s.stopOnce.Do(s.it.Stop)
	}
}

func (s *rangeSource) Stop() { s.Drain() }

// replayMsg is a replayed message: nothing to ack.
type replayMsg struct{ jetstream.Msg }

func (replayMsg) Ack() error                       { return nil }
func (replayMsg) DoubleAck(context.Context) error  { return nil }
func (replayMsg) Nak() error                       { return nil }
func (replayMsg) NakWithDelay(time.Duration) error { return nil }
func (replayMsg) InProgress() error                { return nil }
func (replayMsg) Term() error                      { return nil }
func (replayMsg) TermWithReason(string) error      { return nil }
