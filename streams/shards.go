package streams

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// Sharded FPM ingest: FPMs are spread over n streams FPM_0 … FPM_<n-1> so that their leaders spread
// over a cluster. The shards are keyed by worker: every FPM of one worker_id (all its dp ranks, every
// namespace and component) lives in exactly one shard, ShardOf. The key is the worker and not the
// whole publisher key because a worker's trace files need exactly one owner: the trace writer
// partitions by worker_id, and with the shards keyed the same way its partition p is shard p, read
// directly, with no copy of the FPMs. A publisher key (one rank, the gap detector's key) is then in
// one shard as well. ShardOf is the consumers' partition function for a group keyed by the worker_id
// token of fpm.*.*.*.* (consumers/partition PartitionOf, the server's {{partition(n,3)}} transform).
//
// The shard count n is server-side state: every shard stream records it in its metadata
// (MetaFPMShards), and whoever only uses the streams (bridge, consumers, backfill) reads it from there
// (DiscoverFPMShards). Only `fpmbus streams apply --fpm-shards` and `fpmbus up --fpm-shards` declare
// it (Config.FPMShards), and nothing changes it: a different n moves keys between shards, which would
// split a key's order and duplicate window over two streams, so Ensure and NewPlan refuse it
// (ErrShardMismatch). n = 1 is the single stream FPM, as without sharding; the two never coexist.
//
// Invariants:
//   - A worker_id is in one shard whatever its namespace, component or rank (ShardOf hashes it alone).
//   - What is stored is what the FPM stream stores: the bridge publishes a key's FPM to
//     fpmin.<shard>.<ns>.<comp>.<worker>.<rank>, and the shard stream's subject transform stores it as
//     fpm.<ns>.<comp>.<worker>.<rank>, with the same headers and Nats-Msg-Id. A key's duplicate window
//     is its shard's, which is the only stream that ever sees the key while n is unchanged.
//   - Core subscribers keep `nats sub 'fpm.>'`: each shard republishes what it stored on its fpm.
//     subject (after storing, so a core subscriber sees only stored FPMs).

// shardIngestRoot is the root of the subjects the bridge publishes sharded FPMs to.
const shardIngestRoot = "fpmin"

// MaxFPMShards bounds the shard count (a partition group reads one shard per partition).
const MaxFPMShards = 64

// Stream metadata of a shard: the shard count and the shard's index.
const (
	MetaFPMShards = "fpmbus_fpm_shards"
	MetaFPMShard  = "fpmbus_fpm_shard"
)

// ErrShardMismatch: the server holds FPMs in another number of streams than the one declared, or its
// FPM streams contradict each other. Nothing was changed.
var ErrShardMismatch = errors.New("streams: FPM shard count differs from the server's")

// ShardOf is the shard of key k among n: FNV-1a 32-bit over k's worker_id subject token (as it appears
// in the subject, EncodeToken), modulo n. It depends on the worker only: a worker's ranks share a shard.
func ShardOf(k Key, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(EncodeToken(k.WorkerID)))
	return int(h.Sum32() % uint32(n))
}

// ShardStreamName is the name of shard i.
func ShardStreamName(i int) string { return StreamFPM + "_" + strconv.Itoa(i) }

// ShardIngestSubject is where the bridge publishes k's FPMs with n shards.
func ShardIngestSubject(k Key, n int) string {
	return shardIngestRoot + "." + strconv.Itoa(ShardOf(k, n)) + "." + keyTokens(k)
}

// FPMShardStream is the definition of shard i of n: it captures fpmin.<i>.>, stores fpm.>, republishes
// on fpm.>, and holds 1/n of the FPM stream's byte limit.
func (c Config) FPMShardStream(i, n int) jetstream.StreamConfig {
	in := shardIngestRoot + "." + strconv.Itoa(i) + ".>"
	maxBytes := c.MaxBytes
	if maxBytes > 0 && n > 1 {
		maxBytes /= int64(n)
	}
	sc := c.stream(ShardStreamName(i), "Dynamo forward-pass metrics, shard "+strconv.Itoa(i)+" of "+strconv.Itoa(n)+
		" (publisher keys by ShardOf)", in, c.MaxAge, maxBytes)
	sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: in, Destination: FPMWildcard}
	sc.RePublish = &jetstream.RePublish{Source: FPMWildcard, Destination: FPMWildcard}
	sc.Metadata = map[string]string{MetaFPMShards: strconv.Itoa(n), MetaFPMShard: strconv.Itoa(i)}
	sc.AllowAtomicPublish = true // as FPM's: the bridge commits a shard's FPMs in groups
	return sc
}

