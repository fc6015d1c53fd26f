// Package trace is the trace writer: a durable consumer of the FPM stream (a consumers/durable
// Consumer) that writes Dynamo-identical dynamo.fpm.trace.v1 gzip JSONL segments, one series of
// segments per producer, and Backfill, which replays a range of the stream through the same writer.
// The trace file format and the offline tools over it (segment naming, reading, the torn-tail repair,
// prefix ownership, `trace info`, `trace verify`) are tracefile's; the writer writes by its rules.
//
// One FPM travels through these files:
//
//	consumer.go       Consumer: the durable.Consumer (Handle, Tick, Assigned, Release, Lost, Close)
//	                  and Run, which runs it in a durable.Runner
//	group.go          the consumer group: partitioning by worker_id, ack policy, retention-loss
//	                  events, and replacing consumers declared otherwise (the other mode, by hand)
//	writer.go         writer: one owned partition's producers and the messages waiting to be done;
//	                  record, a message checked into a tracefile.Record (its line) with its delivery;
//	                  full mode, where every valid message becomes one line
//	writer_sampled.go sampled mode: newest message per key per event-time interval
//	flush.go          flusher: compresses, writes and fsyncs off the loop (retrying a failed write
//	                  with backoff); the completed flush marks its messages done
//	recover.go        takeover recovery: the lines an earlier owner wrote for redelivered messages
//	                  (found by tracefile's line identity), and per producer which ones to skip
//	segment_writer.go SegmentWriter: one producer's segments, one gzip member per flush, roll, prune
//	                  (recording what a pruned segment held), cutting a failed write back
//	continuation.go   processSegments: a later writer of a producer in this process continues its
//	                  segment instead of opening one
//	unrepaired.go     a producer whose newest segment cannot be repaired (something not fpmbus's under
//	                  the repair's temporary file) is refused alone, and repaired once it can be
//	backfill.go       Backfill: an ordered consumer over a range, in one plain loop, through writer;
//	                  where an unfinished backfill resumes
//	backfill_existing.go what a backfill's output holds already: no line written twice
//	backfill_text.go  what a backfill wrote and how to resume it, for a person
//	output_group.go   which consumer group writes an output
//	fileutil.go       the file interface (fault injection) and the write probe (directory fsync and
//	                  atomic replacement are internal/fsutil's)
//	config.go         Config (DYN_FPM_* variables) and its validation
//	flags.go          the writer's flags next to its Config (Config.RegisterFlags, Flags.Config)
//	options.go        settings: durable's options (member id, clock) and Config's logger, gzip level, write retry
//	metrics.go        Prometheus metrics (the runner adds fpmbus_consumer_*{consumer="trace"})
//
// Invariants:
//   - A message is done (Msg.Done; the runner then acknowledges it) only after the gzip member holding
//     its line is complete on disk and fsynced. In sampled mode a message that gets no line
//     (superseded in its interval, unchanged counter, late) is done behind the lines already appended,
//     while the message that superseded it stays pending until its own line is durable. A crash
//     therefore loses no acknowledged message.
//   - A line is written at most once per stream message. A message whose acknowledgement did not
//     reach the server (kill -9 between the fsync and the ack, a connection cut, or under cumulative
//     acks a later message durable before an earlier one) comes again to the partition's next owner,
//     which may be this process restarted: the takeover recovery (recover.go) finds such
//     lines by identity (producer, observed_at_unix_ms and a hash of namespace, component, producer_id
//     and the fpm object — nothing is added to the line) and skips those messages. Lines in segments
//     already pruned cannot be found.
//   - Per producer, full-mode lines are in stream order (sampled lines per key, in interval order),
//     across crashes and takeovers too: a partition's new
//     owner first resets its consumer to the ack floor (consumers/partition), so every message not
//     acknowledged comes again, in stream order, before any newer one; the ones already written are a
//     prefix of them and are skipped, the others are written in order.
//   - A failed write (disk full, I/O error, unwritable directory) marks nothing done: the flush is
//     retried with exponential backoff, the loop goes on buffering, the server stops delivering at
//     MaxAckPending and keeps the messages (the runner keeps the held ones alive with in-progress
//     acks). Before each retry the segment is cut back to its last fsynced member and the lines are
//     written into it again; so only the newest segment can have a torn tail. An existing segment
//     file (another writer owns the producer) is not retried: the instance fails.
//   - One message never stalls the writer: a message that can never be written — an invalid subject
//     or body, a file name its file system refuses, a producer id other than its worker_id with
//     P > 1 — is rejected (dead letter on fpmevents.deadletter.consumer.trace naming the reason) and the others go
//     on. Producer ids too long for a file name get a shortened name (tracefile/names.go). A full
//     disk is not such an error: it concerns every producer and is retried.
//   - A segment is opened only at a roll or at a writer's start (Dynamo's rule). A process's first
//     writer of a producer, and one that follows another process's, starts at the highest index plus
//     one, after the takeover repaired a torn tail off the newest segment (or removed it, if a crash
//     left it empty between its creation and its first flush): a segment left by an earlier process is
//     never appended to. A later writer of the producer in the same process (its partition lost and
//     taken again, handed on and back, the component restarted by `up`) continues the segment the
//     previous one left when that is still the newest and holds exactly what it left
//     (continuation.go); otherwise it starts as a first writer does.
//   - Retention (MaxSegments) removes a producer's oldest segments beyond the limit when a segment is
//     opened, as Dynamo does; those lines leave the trace, acknowledged or not, so every removed
//     segment is reported: an error-level log line (segment, lines, stream sequences, observation
//     times), fpmbus_trace_segments_pruned_total and fpmbus_trace_pruned_lines_total, and a loss event
//     on fpmevents.loss.trace (cause pruned) that `fpmbus gaps report` counts.
//   - Lines are never split across segments; a segment holds whole gzip members only, except for a
//     torn last member after a crash, which tracefile.Repair removes.
//   - Time in an event (observed_at_unix_ms) comes from the message (the bridge's receive time), not
//     from the writer's clock; only the outer timestamp is writer-relative (from the consumer's
//     start), as in Dynamo. Sampled intervals are aligned to event time, so a backfill of a range
//     writes the live writer's events.
//
// # Partitions and acks
//
// Every writer is a member of a consumer group (Config.Group, --group), run by durable.Runner on
// consumers/partition: JetStream's own partitioning (the server's partition() subject transform into
// a copy stream FPM_PART_<group>, one durable push consumer per partition (moved between owners by compare-and-set), members in KV FPM_GROUPS, a
// consumer reset on every takeover). Not orbit.go pcgroups: its static groups need a partition token
// in the FPM subjects themselves, and its elastic groups move partitions only when an administrator
// edits their membership, not when an instance stops or crashes, and have no reset on takeover (see
// consumers/partition/doc.go).
//
//   - P = 1 (the default on the single stream FPM): no copy; the group's consumer is <group> on FPM
//     itself, one instance writes, the others are hot standbys. P > 1 (--partitions): every FPM
//     message is stored twice (FPM and FPM_PART_<group>, same limits) and the server does the extra
//     work of P filtered consumers: use it when one writer cannot keep up. P is fixed for the group's
//     life (durable.errGroupMismatch otherwise).
//   - With n FPM shards (streams.ShardOf keys them by worker_id, as this group) the default P is n
//     (Partitions 0): partition p is shard p, consumer <group>-<p> on FPM_<p>, nothing is copied, and
//     a worker's ranks, all in its shard, reach its file in the shard's order. Another P reads
//     FPM_PART_<group> sourcing every shard.
//   - Files are per producer, so the partition key is the worker_id token alone (token 3 of
//     fpm.<namespace>.<component>.<worker_id>.<dp_rank>; never tokens 1-4, which would spread one
//     worker's ranks, hence its file, over several instances). Config.PartitionConfig derives the
//     group from FilterSubject. With P > 1 a message filed under another producer (an Fpm-Producer
//     header other than its worker_id) is rejected (errGroupUnsupported), and --producer-id is
//     refused: one producer's messages must be in one partition. Worker ids that differ but sanitize
//     to the same file name (SanitizeProducerID) are not detected.
//   - Full mode acks cumulatively (the AckAll policy: the runner acknowledges the end of each
//     partition's done prefix, one ack per flush instead of one per message); sampled mode acks each
//     message, since a pending sample waits an interval for its line and would hold back every later
//     acknowledgement. Changing the mode of a group, or upgrading from an fpmbus that acked each
//     message, replaces its consumers at start and goes on after their ack floor.
//   - With P = 1 (or one partition per shard, read directly) and the filter fpm.>, in both modes, the
//     runner reports messages the stream (the shard) removed (retention limits) before the writer read
//     them: log, metric and a loss event on fpmevents.loss.trace with the exact range and count.
//   - Each owned partition has its own writer: Assigned starts it (with a takeover recovery),
//     Release ends it gracefully (sampled: pending samples written; flushed, fsynced, done, files
//     closed, prefixes let go), Lost drops it without writing more. With P = 1 the first takeover also
//     owns every producer of the output and repairs the newest segment of each it owns; a producer
//     whose repair is refused (unrepaired.go) has its messages rejected until it can be repaired, the
//     others go on.
//   - The output directory must be shared by all instances (same --trace-output on one host, or a
//     shared file system with exclusive create, fsync and flock): a new owner continues a producer's
//     series at the next free segment index. A writer owns a producer's prefix (tracefile.Owner:
//     Dynamo's lock file) before it writes or repairs it, so a writer of another group, a worker's own Dynamo
//     writer, verify --repair and backfill refuse each other; a member of the same group that lost
//     the partition while frozen still holds the lock, which its successor borrows. Segments are
//     created with O_EXCL (never through a symbolic link), so two writers never share a file even
//     then.
//   - Crash failover to another instance waits PinnedTTL (--pinned-ttl, default 10 s); a restarted
//     instance with a stable member id (durable.WithMemberID; `fpmbus up` derives one from its host and data
//     directory) takes its partitions back at once. A graceful handover takes the partition's flush
//     plus a few round trips.
package trace
