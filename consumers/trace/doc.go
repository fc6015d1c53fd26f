// Package trace is the trace writer: a durable JetStream consumer of the FPM stream that writes
// Dynamo-identical dynamo.fpm.trace.v1 gzip JSONL segments, one series of segments per producer, plus
// the tools around those files: Backfill (replay a range of the stream through the same code path) and
// Info (describe segments).
//
// One FPM travels through these files:
//
//	consumer.go       Writer: durable pull consumer on FPM, the loop, graceful stop, abort, release
//	recover.go        startup recovery: unacked messages whose lines are already on disk
//	seqstate.go       which stream sequences are held or done: a redelivery is written at most once
//	fetch.go          fetcher: pulls messages from a msgSource and parses them (line.go) off the loop
//	writer_full.go    full mode: every valid message becomes one line
//	writer_sampled.go sampled mode: newest message per key per event-time interval
//	line.go           message (subject, headers, canonical JSON body) -> trace line bytes
//	writer.go         SegmentWriter: one producer's segments, one gzip member per flush, roll, prune,
//	                  and abandoning a segment after a failed write
//	flush.go          flusher: compresses, writes and fsyncs off the loop (retrying a failed write
//	                  with backoff), then the loop acks
//	segment.go        segment naming and discovery, exactly as Dynamo names them
//	repair.go         ReadSegment, CorruptError and the explicit torn-tail Repair run at startup
//	backfill.go       Writer.Backfill: an ordered consumer over a range, through the same loop
//	info.go           Info: per producer and key, what segments hold; damage and violations
//	fileutil.go       the file interface (fault injection) and the write probe (directory fsync and
//	                  atomic replacement are internal/fsutil's)
//	config.go         Config (DYN_FPM_* variables) and its validation
//	metrics.go        Prometheus metrics
//
// Invariants:
//   - A message is acked only after the gzip member holding its line is complete on disk and fsynced.
//     In sampled mode a message that gets no line (superseded in its interval, unchanged counter, late)
//     is acked behind the lines already appended, while the message that superseded it stays unacked
//     until its own line is durable. A crash therefore loses no acked message.
//   - A line is written at most once per stream message. A message whose ack was lost (kill -9 between
//     the fsync and the ack's departure, a connection cut) is redelivered although its line is on
//     disk: the startup recovery finds such lines (by identity: producer, observed_at_unix_ms and a
//     hash of namespace, component, producer_id and the fpm object — nothing is added to the line), and
//     in a running writer seqState remembers what it acked; either way the redelivery is acked again
//     and skipped. A redelivery of a message still held (its ack wait expired during a blocked flush)
//     is dropped; the held copy's ack settles it. Lines in segments already pruned cannot be found.
//   - A failed write (disk full, I/O error, unwritable directory) acks nothing: the flush is retried
//     with exponential backoff, the loop blocks, the server stops delivering at MaxAckPending and keeps
//     the messages. Before each retry the segment is cut back to its last fsynced member and closed,
//     and the lines go to a new segment one index up; so only the newest segment can have a torn tail.
//     An existing segment file (another writer owns the producer) is not retried: Run fails.
//   - Segments are never appended to after a restart: a new run starts at the highest index plus one,
//     after Repair has cut a torn tail off the newest old segment (or removed it, if it was left
//     empty by a crash between its creation and its first flush).
//   - Lines are never split across segments; a segment holds whole gzip members only, except for a
//     torn last member after a crash, which Repair removes.
//   - Time in an event (observed_at_unix_ms) comes from the message (the bridge's receive time), not
//     from the writer's clock; only the outer timestamp is writer-relative, as in Dynamo. Sampled
//     intervals are aligned to event time, so a backfill of a range writes the live writer's events.
//
// # Scale-out (RunGroup, `fpmbus trace --partitions N`)
//
// Several instances with the same group name (Config.Durable, --group) share the work by partition,
// through consumers/partition: JetStream's own partitioning (the server's partition() subject
// transform into a copy stream FPM_PART_<group>, one pinned-client durable per partition, members in
// KV FPM_GROUPS, a consumer reset on every takeover). Not orbit.go pcgroups: its static groups need a
// partition token in the FPM subjects themselves, and its elastic groups move partitions only when an
// administrator edits their membership, not when an instance stops or crashes, and have no reset on
// takeover (see consumers/partition/doc.go).
//
//   - Files are per producer, so the partition key is the worker_id token alone (token 3 of
//     fpm.<namespace>.<component>.<worker_id>.<dp_rank>; never tokens 1-4, which would spread one
//     worker's ranks, hence its file, over several instances). Config.PartitionConfig derives the
//     group from FilterSubject. With P > 1 a message filed under another producer (an Fpm-Producer
//     header other than its worker_id) stops the member with ErrGroupUnsupported, and --producer-id
//     is refused: one producer's messages must be in one partition. Worker ids that differ but
//     sanitize to the same file name (SanitizeProducerID) are not detected.
//   - P = 1: no copy; the group's consumer is <group> on FPM itself, one instance writes, the others
//     are hot standbys. P > 1: every FPM message is stored twice (FPM and FPM_PART_<group>, same
//     limits) and the server does the extra work of P filtered consumers: use it when one writer
//     cannot keep up. P is fixed for the group's life (partition.ErrGroupMismatch otherwise).
//   - Each owned partition runs its own writer loop (a session: this package's fetcher, flusher,
//     seqState and, in sampled mode, sampler) over the partition's messages (chanSource), with the
//     FPM stream sequence from partition.StreamSequence (partitionMeta). Graceful revoke (a rebalance,
//     an instance stopping): the session stops as a stopping Run does (sampled: pending samples
//     written), flushes, fsyncs, acks, closes its files and returns; then the partition is handed on.
//     Lost (connection closed, pin lost): nothing more is written, nothing is naked; what is durable
//     is acked, the rest comes again to the next owner after its reset.
//   - Takeover: the torn-tail repair and the redelivery recovery of Run, per producer, when a session
//     sees the producer's first message (group.go, takeover): the newest segment is repaired, and the
//     identities of the lines in the producer's recent segments are read; redelivered messages whose
//     lines an earlier owner made durable (its acks lost) are acked and skipped (they are a prefix of
//     the producer's messages in the session). In sampled mode the same lines seed the sampler.
//   - The output directory must be shared by all instances (same --trace-output on one host, or a
//     shared file system with exclusive create and fsync): a new owner continues a producer's series
//     at the next free segment index. Segments are created with O_EXCL, so two writers never share
//     a file even if the lease is broken (a frozen process, see partition's handler rules).
//   - RunGroup does not run RepairOutput over the whole directory (another member may be writing any
//     producer's newest segment); MaxSegments pruning is per producer and done by its current owner.
//   - Crash failover waits PinnedTTL (--pinned-ttl, default 10 s); a graceful handover takes the
//     session's flush plus a few round trips. Line timestamps (writer-relative) restart from the
//     new owner's start at a handover.
package trace
