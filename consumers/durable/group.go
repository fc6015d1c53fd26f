package durable

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/partition"
)

// The partition group a Runner joins, as the stages name it. A stage configures its group through
// these and never imports consumers/partition: the runner owns membership, so the group's settings
// are part of the consumer contract (Config.Group), while how partitions are owned, taken over and
// rebalanced stays behind it.
type (
	// GroupConfig is a group's partitioning: stream, filters and key tokens, partition count, timings.
	GroupConfig = partition.Config
	// Filter is one subject filter of a group and the wildcards that form its key.
	Filter = partition.Filter
)

// Group limits and defaults (see consumers/partition).
const (
	MaxPartitions    = partition.MaxPartitions
	DefaultPinnedTTL = partition.DefaultPinnedTTL
	MinPinnedTTL     = partition.MinPinnedTTL
	MaxPinnedTTL     = partition.MaxPinnedTTL
	MaxGroupNameLen  = partition.MaxNameLen
)

// ConsumerInfo is the info of a consumer, a partition group's (push) or another (pull).
func ConsumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	return partition.ConsumerInfo(ctx, js, stream, name)
}

// ReplaceAfterAckFloor replaces a consumer the server cannot change by the group's partition
// consumer want, going on after the old one's ack floor.
func ReplaceAfterAckFloor(ctx context.Context, s jetstream.Stream, want jetstream.ConsumerConfig, floor uint64) error {
	return partition.ReplaceAfterAckFloor(ctx, s, want, floor)
}

// ErrGroupMismatch: the group exists on the server with another partitioning.
var ErrGroupMismatch = partition.ErrGroupMismatch

// FPMGroup is the group config keyed by FPM publisher (namespace, component, worker_id, dp_rank).
func FPMGroup(group string) GroupConfig { return partition.FPMConfig(group) }

// BenchGroup is the group config over benchmark subjects keyed by their first wildcard (the run).
func BenchGroup(group string, subjects ...string) GroupConfig {
	return partition.BenchConfig(group, subjects...)
}

// WorkerKeyedFilter is subject keyed by its worker_id token, how sharded FPM streams place keys; ok is
// false when subject cannot be keyed so (see consumers/partition).
func WorkerKeyedFilter(subject string) (Filter, bool) { return partition.WorkerKeyedFilter(subject) }

// DeleteGroup removes a group's consumers and partition stream from the server.
func DeleteGroup(ctx context.Context, js jetstream.JetStream, cfg GroupConfig) error {
	return partition.Delete(ctx, js, cfg)
}
