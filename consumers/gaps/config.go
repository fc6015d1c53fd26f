package gaps

import (
	"errors"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// Defaults.
const (
	defaultGroup         = "fpm-gaps"
	defaultFilterSubject = streams.FPMWildcard
	defaultStateBucket   = "FPM_GAPS_STATE"
	// defaultHeartbeatInterval is Dynamo's publisher heartbeat interval; defaultStaleAfter is five of them.
	defaultHeartbeatInterval  = time.Second
	defaultStaleAfter         = 5 * defaultHeartbeatInterval
	defaultMarkerGrace        = 10 * time.Second
	defaultCommitInterval     = 200 * time.Millisecond
	defaultCheckpointInterval = time.Second
	defaultMaxAckPending      = 20000
	defaultAckWait            = 60 * time.Second
	defaultStopTimeout        = 10 * time.Second
	defaultPublishTimeout     = 10 * time.Second
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("gaps: invalid configuration")

// Config configures a Detector. Start from DefaultConfig; the zero value is not valid.
type Config struct {
	// MaxDeliveries bounds how often one message is delivered, and how often its partition is taken
	// over after a crash without progress, before it is dead-lettered (0: durable.defaultMaxDeliveries).
	MaxDeliveries int
	// Group names the detector group (--gaps-group): its partition group (consumers/partition: durable
	// <group> with one partition, <group>-<p> on stream FPM_PART_<group> with more) and the prefix of
	// its keys in the state bucket. Instances of one group share the publishers and their state.
	Group string
	// FilterSubject selects the FPM subjects (--filter), e.g. fpm.dynamo.>; drop markers are read from
	// the matching fpmevents.drop.… subjects.
	FilterSubject string
	// StaleAfter (--stale-after): a publisher that sends nothing, not even a heartbeat, for this long
	// is stale.
	StaleAfter time.Duration
	// MarkerGrace (--marker-grace): how long, in stream time on FPM_EVENTS, a revealed gap waits for a
	// bridge drop marker before it is classified as a ZMQ drop. Drop markers may be stored after the
	// FPMs that follow the dropped ones (the bridge publishes them once the broker is back).
	MarkerGrace time.Duration
	// StateBucket is the KV bucket holding one state entry per publisher (created if missing).
	StateBucket string
	// Partitions (--gaps-partitions) is the number of partitions of the group's publishers (fixed for the
	// group's life; see consumers/partition). 1: one active detector, the other instances are hot
	// standbys; N: up to N active instances, each owning the publishers of some partitions.
	Partitions int
	// FPMShards is the server's FPM shard count (streams.DiscoverFPMShards; 0: New reads it from the
	// server). With n > 1 shards the group has one partition per shard whatever Partitions says, and
	// is keyed like the shards, by worker_id (coarser than one publisher, still exactly one owner per
	// publisher): partition p reads shard p directly, so a publisher's partition is its shard. A
	// filter naming one worker_id cannot be keyed so and reads a partition stream sourcing the shards.
	FPMShards int
	// PinnedTTL bounds crash failover: a partition whose owner stopped pulling moves after this long.
	PinnedTTL time.Duration
	// CommitInterval bounds how long a processed message waits for its ack (and, when it changed
	// more than the sequence, for the checkpoint of its publisher's state).
	CommitInterval time.Duration
	// CheckpointInterval: a publisher whose messages only advanced its sequence is checkpointed at most
	// this often; those messages are acked without waiting for it, since a restarted detector re-reads
	// a publisher's messages after its checkpoint from the stream. It bounds that re-read.
	CheckpointInterval time.Duration
	// MaxAckPending and AckWait of the durable consumers.
	MaxAckPending int
	AckWait       time.Duration
	// StopTimeout bounds the graceful stop; PublishTimeout one wait for publish acks.
	StopTimeout    time.Duration
	PublishTimeout time.Duration
	// StateReplicas and StateStorage of the state bucket (default: one replica, file storage).
	StateReplicas int
	StateStorage  jetstream.StorageType
	// Registerer receives the detector's metrics and its runner's; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the detector's logs and its runner's [slog.Default()].
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: all FPM subjects, stale after 5 s, a 10 s marker grace, one
// instance.
func DefaultConfig() Config {
	return Config{
		Group:              defaultGroup,
		FilterSubject:      defaultFilterSubject,
		StaleAfter:         defaultStaleAfter,
		MarkerGrace:        defaultMarkerGrace,
		StateBucket:        defaultStateBucket,
		Partitions:         1,
		PinnedTTL:          durable.DefaultPinnedTTL,
		CommitInterval:     defaultCommitInterval,
		CheckpointInterval: defaultCheckpointInterval,
		MaxAckPending:      defaultMaxAckPending,
		AckWait:            defaultAckWait,
		StopTimeout:        defaultStopTimeout,
		PublishTimeout:     defaultPublishTimeout,
		StateReplicas:      1,
		StateStorage:       jetstream.FileStorage,
	}
}

// Validate reports the first setting that cannot work, naming its flag and value.
func (c Config) Validate() error {
	bad := invalid.Reporter(ErrInvalidConfig)
	switch {
	case !streams.ValidName(c.Group, math.MaxInt): // its length is the partition group's to check
		return bad("group %q (--group): want letters, digits, '-' or '_'", c.Group)
	case c.FilterSubject != streams.FPMWildcard && !strings.HasPrefix(c.FilterSubject, streams.FPMRoot+"."):
		return bad("filter subject %q (--filter): want a subject under %s", c.FilterSubject, streams.FPMWildcard)
	case strings.ContainsAny(c.FilterSubject, " \t"):
		return bad("filter subject %q (--filter): contains white space", c.FilterSubject)
	case c.StaleAfter <= 0:
		return bad("stale after %v (--stale-after): want a positive duration", c.StaleAfter)
	case c.StaleAfter%time.Millisecond != 0:
		return bad("stale after %v (--stale-after): want whole milliseconds", c.StaleAfter)
	case c.MarkerGrace < 0 || c.MarkerGrace%time.Millisecond != 0:
		return bad("marker grace %v (--marker-grace): want zero or a positive number of whole milliseconds", c.MarkerGrace)
	case !streams.ValidName(c.StateBucket, math.MaxInt):
		return bad("state bucket %q (--state-bucket): want letters, digits, '-' or '_'", c.StateBucket)
	case c.Partitions < 1 || c.Partitions > durable.MaxPartitions:
		return bad("partitions %d (--gaps-partitions): want 1 to %d", c.Partitions, durable.MaxPartitions)
	case c.PinnedTTL < durable.MinPinnedTTL || c.PinnedTTL > durable.MaxPinnedTTL:
		return bad("pinned TTL %v: want %v to %v", c.PinnedTTL, durable.MinPinnedTTL, durable.MaxPinnedTTL)
	case c.CommitInterval <= 0:
		return bad("commit interval %v: want a positive duration", c.CommitInterval)
	case c.CheckpointInterval < 0:
		return bad("checkpoint interval %v: want zero (every commit) or a positive duration", c.CheckpointInterval)
	case c.MaxAckPending < 2:
		return bad("max ack pending %d: want at least 2", c.MaxAckPending)
	case c.AckWait <= c.CommitInterval:
		return bad("ack wait %v: must exceed the commit interval %v", c.AckWait, c.CommitInterval)
	case c.StopTimeout <= 0:
		return bad("stop timeout %v (--stop-timeout): want a positive duration", c.StopTimeout)
	case c.PublishTimeout <= 0:
		return bad("publish timeout %v: want a positive duration", c.PublishTimeout)
	case c.StateReplicas < 1 || c.StateReplicas > 5:
		return bad("state replicas %d: want 1 to 5", c.StateReplicas)
	}
	return nil
}

// FPMDurable is the durable consumer of partition 0 of the group: the group name itself with one
// partition (on stream FPM), <group>-0 with more (on FPM_PART_<group>).
func (c Config) FPMDurable() string { return c.PartitionConfig().ConsumerName(0) }

// PartitionConfig is the detector group's partitioning: stream FPM keyed by the publisher (tokens 1-4
// of fpm.*.*.*.*; a narrower FilterSubject, or one partition, hashes the whole subject, which is also
// one publisher). With FPM shards: one partition per shard keyed by worker_id, as the shards are
// (durable.WorkerKeyedFilter of FilterSubject), so that partition p is shard p, read directly.
func (c Config) PartitionConfig() durable.GroupConfig {
	pc := durable.FPMGroup(c.Group)
	pc.Partitions = max(c.Partitions, 1)
	if c.FPMShards > 1 {
		pc.Shards, pc.Partitions = c.FPMShards, c.FPMShards
		if f, ok := durable.WorkerKeyedFilter(c.FilterSubject); ok {
			pc.Filters = []durable.Filter{f}
		} else { // one worker_id: one key, through a partition stream
			pc.Filters = []durable.Filter{{Subject: c.FilterSubject}}
		}
	} else if c.FilterSubject != streams.FPMWildcard || pc.Partitions == 1 {
		// One partition needs no key; a consumer filter equal to the stream's subjects (fpm.>) spares
		// the server a subject match per message (about a fifth of the detector's throughput).
		pc.Filters = []durable.Filter{{Subject: c.FilterSubject}}
	}
	pc.AckWait = max(c.AckWait, time.Second)
	pc.PinnedTTL = c.PinnedTTL
	pc.MaxAckPending = max(c.MaxAckPending, 1)
	pc.Batch = min(c.pullBatch(), pc.MaxAckPending)
	pc.ReleaseTimeout = c.StopTimeout + c.PublishTimeout
	// Acks are cumulative (AckAll): one ack per checkpoint and partition covers every message before
	// it, which spares the server most of what a consumer costs it.
	pc.CumulativeAcks = true
	return pc
}

// PartitionOf is the partition of publisher k in the group (what the server's partition() transform
// computes for its FPM subject).
func (c Config) PartitionOf(k streams.Key) int {
	p, err := c.PartitionConfig().PartitionOf(streams.FPMSubject(k))
	if err != nil {
		return -1
	}
	return p
}

// MarkerFilter is the drop-marker subject filter matching FilterSubject.
func (c Config) MarkerFilter() string {
	return streams.DropMarkerFilter(c.FilterSubject)
}

// StateBucketConfig is the KV bucket of the per-publisher state.
func (c Config) StateBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.StateBucket,
		Description: "fpmbus gap detector: per-publisher sequence state (one key per group and publisher)",
		History:     1,
		Storage:     c.StateStorage,
		Replicas:    c.StateReplicas,
	}
}

// runnerConfig is the detector's durable.Runner: its partition group, ticks for the wall-clock checks
// and commit pacing, and a stop that leaves each partition's release time to checkpoint.
func (c Config) runnerConfig() durable.Config {
	return durable.Config{
		Name:          ConsumerName,
		Group:         c.PartitionConfig(),
		TickInterval:  min(c.tick(), c.CommitInterval),
		StopTimeout:   c.StopTimeout + c.PublishTimeout,
		Batch:         handBatch,
		MaxDeliveries: c.MaxDeliveries,
	}
}

func (c Config) rules() rules {
	return rules{graceMs: c.MarkerGrace.Milliseconds(), staleAfterMs: c.StaleAfter.Milliseconds()}
}

// pullBatch is how many messages the client asks the server for at a time.
func (c Config) pullBatch() int { return min(max(c.MaxAckPending/4, 1), 4096) }

// tick is how often the detector checks for stale publishers and expired marker graces.
func (c Config) tick() time.Duration {
	d := min(c.StaleAfter, max(c.MarkerGrace, time.Millisecond)) / 5
	return min(max(d, 20*time.Millisecond), time.Second)
}
