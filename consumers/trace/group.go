package trace

// The writer's consumer group: how Config maps to a consumers/partition group and a durable.Runner,
// and how consumers declared otherwise before (by an fpmbus that acked each message, or for the other
// capture mode) are replaced without losing the place. See the "Partitions and acks" section of doc.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// ConsumerName names the trace writer in the runner's metrics (consumer="trace"), its dead letters
// (fpmevents.deadletter.consumer.trace, which `fpmbus trace verify` reads) and its loss events
// (fpmevents.loss.trace). tracefile holds it, for that verify.
const ConsumerName = tracefile.WriterName

// errGroupUnsupported is the reason a message is rejected when, with more than one partition, its
// producer id (Fpm-Producer header) is not its worker_id, the partition key: its file could get two
// writers.
var errGroupUnsupported = errors.New("trace: not supported by a partitioned group")

// PartitionConfig is the consumer group (consumers/partition) of the writer: stream FPM (or its
// shards), group c.Group, c.Partitions partitions (0: effectivePartitions). With one partition it reads
// c.FilterSubject as given. With more, it reads the FPM subjects of c.FilterSubject
// (fpm.<namespace>.<component>.<worker_id>.<dp_rank>; others are not read) keyed by worker_id only (the
// default producer id), so that every producer's messages, all of its dp ranks included, are in one
// partition and its files have exactly one writer. The FPM shards are keyed by worker_id as well, so
// with one partition per shard partition p is shard p, read directly. Full mode acks cumulatively
// (AckAll); sampled mode acks each message (see cumulativeAcks).
func (c Config) PartitionConfig() (durable.GroupConfig, error) {
	c.Partitions = c.effectivePartitions()
	pc := durable.FPMGroup(c.Group)
	pc.Partitions = c.Partitions
	if c.FPMShards > 1 {
		pc.Shards = c.FPMShards // read directly when P is the shard count (ShardKeyed), else copied
	}
	pc.PinnedTTL = c.PinnedTTL
	pc.ReleaseTimeout = c.StopTimeout
	pc.AckWait = c.ackWait()
	pc.MaxAckPending = c.MaxAckPending
	pc.Batch = c.pullBatch()
	pc.CumulativeAcks = c.cumulativeAcks()
	if c.Partitions < 1 || c.Partitions > durable.MaxPartitions {
		return pc, fmt.Errorf("%w: partitions %d (--partitions): want 1 to %d", ErrInvalidConfig, c.Partitions, durable.MaxPartitions)
	}
	if c.Partitions > 1 && c.ProducerID != "" {
		return pc, fmt.Errorf("%w: producer id %q (--producer-id) files every message under one producer, whose file must have one writer: use --partitions 1",
			ErrInvalidConfig, c.ProducerID)
	}
	if c.Partitions == 1 {
		// One partition: the filter as given, so that every message on it is delivered (a subject
		// that is not an FPM key is dead-lettered, and retention loss is measured on the whole filter).
		pc.Filters = []durable.Filter{{Subject: c.FilterSubject}}
	} else {
		// Keyed by the worker_id token alone, as the FPM shards are.
		f, ok := durable.WorkerKeyedFilter(c.FilterSubject)
		if !ok {
			return pc, fmt.Errorf("%w: filter subject %q (--filter): a partitioned group is keyed by worker_id, so it needs a filter of fpm.<namespace>.<component>.<worker_id>.<dp_rank> subjects with any worker_id (for one worker_id, use --partitions 1)",
				ErrInvalidConfig, c.FilterSubject)
		}
		pc.Filters = []durable.Filter{f}
	}
	if err := pc.Validate(); err != nil {
		return pc, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return pc, nil
}

// effectivePartitions is c.Partitions, or for 0 one per FPM shard (1 without shards), or 1 where a
// partitioned group cannot be keyed by worker_id (a producer id, a filter naming one worker_id).
func (c Config) effectivePartitions() int {
	if c.Partitions != 0 {
		return c.Partitions
	}
	if c.FPMShards <= 1 || c.ProducerID != "" {
		return 1
	}
	if _, ok := durable.WorkerKeyedFilter(c.FilterSubject); !ok {
		return 1
	}
	return c.FPMShards
}

// pullBatch is how many messages a partition consumer asks the server for at a time.
func (c Config) pullBatch() int {
	return min(max(c.MaxAckPending/4, 1), 4096)
}

// cumulativeAcks says whether the group acks the done prefix with one ack (AckAll). Full mode does:
// every message's line is durable at the next flush, so the prefix advances at every flush, and one
// ack per flush instead of one per message is the writer's largest saving. Sampled mode does not: a
// key's pending message waits up to a whole interval for its line, and under AckAll it would hold
// back the ack of every later message (rate x interval of them, past MaxAckPending at fleet rates).
func (c Config) cumulativeAcks() bool { return c.Mode == ModeFull }

// detectsRetentionLoss says whether the runner can report messages the stream removed before the
// writer read them: only when each partition reads every subject of its stream itself, so that every
// stream sequence it skips is a lost message: one partition on the whole stream FPM, or with shards one
// partition per shard on the whole of each (the direct reading, whose filter fpm.*.*.*.* is every
// subject a bridge stores). Both modes. Not through a partition stream (a copy, numbered on its own).
func (c Config) detectsRetentionLoss() bool {
	if c.FilterSubject != streams.FPMWildcard {
		return false
	}
	p := c.effectivePartitions()
	if c.FPMShards > 1 {
		return p == c.FPMShards
	}
	return p == 1
}

// runnerConfig is the durable.Runner configuration of the writer with group pc. The runner releases
// partitions one after another, each bounded by StopTimeout (the group's ReleaseTimeout); it gives the
// rest up after twice that.
func (c Config) runnerConfig(pc durable.GroupConfig) durable.Config {
	return durable.Config{
		Name:                ConsumerName,
		Group:               pc,
		TickInterval:        c.FlushInterval,
		StopTimeout:         2 * c.StopTimeout,
		Batch:               durable.DefaultBatch,
		DetectRetentionLoss: c.detectsRetentionLoss(),
		MaxDeliveries:       c.MaxDeliveries,
	}
}

// replaceIncompatibleConsumers replaces the group's partition consumers that were declared in a way
// this configuration cannot use and the server cannot change: with another ack policy (the other
// capture mode) or as a pull consumer without the group's metadata (a plain durable declared by
// hand): durable.ReplaceAfterAckFloor, so the writer goes
// on where the old consumer stood (what it wrote above the floor is recognised and skipped, see
// takeover). Every instance of a group must run the same fpmbus and mode.
func replaceIncompatibleConsumers(ctx context.Context, js jetstream.JetStream, pc durable.GroupConfig, log *slog.Logger) error {
	for p := range pc.Partitions {
		// Each partition's consumer lives on its own stream when the group reads shards directly.
		s, err := js.Stream(ctx, pc.ConsumerStreamOf(p))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil // a partition stream not created yet: no consumer either
		}
		if err != nil {
			return fmt.Errorf("trace: group %s: stream %s: %w", pc.Group, pc.ConsumerStreamOf(p), err)
		}
		want := pc.ConsumerConfig(p)
		have, err := durable.ConsumerInfo(ctx, js, pc.ConsumerStreamOf(p), want.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("trace: group %s: consumer %s: %w", pc.Group, want.Durable, err)
		}
		_, ours := have.Config.Metadata["fpmbus_group"]
		if have.Config.AckPolicy == want.AckPolicy && (ours || have.Config.DeliverSubject != "") {
			continue
		}
		floor := have.AckFloor.Stream
		log.Warn("trace writer: replacing a consumer declared with another ack policy or without partition ownership; it goes on after its ack floor",
			"stream", pc.ConsumerStreamOf(p), "consumer", want.Durable, "ack_policy", have.Config.AckPolicy, "want", want.AckPolicy, "ack_floor", floor)
		if err := durable.ReplaceAfterAckFloor(ctx, s, want, floor); err != nil {
			return fmt.Errorf("trace: group %s: %w", pc.Group, err)
		}
	}
	return nil
}

