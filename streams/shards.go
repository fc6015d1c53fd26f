package streams

import (
	"hash/fnv"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// Sharded FPM ingest (definitions; not yet wired into the bridge and the consumers, see the README's
// "Sharded ingest (design)"): FPMs are spread over n streams FPM_0 … FPM_<n-1> so that their leaders
// spread over a cluster. A publisher key lives in exactly one shard, ShardOf, which is the consumers'
// partition function (consumers/partition PartitionOf with key tokens 1-4 of fpm.*.*.*.*, the server's
// {{partition(n,1,2,3,4)}} transform), so with as many partitions as shards partition p is shard p.
//
// Invariants:
//   - What is stored is what the FPM stream stores: the bridge publishes a key's FPM to
//     fpmin.<shard>.<ns>.<comp>.<worker>.<rank>, and the shard stream's subject transform stores it as
//     fpm.<ns>.<comp>.<worker>.<rank>, with the same headers and Nats-Msg-Id. A key's duplicate window
//     is its shard's, which is the only stream that ever sees the key while n is unchanged.
//   - Core subscribers keep `nats sub 'fpm.>'`: each shard republishes what it stored on its fpm.
//     subject (after storing, so a core subscriber sees only stored FPMs).

// ShardIngestRoot is the root of the subjects the bridge publishes sharded FPMs to.
const ShardIngestRoot = "fpmin"

// ShardOf is the shard of key k among n: FNV-1a 32-bit over the concatenated subject tokens of the key
// (namespace, component, worker_id, dp_rank as they appear in the subject), modulo n.
func ShardOf(k Key, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(EncodeToken(k.Namespace)))
	_, _ = h.Write([]byte(EncodeToken(k.Component)))
	_, _ = h.Write([]byte(EncodeToken(k.WorkerID)))
	_, _ = h.Write([]byte(strconv.Itoa(k.DPRank)))
	return int(h.Sum32() % uint32(n))
}

// ShardStreamName is the name of shard i.
func ShardStreamName(i int) string { return StreamFPM + "_" + strconv.Itoa(i) }

// ShardIngestSubject is where the bridge publishes k's FPMs with n shards.
func ShardIngestSubject(k Key, n int) string {
	return ShardIngestRoot + "." + strconv.Itoa(ShardOf(k, n)) + "." + KeyTokens(k)
}

// FPMShardStream is the definition of shard i of n: it captures fpmin.<i>.>, stores fpm.>, republishes
// on fpm.>, and holds 1/n of the FPM stream's byte limit.
func (c Config) FPMShardStream(i, n int) jetstream.StreamConfig {
	in := ShardIngestRoot + "." + strconv.Itoa(i) + ".>"
	maxBytes := c.MaxBytes
	if maxBytes > 0 && n > 1 {
		maxBytes /= int64(n)
	}
	sc := c.stream(ShardStreamName(i), "Dynamo forward-pass metrics, shard "+strconv.Itoa(i)+" of "+strconv.Itoa(n)+
		" (publisher keys by ShardOf)", in, c.MaxAge, maxBytes)
	sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: in, Destination: FPMWildcard}
	sc.RePublish = &jetstream.RePublish{Source: FPMWildcard, Destination: FPMWildcard}
	return sc
}
