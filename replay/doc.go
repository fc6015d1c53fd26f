// Package replay drives any FPM consumer from a recording, at the recorded pace, without a GPU: it reads
// Dynamo trace segments (or a range of stream FPM), schedules every record at its recorded
// observed_at_unix_ms offset, and sends it either as Dynamo's publisher would (one ZMQ PUB socket per
// producer and rank) or as a bridge would have stored it (straight onto stream FPM, under another
// namespace). It then reports how faithful the replay was. `fpmbus trace replay` and `fpmbus up --demo
// --demo-trace` run it.
//
// One recorded FPM travels through these files:
//
//	source_trace.go   resolveSegments, ReadTrace: segment files (a directory, a file, a glob or an output
//	                  prefix) -> records; a non-trace is an error naming the file and line
//	segment.go        scanSegment: multi-member gzip, whole lines only; a torn tail is Damage (file, offset)
//	source_stream.go  ReadStream: a range of stream FPM -> records (what a full trace would hold)
//	record.go         record, Recording: records in schedule order (observed time, ties by source order)
//	payload.go        the record's msgpack payload, re-encoded from its JSON and checked to decode back to
//	                  the same bytes; worker_id mapped, counter_id left as a slot when renumbering
//	plan.go           NewPlan: window, speed, rate cap, loops -> Steps (due offsets) and Sockets;
//	                  LoopPlan: a recording as `up --demo-trace`'s endless load
//	duration.go       exact due times: offsets / speed rounded up to the nanosecond, or refused beyond
//	                  the longest span (never wrapped around to a negative due time)
//	stats.go          Shape: duration, per-rank rate and inter-arrival p50/p99 (--info, --dry-run)
//	plan_report.go    WritePlan (--dry-run, text or JSON) and Recording.WriteDamage
//	info.go           Recording.WriteInfo (--info), Report.WriteJSONFile (--summary-json), WriteTraceInfo
//	                  (`fpmbus trace info`: the segments' report and the recording's shape)
//	pacer.go          the send loop: due times on the monotonic clock, sequences, heartbeats
//	sleep_linux.go    sub-millisecond waits (nanosleep)
//	target_zmq.go     ZMQ PUB sockets (producer.Sender, counting their subscribers), the port layout,
//	                  the descriptor budget, the wait for subscribers, on-full policy
//	target_stream.go  JetStream publishes with the bridge's headers (streams.FPMMessage), ack collector
//	report.go         lateness histogram, per-rank and overall Report, CSV rows, progress lines
//	replayer.go       replayer: New, Run, Ready; Config and options
//	flags.go          the command-line flags of the pacing and the targets
//	source_flags.go   SourceFlags: trace segments or, with --from-stream, a range of stream FPM
//
// # Invariants
//
//   - Records are sent in schedule order, never reordered, never early. Due times come from the
//     recording only (observed_at_unix_ms, or the stream's Fpm-Received-At-Ms), scaled by the speed and
//     pushed later by the rate cap, exactly (rounded up to the nanosecond); they are fixed before the
//     first send. A plan whose schedule would outlast the longest time.Duration is refused.
//   - A late send goes at once and is reported against its original due time; the schedule is never
//     compressed to hide lateness and no record is dropped to catch up (a ZMQ send libzmq refuses is
//     dropped only under onFullDrop, as Dynamo drops it, and counted as failed).
//   - Every payload decodes (schemas.DecodeFPM) to exactly the recorded fpm JSON, byte for byte, apart
//     from the rewrites asked for (worker_id mapped, counter_id renumbered); a record for which that
//     cannot hold is skipped with its reason, never sent altered.
//   - Every record of the source is accounted for exactly once: replayed, undelivered (sent on a ZMQ
//     socket that had no subscriber, which libzmq drops silently), failed or skipped (with a reason);
//     per pass, replayed + undelivered + failed + skipped other than invalid lines = records read.
//   - Sequences start at 0 per socket and advance by one per message, heartbeats included, as Dynamo's
//     publisher numbers them.
//
// # Ownership
//
// A replayer is run once. Run owns the target: the ZMQ sockets are created, used and closed by Run's
// goroutine (the pacer); the stream target's ack collector goroutine is started when the target opens
// and stopped (every ack awaited) before Run returns. The reporter has one writer at a time and no
// lock: the pacer (ZMQ target) or the ack collector (stream target) records sends, and Run reads the
// report only after the target has closed. It owns the CSV and progress writers but never closes them.
// The NATS connection is the caller's. A Plan is read-only once built: several Replayers may run it,
// one after the other or at once.
package replay