// pruneEventTimeout bounds the publication of one pruned segment's loss event; a loss event that was
// not stored is published again every lossRetryEvery (a second at most each time) until it is.
const (
	pruneEventTimeout = 5 * time.Second
	lossRetryEvery    = 5 * time.Second
	lossRetryTimeout  = time.Second
)

// publishPruned reports a segment that retention (--max-segments) removed from partition p's producers
// as a loss event on fpmevents.loss.trace (streams.ConsumerLoss, cause pruned: the segment, its
// producer, its line count, the stream sequences of its lines where known, their observation times),
// which `fpmbus gaps report` counts. Segments are pruned whether or not the server answers (Dynamo's
// rule), so an event the server did not store (down, paused, its disk full) is kept and published
// again by Tick until it is (retryLosses: its message id makes a repeat of a stored one a duplicate);
// meanwhile, and for one still unstored when the writer stops, the error-level log lines and the
// metrics (writer.reportPruned) count it. Called on the runner's loop; prunes are rare (one per roll
// beyond the limit), so the publication waits for its acknowledgement there.
func (c *Consumer) publishPruned(p int, ps prunedSegment) {
	if ps.Lines == 0 {
		return // nothing was lost
	}
	l := streams.ConsumerLoss{Event: streams.ConsumerLossEvent, Cause: streams.LossPruned, Consumer: ConsumerName,
		Stream: c.lossStream(p), Count: uint64(ps.Lines), DetectedAt: c.set.Clock().UnixMilli(),
		Segment: ps.Segment, Producer: ps.Producer, FirstObservedMs: max(ps.FirstObservedMs, 0), LastObservedMs: max(ps.LastObservedMs, 0)}
	if l.Stream != "" {
		l.First, l.Last = ps.FirstSeq, ps.LastSeq
	}
	body, err := json.Marshal(l)
	if err != nil {
		c.log.Error("trace writer: pruned segment's loss event not built", "segment", ps.Segment, "err", err)
		return
	}
	msg := nats.NewMsg(streams.ConsumerLossSubject(ConsumerName))
	msg.Data = body
	msg.Header.Set(streams.HeaderEventType, streams.ConsumerLossEvent)
	msg.Header.Set(streams.HeaderMsgID, streams.ConsumerPrunedMsgID(ConsumerName, ps.Segment))
	ctx, cancel := context.WithTimeout(context.Background(), pruneEventTimeout)
	defer cancel()
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		c.log.Error("trace writer: pruned segment's loss event not stored yet; published again until it is (the log line above and fpmbus_trace_pruned_lines_total count it meanwhile)",
			"segment", ps.Segment, "lines", ps.Lines, "err", err)
		c.unstoredLosses = append(c.unstoredLosses, msg)
		c.lossRetryAt = c.set.Clock().Add(lossRetryEvery)
	}
}