// FPMStreams are the definitions of the FPM streams with n shards: FPM for n <= 1, else the shards.
func (c Config) FPMStreams(n int) []jetstream.StreamConfig {
	if n <= 1 {
		return []jetstream.StreamConfig{c.FPMStream()}
	}
	out := make([]jetstream.StreamConfig, n)
	for i := range n {
		out[i] = c.FPMShardStream(i, n)
	}
	return out
}

// FPMStreamNames are the names of the FPM streams with n shards: FPM for n <= 1, else FPM_0 … FPM_<n-1>.
func FPMStreamNames(n int) []string {
	if n <= 1 {
		return []string{StreamFPM}
	}
	out := make([]string, n)
	for i := range n {
		out[i] = ShardStreamName(i)
	}
	return out
}

// FPMStreamOf is the stream that stores k's FPMs with n shards.
func FPMStreamOf(k Key, n int) string {
	if n <= 1 {
		return StreamFPM
	}
	return ShardStreamName(ShardOf(k, n))
}

// FPMPublishSubject is the subject a bridge publishes k's FPMs to with n shards: the FPM subject
// itself with one stream, the shard's ingest subject with more.
func FPMPublishSubject(k Key, n int) string {
	if n <= 1 {
		return FPMSubject(k)
	}
	return ShardIngestSubject(k, n)
}

// DiscoverFPMShards reads the shard count from the server: 1 when stream FPM exists, the count the
// shard FPM_0 records when it exists, 0 when neither does (no FPM stream yet). A shard without the
// count in its metadata (made by hand) is an ErrShardMismatch error.
func DiscoverFPMShards(ctx context.Context, js jetstream.JetStream) (int, error) {
	_, err := js.Stream(ctx, StreamFPM)
	switch {
	case err == nil:
		return 1, nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, fmt.Errorf("streams: look up %s: %w", StreamFPM, err)
	}
	s, err := js.Stream(ctx, ShardStreamName(0))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("streams: look up %s: %w", ShardStreamName(0), err)
	}
	raw := s.CachedInfo().Config.Metadata[MetaFPMShards]
	n, err := strconv.Atoi(raw)
	if err != nil || n < 2 || n > MaxFPMShards {
		return 0, fmt.Errorf("%w: stream %s has metadata %s=%q; want the shard count, 2 to %d (create the shards with `fpmbus streams apply --fpm-shards N`)",
			ErrShardMismatch, ShardStreamName(0), MetaFPMShards, raw, MaxFPMShards)
	}
	return n, nil
}

// FPMShardsOf returns the shard count the server has, 1 where no FPM stream exists yet: what a
// component that only reads or publishes uses.
func FPMShardsOf(ctx context.Context, js jetstream.JetStream) (int, error) {
	n, err := DiscoverFPMShards(ctx, js)
	return max(n, 1), err
}

// resolveShards is the shard count Ensure and NewPlan work with: the declared c.FPMShards, which must
// be the server's where the server has FPM streams, else the server's (1 where it has none).
func resolveShards(ctx context.Context, js jetstream.JetStream, c Config) (int, error) {
	have, err := DiscoverFPMShards(ctx, js)
	if err != nil {
		return 0, err
	}
	switch {
	case c.FPMShards == 0:
		return max(have, 1), nil
	case have == 0 || have == c.FPMShards:
		return c.FPMShards, nil
	}
	return 0, fmt.Errorf("%w: the server stores FPMs in %d shard(s) (%s), --fpm-shards asks for %d: "+
		"a key would change shard (its order and duplicate window would span two streams); "+
		"to reshard, create new streams (another account or server) and move the bridges to them",
		ErrShardMismatch, have, describeFPMStreams(have), c.FPMShards)
}

func describeFPMStreams(n int) string {
	if n <= 1 {
		return "stream " + StreamFPM
	}
	return "streams " + ShardStreamName(0) + " … " + ShardStreamName(n-1)
}
