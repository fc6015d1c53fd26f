package durable

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
	"github.com/fpmbus/fpmbus/streams"
)

// The partition group a Runner joins. Membership, ordered takeover, graceful handover and crash
// failover are the runner's (it drives consumers/partition); what a stage decides is only which
// messages its group reads, how they are keyed, how many partitions share them and the consumer
// settings of every partition. Those are GroupConfig's fields, documented here: a stage author never
// needs to read consumers/partition.

// Group limits and defaults.
const (
	// MaxPartitions bounds GroupConfig.Partitions (one durable consumer each) and Shards.
	MaxPartitions = partition.MaxPartitions
	// DefaultPinnedTTL is GroupConfig.PinnedTTL's default: how long a crashed instance keeps its
	// partitions before another one takes them over.
	DefaultPinnedTTL = partition.DefaultPinnedTTL
	// MinPinnedTTL and MaxPinnedTTL bound GroupConfig.PinnedTTL: the partition consumers' idle
	// heartbeat (a fifth of it, at least 1 s) must fit well inside it, and the members' heartbeats
	// inside the members bucket's age limit.
	MinPinnedTTL = partition.MinPinnedTTL
	MaxPinnedTTL = partition.MaxPinnedTTL
	// maxGroupNameLen bounds a group name and a member id: a partition's consumer is <group>-<p>, its
	// partition stream <stream>_PART_<group>, and both must stay within the server's name limits.
	maxGroupNameLen = partition.MaxNameLen
	// shardsTimeout bounds asking the server how many shards stream FPM has.
	shardsTimeout = 10 * time.Second
)

// errGroupMismatch is returned by Run when the group already exists on the server with another
// partitioning (partition count, filters or key tokens): changing it would move keys between
// partitions and break per-key order. DeleteGroup first (its consumers then restart from the start).
var errGroupMismatch = partition.ErrGroupMismatch

// Filter selects subjects of a group's stream and says which of their tokens form the partition key.
type Filter struct {
	// Subject is a subject filter on the stream, e.g. "fpm.*.*.*.*". It may end in ">".
	Subject string
	// KeyTokens are 1-based indexes of the "*" wildcards of Subject whose values, concatenated and
	// hashed (FNV-1a, modulo Partitions), choose the partition: every message of one key is in one
	// partition, in stream order, and has one owner. Empty: the whole subject is the key.
	KeyTokens []int
}

// GroupConfig is the partition group of a Runner: the stream it reads, which subjects and how they are
// keyed, how many partitions share them and the consumer settings of every partition. Instances with
// the same Stream and Group share the work: each partition has one owner at a time, the others are hot
// standbys for it. A zero duration or size takes the default noted.
type GroupConfig struct {
	// Stream is the stream the group reads (never changed by it), e.g. streams.StreamFPM.
	Stream string
	// Group names the group. Letters, digits, '-' and '_', at most maxGroupNameLen.
	Group string
	// Partitions is the number of partitions P, fixed for the life of the group. 0, in a GroupConfig
	// given to New: one per shard of Stream (1 on an unsharded stream), so that every partition reads
	// its shard directly and nothing is copied. 1: one active instance reads Stream itself. P > 1:
	// the keys spread over the instances through a partition stream <Stream>_PART_<Group> (a
	// server-side copy of what the filters select: one extra write per message), except with shards and
	// P equal to their number and the group keyed like the shards, where partition p reads shard p.
	Partitions int
	// Filters select the subjects consumed and their key. At least one; they must not overlap.
	Filters []Filter
	// AckWait of every partition consumer [60s]: how long a handed message may stay unacked before
	// the server redelivers it. The runner sends in-progress acks for messages held longer than a third
	// of it, so it bounds only how long a crashed instance's messages wait. At least 1s.
	AckWait time.Duration
	// PinnedTTL [DefaultPinnedTTL] is how long a partition stays with an owner that stopped pulling
	// (crashed, cut off) before another instance takes it: crash failover takes about PinnedTTL.
	// MinPinnedTTL to MaxPinnedTTL.
	PinnedTTL time.Duration
	// MaxAckPending bounds the unacked messages of one partition [10000].
	MaxAckPending int
	// Batch is the fetch size of a plain pull consumer on these settings (benchmarks) [min(1000,
	// MaxAckPending)]; the runner bounds what it hands a stage at once with Config.Batch.
	Batch int
	// ReleaseTimeout bounds a graceful handover of one partition [30s]: the stage making what it holds
	// durable. Past it the partition is given up without a release (the next owner takes it after
	// PinnedTTL).
	ReleaseTimeout time.Duration
	// CumulativeAcks declares the partition consumers with the AckAll policy: one ack covers the done
	// prefix (see the package comment). Fixed for the group's life.
	CumulativeAcks bool
	// Shards > 1 says Stream is spread over Shards streams <Stream>_0 … (streams.ShardStreamName), every
	// key in one of them. 0 or 1: Stream is one stream. A group on stream FPM given to New with
	// Partitions 0 has Shards set from the server (streams.FPMShardsOf).
	Shards int
}

// FPMGroup is a group named group on stream FPM keyed by the whole producer key (namespace,
// component, worker_id, dp_rank: tokens 1-4 of fpm.<namespace>.<component>.<worker_id>.<dp_rank>),
// with one partition per FPM shard (Partitions 0, resolved by New): on the unsharded stream one active
// instance and hot standbys. Nothing is copied unless a stage asks for more partitions.
func FPMGroup(group string) GroupConfig {
	return groupOf(partition.FPMConfig(group), 0)
}