// retryLosses publishes again the loss events the server did not store, oldest first, once
// lossRetryEvery has passed since the last try (or at once when force), stopping at the first that
// fails again (the server is still away). Loop only.
func (c *Consumer) retryLosses(ctx context.Context, force bool) {
	if len(c.unstoredLosses) == 0 || !force && c.set.Clock().Before(c.lossRetryAt) {
		return
	}
	for len(c.unstoredLosses) > 0 {
		msg := c.unstoredLosses[0]
		pctx, cancel := context.WithTimeout(ctx, lossRetryTimeout)
		_, err := c.js.PublishMsg(pctx, msg)
		cancel()
		if err != nil {
			c.lossRetryAt = c.set.Clock().Add(lossRetryEvery)
			return
		}
		c.log.Info("trace writer: pruned segment's loss event stored", "event", string(msg.Data))
		c.unstoredLosses[0] = nil
		c.unstoredLosses = c.unstoredLosses[1:]
	}
}

// dropUnstoredLosses logs, at error level and in full, the loss events still not stored when the
// writer stops: the log is then the only place that names those lines.
func (c *Consumer) dropUnstoredLosses() {
	for _, msg := range c.unstoredLosses {
		c.log.Error("trace writer: stopping with a pruned segment's loss event the server never stored; gaps report will not count it",
			"event", string(msg.Data))
	}
	c.unstoredLosses = nil
}

// lossStream is the stream whose sequences partition p's records carry (Msg.StreamSeq): FPM, or with
// FPM shards read one per partition the partition's shard; "" when they are not one stream's (a copy
// of every shard), and a loss event then names no sequences.
func (c *Consumer) lossStream(p int) string {
	if c.cfg.FPMShards > 1 {
		if c.cfg.Partitions == c.cfg.FPMShards {
			return c.group.ConsumerStreamOf(p)
		}
		return ""
	}
	return streams.StreamFPM
}
