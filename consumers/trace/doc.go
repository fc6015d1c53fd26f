// Package trace is the trace writer: a durable JetStream consumer of the FPM stream that writes
// Dynamo-identical dynamo.fpm.trace.v1 gzip JSONL segments, one series of segments per producer.
//
// One FPM travels through these files:
//
//	consumer.go       Writer: durable pull consumer on FPM, the loop, graceful stop and abort
//	fetch.go          fetcher: pulls messages and parses them (line.go) off the loop
//	writer_full.go    full mode: every valid message becomes one line
//	writer_sampled.go sampled mode: newest message per key per event-time interval
//	line.go           message (subject, headers, canonical JSON body) -> trace line bytes
//	writer.go         SegmentWriter: one producer's segments, one gzip member per flush, roll, prune
//	flush.go          flusher: compresses, writes and fsyncs off the loop, then the loop acks
//	segment.go        segment naming and discovery, exactly as Dynamo names them
//	repair.go         ReadSegment, CorruptError and the explicit torn-tail Repair run at startup
//	fileutil.go       the file interface (fault injection), directory fsync, the write probe
//	config.go         Config (DYN_FPM_* variables) and its validation
//	metrics.go        Prometheus metrics
//
// Invariants:
//   - A message is acked only after the gzip member holding its line is complete on disk and fsynced.
//     In sampled mode a message that gets no line (superseded in its interval, unchanged counter) is
//     acked behind the lines already appended, while the message that superseded it stays unacked
//     until its own line is durable. A crash therefore loses no acked message.
//   - Segments are never appended to after a restart: a new run starts at the highest index plus one,
//     after Repair has cut a torn tail off the newest old segment.
//   - Lines are never split across segments; a segment holds whole gzip members only, except for a
//     torn last member after a crash, which Repair removes.
//   - Time in an event (observed_at_unix_ms) comes from the message (the bridge's receive time), not
//     from the writer's clock; only the outer timestamp is writer-relative, as in Dynamo.
package trace