// benchGroup is a group named group on stream FPM_BENCH over subjects keyed by their first wildcard
// (the run: fpmbench.<kind>.<run>…), so that every artefact of one run has one owner; one partition.
func benchGroup(group string, subjects ...string) GroupConfig {
	return groupOf(partition.BenchConfig(group, subjects...), 1)
}

// WorkerKeyedFilter is an FPM subject filter keyed by its worker_id token alone, as the FPM shards
// place keys: a group keyed so with one partition per shard reads every shard directly. ok is false
// when subject is not fpm.<namespace>.<component>.<worker_id>.<dp_rank> with a wildcard worker_id.
func WorkerKeyedFilter(subject string) (Filter, bool) {
	f, ok := partition.WorkerKeyedFilter(subject)
	return Filter{Subject: f.Subject, KeyTokens: f.KeyTokens}, ok
}

// groupOf is a partition package config as a GroupConfig, with partitions partitions.
func groupOf(c partition.Config, partitions int) GroupConfig {
	g := GroupConfig{Stream: c.Stream, Group: c.Group, Partitions: partitions, AckWait: c.AckWait,
		PinnedTTL: c.PinnedTTL, MaxAckPending: c.MaxAckPending, Batch: c.Batch, ReleaseTimeout: c.ReleaseTimeout,
		CumulativeAcks: c.CumulativeAcks, Shards: c.Shards}
	for _, f := range c.Filters {
		g.Filters = append(g.Filters, Filter{Subject: f.Subject, KeyTokens: f.KeyTokens})
	}
	return g
}

// partition is g as the partition package takes it.
func (g GroupConfig) partition() partition.Config {
	c := partition.Config{Stream: g.Stream, Group: g.Group, Partitions: g.Partitions, AckWait: g.AckWait,
		PinnedTTL: g.PinnedTTL, MaxAckPending: g.MaxAckPending, Batch: g.Batch, ReleaseTimeout: g.ReleaseTimeout,
		CumulativeAcks: g.CumulativeAcks, Shards: g.Shards}
	for _, f := range g.Filters {
		c.Filters = append(c.Filters, partition.Filter{Subject: f.Subject, KeyTokens: f.KeyTokens})
	}
	return c
}

// resolve is g with Partitions 0 made one per shard: on stream FPM the server's shard count, asked for
// when Shards is not set; on another stream 1.
func (g GroupConfig) resolve(js jetstream.JetStream) (GroupConfig, error) {
	if g.Partitions != 0 {
		return g, nil
	}
	if g.Stream == streams.StreamFPM && g.Shards == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), shardsTimeout)
		n, err := streams.FPMShardsOf(ctx, js)
		cancel()
		if err != nil {
			return g, err
		}
		if n > 1 {
			g.Shards = n
		}
	}
	g.Partitions = max(g.Shards, 1)
	return g, nil
}

// Validate reports the first setting that cannot work. Zero durations and sizes take their defaults.
func (g GroupConfig) Validate() error { return g.partition().Validate() }

// PartitionOf returns the partition of a message subject (an error when no filter matches it).
func (g GroupConfig) PartitionOf(subject string) (int, error) {
	return g.partition().PartitionOf(subject)
}

// ConsumerName is the durable consumer of partition p.
func (g GroupConfig) ConsumerName(p int) string { return g.partition().ConsumerName(p) }

// ConsumerStream is the stream the group's (first) partition consumer is on: Stream itself with one
// partition, its shard when partitions read shards directly, else the partition stream.
func (g GroupConfig) ConsumerStream() string { return g.partition().ConsumerStream() }

// ConsumerStreamOf is the stream partition p's consumer is on.
func (g GroupConfig) ConsumerStreamOf(p int) string { return g.partition().ConsumerStreamOf(p) }

// ConsumerConfig is how partition p's consumer is declared.
func (g GroupConfig) ConsumerConfig(p int) jetstream.ConsumerConfig {
	return g.partition().ConsumerConfig(p)
}

// PartitionStream is the stream <Stream>_PART_<Group> the group's partitions read when they do not read
// Stream (or its shards) directly: a server-side copy of what the filters select. "" when there is none.
func (g GroupConfig) PartitionStream() string { return g.partition().PartitionStream() }

// ReadsShardsDirectly says partition p reads shard p itself (Shards > 1, Partitions == Shards, keyed
// like the shards).
func (g GroupConfig) ReadsShardsDirectly() bool { return g.partition().ReadsShardsDirectly() }

// ConsumerInfo is the info of the consumer name on stream, a group's partition consumer (push) or
// another (pull).
func ConsumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	return partition.ConsumerInfo(ctx, js, stream, name)
}

// ReplaceAfterAckFloor replaces a consumer the server cannot change (another ack policy, a plain pull
// consumer declared by hand) by the group's partition consumer want, which goes on after the old
// one's ack floor.
func ReplaceAfterAckFloor(ctx context.Context, s jetstream.Stream, want jetstream.ConsumerConfig, floor uint64) error {
	return partition.ReplaceAfterAckFloor(ctx, s, want, floor)
}
