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
//	fileutil.go       the file interface (fault injection), directory fsync, the write probe
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
//     after Repair has cut a torn tail off the newest old segment.
//   - Lines are never split across segments; a segment holds whole gzip members only, except for a
//     torn last member after a crash, which Repair removes.
//   - Time in an event (observed_at_unix_ms) comes from the message (the bridge's receive time), not
//     from the writer's clock; only the outer timestamp is writer-relative, as in Dynamo. Sampled
//     intervals are aligned to event time, so a backfill of a range writes the live writer's events.
//
// Scale-out: the loop reads from a msgSource (fetch.go) and resolves stream sequences through a metaOf
// function (line.go), so a partitioned group (consumers/partition) can hand one partition's messages
// in, with the FPM stream sequence from partition.StreamSequence; on revoke, Writer.release flushes,
// acks and closes that partition's producers. Producers must then map to partitions one to one (two
// instances must never write one producer's files).
package trace
