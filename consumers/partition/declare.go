package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// ConsumerConfig is the durable consumer of partition p, declared idempotently by every Join: explicit
// acks (AckAll with CumulativeAcks), every message from the start, pushed with flow control and idle
// heartbeats to one subject at a time. The subject is the owner's: a member that takes the partition
// points the consumer at a subject of its own (UnownedSubject until the first owner), so the server
// delivers the partition to that member only, and moving it is one consumer update.
func (c Config) ConsumerConfig(p int) jetstream.ConsumerConfig {
	c = c.withDefaults()
	cc := jetstream.ConsumerConfig{
		Durable:        c.ConsumerName(p),
		Description:    fmt.Sprintf("fpmbus group %s on %s: partition %d of %d", c.Group, c.Stream, p, c.Partitions),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  c.MaxAckPending,
		DeliverSubject: c.UnownedSubject(p),
		FlowControl:    true,
		IdleHeartbeat:  c.idleHeartbeat(),
		Metadata: map[string]string{
			"fpmbus_group":     c.Group,
			"fpmbus_partition": strconv.Itoa(p),
		},
	}
	if c.CumulativeAcks {
		cc.AckPolicy = jetstream.AckAllPolicy
	}
	if fs := c.filterSubjects(p); len(fs) == 1 {
		cc.FilterSubject = fs[0]
	} else {
		cc.FilterSubjects = fs
	}
	return cc
}

// partitionStreamConfig is the partition stream of a group with Partitions > 1. It sources the
// group's stream through one subject transform per filter, "<subject>" -> "<partition>.<subject>",
// so every key lands in one partition and keeps its stream order. Retention, limits, storage and
// replicas are the source stream's: a lagging group loses nothing the source still holds, and the copy
// costs what the source costs. (Work-queue retention would keep only the backlog, but deleting every
// acked message made consumption about 4x slower in BenchmarkThroughput; see the package comment.)
//
// A sharded stream's partition stream sources every shard the same way (keys never span shards, so
// per-key order holds) and may hold what all of them hold (n times a shard's byte limit).
func (c Config) partitionStreamConfig(src *jetstream.StreamInfo) jetstream.StreamConfig {
	c = c.withDefaults()
	tr := make([]jetstream.SubjectTransformConfig, len(c.Filters))
	for i, f := range c.Filters {
		tr[i] = jetstream.SubjectTransformConfig{Source: f.Subject, Destination: c.transformDest(f)}
	}
	names := c.SourceStreams()
	sources := make([]*jetstream.StreamSource, len(names))
	for i, name := range names {
		sources[i] = &jetstream.StreamSource{Name: name, SubjectTransforms: tr}
	}
	maxBytes := src.Config.MaxBytes
	if maxBytes > 0 && len(names) > 1 {
		maxBytes *= int64(len(names))
	}
	metaSrc := c.Stream
	if len(names) > 1 {
		metaSrc = strings.Join(names, ",")
	}
	return jetstream.StreamConfig{
		Name:              c.PartitionStream(),
		Description:       fmt.Sprintf("fpmbus group %s: %s split into %d partitions (copy; the source is unchanged)", c.Group, c.Stream, c.Partitions),
		Retention:         jetstream.LimitsPolicy,
		Discard:           src.Config.Discard,
		MaxAge:            src.Config.MaxAge,
		MaxBytes:          maxBytes,
		MaxMsgs:           src.Config.MaxMsgs,
		MaxMsgsPerSubject: src.Config.MaxMsgsPerSubject,
		MaxConsumers:      -1,
		Storage:           src.Config.Storage,
		Replicas:          src.Config.Replicas,
		Sources:           sources,
		Metadata: map[string]string{
			metaPartitions: strconv.Itoa(c.Partitions),
			metaFilters:    c.filtersSignature(),
			metaSource:     metaSrc,
		},
	}
}

