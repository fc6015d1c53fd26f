package partition

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/streams"
)

// A group on a sharded stream (Config.Shards > 1: FPMs spread over FPM_0 … FPM_<n-1> by
// streams.ShardOf, every FPM of one worker_id in one shard) reads it in one of two ways:
//
//   - Directly, when the group is keyed like the shards (ShardKeyed: FPM subjects
//     fpm.<namespace>.<component>.<worker_id>.<dp_rank> keyed by their worker_id token alone, which is
//     ShardOf) and Partitions == Shards: partition p is shard p, its consumer <group>-<p> lives on
//     shard p with the group's filter, and nothing is copied. A partition then holds exactly the keys
//     PartitionOf gives it, so every handler rule holds as on one stream, and it reads every message
//     of its shard that the filter matches, in the shard's order.
//   - Through the partition stream otherwise (another key, or another partition count, one
//     included): <Stream>_PART_<group> sources every shard through the group's partition transform,
//     as it sources one stream. A key of the group is a worker, a publisher or finer, and a worker
//     never spans shards, so every key's messages keep their order in the copy; StreamSequence is
//     then the shard's sequence (the source header), which grows with every message of the key like
//     the one stream's did.
//
// A member therefore holds a stream handle per partition (declare's result): the stream the
// partition's consumer lives on, shard p for partition p when the group reads its shards directly.

// fpmWorkerToken is the 0-based index of worker_id in fpm.<namespace>.<component>.<worker_id>.<dp_rank>,
// the token the shards are keyed by.
const fpmWorkerToken = 3

// WorkerKeyedFilter is subject, a filter of FPM subjects (fpm.>, fpm.<namespace>.>, …), as a filter of
// the five-token FPM subjects it matches, keyed by their worker_id token alone: a trailing '>' becomes
// '*' tokens up to the dp_rank. ok is false when subject cannot be so keyed: it does not expand to five
// tokens under fpm, or it names one worker_id (then every message has one key anyway).
func WorkerKeyedFilter(subject string) (f Filter, ok bool) {
	toks := strings.Split(subject, ".")
	if toks[len(toks)-1] == ">" {
		toks = toks[:len(toks)-1]
		for len(toks) < 5 {
			toks = append(toks, "*")
		}
	}
	if len(toks) != 5 || toks[0] != streams.FPMRoot || toks[fpmWorkerToken] != "*" {
		return Filter{}, false
	}
	n := 0 // the worker_id's place among the wildcards: the transform's key token
	for _, t := range toks[:fpmWorkerToken+1] {
		if t == "*" {
			n++
		}
	}
	return Filter{Subject: strings.Join(toks, "."), KeyTokens: []int{n}}, true
}

// ShardKeyed reports whether c partitions like the shard function: stream FPM, one filter of
// five-token FPM subjects keyed by the worker_id token alone (WorkerKeyedFilter's form).
func (c Config) ShardKeyed() bool {
	if c.Stream != streams.StreamFPM || len(c.Filters) != 1 {
		return false
	}
	want, ok := WorkerKeyedFilter(c.Filters[0].Subject)
	return ok && c.Filters[0].Subject == want.Subject && slices.Equal(c.Filters[0].KeyTokens, want.KeyTokens)
}

// direct reports whether partition p consumes shard p itself.
func (c Config) direct() bool {
	return c.Shards > 1 && c.Partitions == c.Shards && c.ShardKeyed()
}

// ReadsShardsDirectly reports whether each partition consumes its shard itself (see above): its
// consumer then sees every message of the shard its filter matches, in the shard's order.
func (c Config) ReadsShardsDirectly() bool { return c.withDefaults().direct() }

// copies reports whether the group consumes a partition stream.
func (c Config) copies() bool {
	return (c.Partitions > 1 || c.Shards > 1) && !c.direct()
}

// shardStream is the name of shard i of the group's stream (streams.ShardStreamName for FPM).
func (c Config) shardStream(i int) string { return c.Stream + "_" + strconv.Itoa(i) }

// SourceStreams are the streams the group's messages are stored in: its stream, or its shards.
func (c Config) SourceStreams() []string {
	if c.Shards <= 1 {
		return []string{c.Stream}
	}
	out := make([]string, c.Shards)
	for i := range c.Shards {
		out[i] = c.shardStream(i)
	}
	return out
}
