package trace

// Scale-out: several writers, one group (RunGroup). See the "Scale-out" section of doc.go.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/schemas"
)

// workerToken is the 0-based index of worker_id in fpm.<namespace>.<component>.<worker_id>.<dp_rank>.
const workerToken = 3

// GroupOptions configures RunGroup beyond Config. Config.Durable is the group name.
type GroupOptions struct {
	// Partitions is the number of partitions P of the group (1: a single active writer with hot
	// standbys, consuming stream FPM itself; > 1: the group reads the partition stream FPM_PART_<group>,
	// a server-side copy of FPM, and the partitions are spread over the instances). Fixed for the life
	// of the group.
	Partitions int
	// PinnedTTL bounds crash failover (0: partition.DefaultPinnedTTL).
	PinnedTTL time.Duration
	// ReleaseTimeout bounds a graceful handover of one partition (0: partition.DefaultReleaseTimeout).
	ReleaseTimeout time.Duration
	// MemberID names this instance in the group ("" : host-pid-random).
	MemberID string
}

// ErrGroupUnsupported is returned by RunGroup for settings that cannot be shared safely by a group.
var ErrGroupUnsupported = errors.New("trace: not supported by a scale-out group")

// PartitionConfig is the consumer group (consumers/partition) of a trace writer group with config c:
// stream FPM, group c.Durable, the subjects of c.FilterSubject keyed by worker_id only (the default
// producer id), so that every producer's messages, all of its dp ranks included, are in one partition
// and its files have exactly one writer.
func (c Config) PartitionConfig(g GroupOptions) (partition.Config, error) {
	pc := partition.FPMConfig(c.Durable)
	pc.Partitions = g.Partitions
	if g.PinnedTTL > 0 {
		pc.PinnedTTL = g.PinnedTTL
	}
	if g.ReleaseTimeout > 0 {
		pc.ReleaseTimeout = g.ReleaseTimeout
	}
	pc.AckWait = c.ackWait()
	pc.MaxAckPending = c.MaxAckPending
	pc.Batch = c.pullBatch()
	if g.Partitions < 1 || g.Partitions > partition.MaxPartitions {
		return pc, fmt.Errorf("%w: partitions %d (--partitions): want 1 to %d", ErrInvalidConfig, g.Partitions, partition.MaxPartitions)
	}
	if g.Partitions > 1 && c.ProducerID != "" {
		return pc, fmt.Errorf("%w: producer id %q (--producer-id) files every message under one producer, whose file must have one writer: use --partitions 1",
			ErrInvalidConfig, c.ProducerID)
	}
	// Expand the filter to the 5 tokens of an FPM subject and key it by the worker_id token.
	toks := strings.Split(c.FilterSubject, ".")
	if toks[len(toks)-1] == ">" {
		toks = toks[:len(toks)-1]
		for len(toks) < 5 {
			toks = append(toks, "*")
		}
	}
	if len(toks) != 5 {
		return pc, fmt.Errorf("%w: filter subject %q (--filter): a group needs a filter of fpm.<namespace>.<component>.<worker_id>.<dp_rank> subjects", ErrInvalidConfig, c.FilterSubject)
	}
	f := partition.Filter{Subject: strings.Join(toks, ".")}
	if toks[workerToken] == "*" {
		n := 0
		for _, t := range toks[:workerToken+1] {
			if t == "*" {
				n++
			}
		}
		f.KeyTokens = []int{n}
	} else if g.Partitions > 1 {
		return pc, fmt.Errorf("%w: filter subject %q (--filter) names one worker_id: use --partitions 1", ErrInvalidConfig, c.FilterSubject)
	}
	pc.Filters = []partition.Filter{f}
	if err := pc.Validate(); err != nil {
		return pc, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return pc, nil
}

// RunGroup writes traces as one member of the group Config.Durable until ctx is done, then leaves it
// gracefully: the partitions it owns are flushed, acked, their files closed and handed to the other
// members. Every partition this member owns runs its own writer loop (the same code as Run: fetcher,
// flusher, seqState) over the partition's messages; a partition lost abruptly (connection cut, pin
// lost) stops at once without writing more. On taking a partition, the previous owner may have left
// lines on disk whose messages it did not ack; the takeover check finds them and skips their
// redeliveries (see takeover below).
//
// The output directory must be shared by every member (one host, or a shared file system with
// working O_EXCL creates and fsync): a new owner continues a producer's segments where the last one
// stopped. Both modes; in sampled mode the takeover seeds the sampler instead (see takeover).
func (w *Writer) RunGroup(ctx context.Context, g GroupOptions) error {
	pc, err := w.cfg.PartitionConfig(g)
	if err != nil {
		return err
	}
	if !w.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	// Only the probe: the output is shared, another member may be writing any producer's newest
	// segment now. A producer's torn tail is repaired when its partition is taken over.
	if err := ProbeOutput(w.cfg.OutputPath); err != nil {
		return err
	}
	opts := []partition.Option{partition.WithLogger(w.logger)}
	if g.MemberID != "" {
		opts = append(opts, partition.WithMemberID(g.MemberID))
	}
	m, err := partition.Join(ctx, w.js, pc, opts...)
	if err != nil {
		return fmt.Errorf("trace: join group %s: %w", w.cfg.Durable, err)
	}
	w.member = m
	w.start = w.now()
	close(w.ready)
	w.logger.Info("trace writer group member started", "group", pc.Group, "partitions", pc.Partitions,
		"stream", pc.ConsumerStream(), "member", m.ID(), "output", w.cfg.OutputPath)
	err = m.Consume(ctx, func(hctx context.Context, p int, msgs <-chan jetstream.Msg) error {
		return w.session(p, pc.Partitions).runPartition(hctx, msgs)
	})
	if err != nil {
		return fmt.Errorf("trace: group %s: %w", w.cfg.Durable, err)
	}
	w.logger.Info("trace writer group member stopped", "group", pc.Group, "member", m.ID())
	return nil
}

// Member is the group membership of a running RunGroup (nil before it joined), for tests and status.
func (w *Writer) Member() *partition.Member { return w.member }

// sessionSeqLimit bounds a partition session's seqState (bits per plane: 128 KiB each).
const sessionSeqLimit = 1 << 20

// session returns a fresh writer for one ownership session of partition p: its own producers,
// flusher and seqState, the parent's settings, metrics and start time.
func (w *Writer) session(p, partitions int) *Writer {
	s := &Writer{
		cfg:        w.cfg,
		js:         w.js,
		logger:     w.logger.With("partition", p),
		now:        w.now,
		level:      w.level,
		open:       w.open,
		retry:      w.retry,
		meta:       partitionMeta,
		floorEvery: w.floorEvery,
		metrics:    w.metrics,
		ready:      make(chan struct{}),
		producers:  map[string]*producer{},
		bySegment:  map[string]*producer{},
		// The member drops redeliveries while it owns the partition, so a session's seqState only needs
		// a small window (and has no floor poller to trim it).
		seqs:       newSeqState(sessionSeqLimit),
		fixedStart: w.start,
		noNak:      true,
		wrap:       w.wrap,
	}
	if w.cfg.Mode == schemas.CaptureSampled {
		s.sampler = newSampler(w.cfg.SampleInterval, w.cfg.SampleInterval+2*w.cfg.FlushInterval)
	}
	s.takeover = &takeover{w: s, checkWorker: partitions > 1, tails: map[string]*tailState{}}
	return s
}

// runPartition is the partition handler: the writer loop over msgs until msgs is closed (graceful:
// flush, ack, close, return nil) or ctx is cancelled (lost: stop at once, write nothing more, ack only
// what is already durable, nak nothing).
func (w *Writer) runPartition(ctx context.Context, msgs <-chan jetstream.Msg) error {
	w.takeover.ctx = ctx
	var src msgSource = &chanSource{ch: msgs, ctx: ctx}
	if w.wrap != nil {
		src = w.wrap(src)
	}
	err := w.consume(context.Background(), src, nil, true)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// partitionMeta is the metaOf of a partition's messages: the FPM stream sequence (also when they come
// from the partition stream), the delivery count and timestamp of the consumed stream.
func partitionMeta(m jetstream.Msg) (msgMeta, error) {
	seq, err := partition.StreamSequence(m)
	if err != nil {
		return msgMeta{}, err
	}
	md, err := m.Metadata()
	if err != nil {
		return msgMeta{}, err
	}
	return msgMeta{seq: seq, delivered: md.NumDelivered, stored: md.Timestamp}, nil
}

// errPartitionLost ends a session's source when the partition is lost.
var errPartitionLost = errors.New("trace: partition lost")

// chanSource is a msgSource over a partition handler's channel: closed = end of range (the loop
// stops gracefully), ctx done = lost (the loop fails and aborts).
type chanSource struct {
	ch  <-chan jetstream.Msg
	ctx context.Context
}

func (s *chanSource) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	if s.ctx.Err() != nil { // lost wins over a channel closed at the same time
		return nil, errPartitionLost
	}
	select {
	case m, ok := <-s.ch:
		if s.ctx.Err() != nil {
			return nil, errPartitionLost
		}
		if !ok {
			return nil, errEndOfRange
		}
		return m, nil
	case <-s.ctx.Done():
		return nil, errPartitionLost
	}
}

func (s *chanSource) Drain() {}
func (s *chanSource) Stop()  {}

// takeover recognises, in a new ownership session, the messages whose lines an earlier owner made
// durable without its ack reaching the server. It is the startup recovery (recover.go) per producer,
// done when the session sees the producer's first message: the candidates cannot be listed up front
// as Run does (between the consumer's ack floor and last delivered sequence), because the member
// resets the consumer to its ack floor before the session starts, which erases the last delivered
// sequence. Instead:
//
//   - the producer's newest segment is repaired (a crashed owner may have left a torn tail; only now,
//     with the partition owned, is nobody else writing it);
//   - the identities (recover.go) of the lines of its segments that can hold such a line (modified
//     after the first message was stored, less recoverySlack) are collected;
//   - the producer's messages are checked in order: one whose identity is among them is acked and
//     skipped, and the first one that is not ends the check for that producer. An owner writes a
//     producer's messages in stream order and acks nothing before its line is durable, so the lines
//     already written for the redelivered messages are exactly a prefix of them.
//   - in sampled mode most messages have no line of their own, so nothing is skipped by identity:
//     as in the startup recovery, every key of the producer found in those segments seeds the sampler
//     with its last written line (interval, counter_id), and a redelivered message of an interval
//     already written is late (acked, no line).
type takeover struct {
	w           *Writer
	checkWorker bool // P > 1: a producer must be its worker_id, the partition key
	tails       map[string]*tailState
	ctx         context.Context // the session's: done = partition lost
}

// lost reports whether the session's partition is lost: nothing more may be written.
func (t *takeover) lost() bool { return t.ctx != nil && t.ctx.Err() != nil }

type tailState struct {
	ids     map[lineIdentity]int // nil once the check ended
	live    bool
	skipped int
}

// written reports whether r's line is already on disk (r is then acked and skipped by the caller).
func (t *takeover) written(r *record) (bool, error) {
	if t.checkWorker && r.producer != r.key.WorkerID {
		return false, fmt.Errorf("%w: message %s has producer id %q (Fpm-Producer header), not its worker_id %q: with --partitions > 1 "+
			"its file could get two writers; run the bridges without --producer-id, or use --partitions 1",
			ErrGroupUnsupported, r.msg.Subject(), r.producer, r.key.WorkerID)
	}
	prefix := SegmentPrefix(t.w.cfg.OutputPath, r.producer)
	ts := t.tails[prefix]
	if ts == nil {
		var err error
		if ts, err = t.load(prefix, r.stored); err != nil {
			return false, err
		}
		t.tails[prefix] = ts
	}
	if ts.live || t.w.sampler != nil {
		return false, nil
	}
	id := identityOf(prefix, r.key.Namespace, r.key.Component, r.producer, r.observed, r.body)
	if n := ts.ids[id]; n > 0 {
		ts.ids[id] = n - 1
		ts.skipped++
		return true, nil
	}
	ts.live, ts.ids = true, nil
	if ts.skipped > 0 {
		t.w.logger.Info("trace takeover: redelivered messages already written by the previous owner skipped",
			"prefix", prefix, "skipped", ts.skipped)
	}
	return false, nil
}

// load repairs prefix's newest segment and reads the identities of the lines that can belong to
// messages stored at or after stored.
func (t *takeover) load(prefix string, stored time.Time) (*tailState, error) {
	w := t.w
	if err := removeRepairLeftovers(prefix, w.logger); err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	segs, err := ListSegments(prefix)
	if err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Regular {
			if _, err := Repair(segs[i].Path, w.logger); err != nil {
				return nil, fmt.Errorf("trace: takeover: %w", err)
			}
			break
		}
	}
	if segs, err = ListSegments(prefix); err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	ts := &tailState{ids: map[lineIdentity]int{}}
	seeds := map[sampleKey]recoverSeed{}
	lines := 0
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		if !s.Regular {
			continue
		}
		fi, err := os.Stat(s.Path)
		if err != nil {
			return nil, fmt.Errorf("trace: takeover: %w", err)
		}
		if !stored.IsZero() && fi.ModTime().Before(stored.Add(-recoverySlack)) {
			break
		}
		n, err := w.scanSegment(s.Path, prefix, seeds, func(id lineIdentity) { ts.ids[id]++ })
		lines += n
		if err != nil {
			return nil, fmt.Errorf("trace: takeover: %w", err)
		}
	}
	w.seedSampler(seeds)
	if len(ts.ids) == 0 {
		ts.live, ts.ids = true, nil
	}
	w.logger.Debug("trace takeover: producer's recent lines read", "prefix", prefix, "lines", lines)
	return ts, nil
}