// declare creates (or checks) the group's server resources: the partition stream when Partitions > 1
// and the Partitions durable consumers. It refuses to change an existing group's partitioning. It
// returns, for each partition p, the stream partition p's consumer lives on: the group's stream, its
// partition stream, or shard p when the group reads its shards directly.
func declare(ctx context.Context, js jetstream.JetStream, c Config) ([]jetstream.Stream, error) {
	c = c.withDefaults()
	srcs := make([]jetstream.Stream, 0, max(c.Shards, 1))
	for _, name := range c.SourceStreams() {
		src, err := call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
		if err != nil {
			return nil, fmt.Errorf("partition: stream %s: %w", name, err)
		}
		srcs = append(srcs, src)
	}
	src := srcs[0]
	srcInfo := src.CachedInfo()
	partName := c.Stream + "_PART_" + c.Group // exists only when the group copies (Partitions > 1, or shards not read directly)
	consStreams := []jetstream.Stream{src}
	if c.direct() {
		if _, err := call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, partName) }); err == nil {
			return nil, fmt.Errorf("%w: %s/%s reads its %d shards directly but partition stream %s exists (delete the group to change)",
				ErrGroupMismatch, c.Stream, c.Group, c.Shards, partName)
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("partition: look up %s: %w", partName, err)
		}
		consStreams = srcs
	} else if !c.copies() {
		if _, err := call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, partName) }); err == nil {
			return nil, fmt.Errorf("%w: %s/%s has 1 partition but partition stream %s exists (delete the group to change)",
				ErrGroupMismatch, c.Stream, c.Group, partName)
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("partition: look up %s: %w", partName, err)
		}
	} else {
		if ci, err := ConsumerInfo(ctx, js, c.Stream, c.Group); err == nil && isGroupConsumer(ci) {
			return nil, fmt.Errorf("%w: %s/%s exists with 1 partition (consumer %s on %s); delete the group to change",
				ErrGroupMismatch, c.Stream, c.Group, c.Group, c.Stream)
		}
		if c.Shards > 1 { // a group that reads its shards directly has <group>-0 on the first shard
			direct := c.Group + "-0"
			if ci, err := ConsumerInfo(ctx, js, srcInfo.Config.Name, direct); err == nil && isGroupConsumer(ci) {
				return nil, fmt.Errorf("%w: %s/%s reads its %d shards directly (consumer %s on %s); delete the group to change",
					ErrGroupMismatch, c.Stream, c.Group, c.Shards, direct, srcInfo.Config.Name)
			}
		}
		want := c.partitionStreamConfig(srcInfo)
		ps, err := call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, want.Name) })
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			ps, err = call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, want) })
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another member won the race
				ps, err = call(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, want.Name) })
			}
		}
		if err != nil {
			return nil, fmt.Errorf("partition: partition stream %s: %w", want.Name, err)
		}
		md := ps.CachedInfo().Config.Metadata
		for _, k := range []string{metaPartitions, metaFilters, metaSource} {
			if md[k] != want.Metadata[k] {
				return nil, fmt.Errorf("%w: %s/%s: %s is %q on the server, %q here (delete the group to change)",
					ErrGroupMismatch, c.Stream, c.Group, k, md[k], want.Metadata[k])
			}
		}
		consStreams = []jetstream.Stream{ps}
	}
	if len(consStreams) == 1 {
		consStreams = slices.Repeat(consStreams, c.Partitions)
	}
	for p := range c.Partitions {
		if err := declareConsumer(ctx, consStreams[p], c, p); err != nil {
			return nil, err
		}
	}
	return consStreams, nil
}

// declareConsumer creates partition p's consumer, or brings an existing one to this Config while
// keeping its deliver subject (the current owner's: changing it would move the partition). A consumer
// that exists with the same settings is left alone. The server refuses to change an ack policy; that
// is reported in the group's terms, as is a consumer of that name that is not the group's: a pull
// consumer always is someone else's, since a group's partition consumers are push consumers.
func declareConsumer(ctx context.Context, consStream jetstream.Stream, c Config, p int) error {
	want := c.ConsumerConfig(p)
	lookup := func() (*jetstream.ConsumerInfo, error) {
		return call(ctx, func(ctx context.Context) (*jetstream.ConsumerInfo, error) {
			cons, err := consStream.PushConsumer(ctx, want.Durable)
			if err != nil {
				return nil, err
			}
			return cons.CachedInfo(), nil
		})
	}
	create := func() error {
		_, err := call(ctx, func(ctx context.Context) (jetstream.PushConsumer, error) {
			return consStream.CreatePushConsumer(ctx, want)
		})
		return err
	}
	ci, err := lookup()
	if errors.Is(err, jetstream.ErrNotPushConsumer) {
		err = fmt.Errorf("%w: %s/%s: consumer %s exists and is not this group's (a pull consumer); delete it or name the group otherwise",
			ErrGroupMismatch, c.Stream, c.Group, want.Durable)
	}
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if err = create(); err == nil || !errors.Is(err, jetstream.ErrConsumerExists) {
			break
		}
		// another member created it first: bring it to this Config like an existing one
		if ci, err = lookup(); err != nil {
			break
		}
		fallthrough
	case err == nil:
		if ci.Config.AckPolicy != want.AckPolicy {
			return fmt.Errorf("%w: %s/%s: consumer %s acks with policy %s on the server, %s here (delete the group to change)",
				ErrGroupMismatch, c.Stream, c.Group, want.Durable, ci.Config.AckPolicy, want.AckPolicy)
		}
		// The server cannot change a push consumer's heartbeat or flow control, and the subject is
		// the owner's: a group whose PinnedTTL changed keeps the heartbeat it was declared with.
		want.DeliverSubject, want.IdleHeartbeat, want.FlowControl = ci.Config.DeliverSubject, ci.Config.IdleHeartbeat, ci.Config.FlowControl
		if sameConsumerSettings(ci.Config, want) {
			return nil
		}
		_, err = call(ctx, func(ctx context.Context) (jetstream.PushConsumer, error) {
			return consStream.UpdatePushConsumer(ctx, want)
		})
	}
	if err != nil {
		return fmt.Errorf("partition: declare consumer %s: %w", want.Durable, err)
	}
	return nil
}

