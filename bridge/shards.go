package bridge

import "github.com/fpmbus/fpmbus/streams"

// Sharded ingest (streams/shards.go): with n > 1 FPM shards on the server, a key's FPMs are published
// to its shard's ingest subject fpmin.<shard>.<key tokens>, which the shard stores under the key's
// fpm. subject. The message id, headers and body are the ones built at receive time, so dedup,
// buffering, drop accounting and ack records are unchanged; a key's stream sequences (ack records,
// lost_after_ack checks, run agreement) are its shard's. The shard count is the server's, read by
// Ensure when the bridge starts (before the publisher runs): messages buffered before that carry the
// fpm. subject and are routed when published.

// routeToShard sets FPM item it's subject to its shard's ingest subject when the server has shards.
// Publisher goroutine; idempotent (a retried item keeps its subject).
func (b *Bridge) routeToShard(it *item) {
	if b.fpmShards > 1 {
		it.m.Subject = streams.ShardIngestSubject(it.key, b.fpmShards)
	}
}

// fpmStreamOf is the stream holding k's FPMs: FPM, or k's shard.
func (b *Bridge) fpmStreamOf(k streams.Key) string { return streams.FPMStreamOf(k, b.fpmShards) }

// forKey is the bounds of k's stream: the shard's with shards, else b itself.
func (b streamBounds) forKey(k streams.Key) streamBounds {
	if len(b.shards) <= 1 {
		return b
	}
	return b.shards[streams.ShardOf(k, len(b.shards))]
}