// ReplaceAfterAckFloor replaces consumer want.Durable on stream s, whose ack floor is floor, by a push
// consumer declared as want (a partition consumer), reset to the message after floor: the group goes
// on where the old consumer stood, and the messages above its floor come again (handlers recognise
// what they made durable). For consumers the server cannot change: another ack policy, or pull to
// push. An instance still consuming the old consumer fails.
func ReplaceAfterAckFloor(ctx context.Context, s jetstream.Stream, want jetstream.ConsumerConfig, floor uint64) error {
	if _, err := call(ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.DeleteConsumer(ctx, want.Durable)
	}); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("partition: replace consumer %s: delete: %w", want.Durable, err)
	}
	if _, err := call(ctx, func(ctx context.Context) (jetstream.PushConsumer, error) {
		return s.CreatePushConsumer(ctx, want)
	}); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return fmt.Errorf("partition: replace consumer %s: declare: %w", want.Durable, err)
	}
	if floor == 0 {
		return nil
	}
	if _, err := call(ctx, func(ctx context.Context) (*jetstream.ConsumerResetResponse, error) {
		return s.ResetConsumerToSequence(ctx, want.Durable, floor+1)
	}); err != nil {
		return fmt.Errorf("partition: replace consumer %s: go on after ack floor %d (reset it with `nats consumer` before the next start, or it reads its stream from the first message): %w",
			want.Durable, floor, err)
	}
	return nil
}

// sameConsumerSettings reports whether the server's consumer config has already every setting
// ConsumerConfig gives (the server fills in others, such as its own metadata).
func sameConsumerSettings(have, want jetstream.ConsumerConfig) bool {
	for k, v := range want.Metadata {
		if have.Metadata[k] != v {
			return false
		}
	}
	return have.Description == want.Description && have.AckWait == want.AckWait && have.MaxAckPending == want.MaxAckPending &&
		have.MaxDeliver == want.MaxDeliver && have.FlowControl == want.FlowControl && have.IdleHeartbeat == want.IdleHeartbeat &&
		have.DeliverSubject == want.DeliverSubject && have.FilterSubject == want.FilterSubject &&
		slices.Equal(have.FilterSubjects, want.FilterSubjects)
}

// call runs one server call with its own deadline of apiTimeout within ctx: a request the cluster
// never answers (its leader gone mid-request) fails after apiTimeout rather than at ctx's end, so that
// Join can try again.
func call[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	return f(ctx)
}

// ConsumerInfo is the info of consumer name on stream, push (a partition group's) or pull.
func ConsumerInfo(ctx context.Context, js jetstream.JetStream, stream, name string) (*jetstream.ConsumerInfo, error) {
	return call(ctx, func(ctx context.Context) (*jetstream.ConsumerInfo, error) {
		if c, err := js.PushConsumer(ctx, stream, name); err == nil {
			return c.CachedInfo(), nil
		} else if !errors.Is(err, jetstream.ErrNotPushConsumer) {
			return nil, err
		}
		c, err := js.Consumer(ctx, stream, name)
		if err != nil {
			return nil, err
		}
		return c.CachedInfo(), nil
	})
}

// isGroupConsumer reports whether a consumer was declared by a partition group (its metadata names
// the group), not by someone else under the same name.
func isGroupConsumer(ci *jetstream.ConsumerInfo) bool {
	_, ok := ci.Config.Metadata["fpmbus_group"]
	return ok
}

// membersBucket opens (creating it if needed) the KV bucket of live members.
func membersBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := call(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, MembersBucket) })
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg := jetstream.KeyValueConfig{
			Bucket:      MembersBucket,
			Description: "fpmbus consumer-group members: <stream>.<group>.<member> -> heartbeat",
			History:     1,
			TTL:         membersBucketTTL,
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		}
		kv, err = call(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) })
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = call(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, MembersBucket) })
		}
	}
	if err != nil {
		return nil, fmt.Errorf("partition: members bucket %s: %w", MembersBucket, err)
	}
	return kv, nil
}

// Delete removes a group's server state: its partition consumers (and partition stream) and its
// members' keys. Stop every member first. A group created again starts from the stream's first message.
func Delete(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	c := cfg.withDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	var errs []error
	switch {
	case c.copies():
		if err := js.DeleteStream(ctx, c.PartitionStream()); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, err)
		}
	default:
		for p := range c.Partitions {
			if err := js.DeleteConsumer(ctx, c.ConsumerStreamOf(p), c.ConsumerName(p)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				errs = append(errs, err)
			}
		}
	}
	if kv, err := js.KeyValue(ctx, MembersBucket); err == nil {
		if lister, err := kv.ListKeysFiltered(ctx, c.Stream+"."+c.Group+".*", c.Stream+"."+c.Group+".owner.*"); err == nil {
			for k := range lister.Keys() {
				if err := kv.Purge(ctx, k); err != nil {
					errs = append(errs, err)
				}
			}
		} else if !errors.Is(err, jetstream.ErrNoKeysFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("partition: delete group %s/%s: %w", c.Stream, c.Group, err)
	}
	return nil
}
