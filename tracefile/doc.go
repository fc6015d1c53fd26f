// Package tracefile is the dynamo.fpm.trace.v1 trace on disk and the offline tools over it: which
// files are whose segments, how a stream message becomes a line, how a segment is read, repaired and
// owned, and `fpmbus trace info` and `fpmbus trace verify`. The trace writer (consumers/trace) writes
// by these rules, its backfill through the writer; replay (replay/) reads by them. The line itself
// (its fields, their byte-exact JSON and its checks) is schemas' (schemas.TraceLine); this package
// owns everything around it. It imports no stage: the writer and the tools share it, not each other.
//
//	names.go      segment naming: output base, producer file names (shortened within NAME_MAX),
//	              <prefix>.<index:06>.jsonl.gz, which files belong to a prefix, the next index
//	read_order.go the order a reader reads a list of trace files in (info, replay)
//	record.go     a stream message -> Record (key, producer, observation time, body) -> line bytes
//	fpm_ident.go  CheckFPM: an FPM body's worker_id, dp_rank, counter_id, one pass for the common shape
//	identity.go   a line's identity (prefix, observed_at_unix_ms, hash of source and fpm): how a line
//	              is matched to its message, by the writer's takeover recovery and by Verify
//	repair.go     ReadSegment, CorruptError and the explicit torn-tail Repair (repairOutput,
//	              RepairPrefixes), and the temporary files an interrupted rewrite leaves
//	owner.go      Owner: one owner per producer prefix, Dynamo's <prefix>.000000.jsonl.lock, held by
//	              a writer, a repair or a backfill while it may touch the prefix's files
//	info.go       Info: per producer and key, what segments hold; damage and violations
//	verify.go     Verify: check every segment of an output, match it to the stream, repair
//	verify_scan.go    checkSegment (Pieces): members, resynchronising past damage; lines; order
//	verify_stream.go  lines matched to stream FPM by identity; what the stream can restore
//	verify_repair.go  the rewrite of a damaged segment, and the rename rule next to a running writer
//	verify_report.go  the report, as text and JSON
//	options.go    Verify's settings (VerifyConfig's logger and gzip level); the gzip level of the
//	              members fpmbus writes
//
// Invariants:
//   - One naming rule: a file is segment i of a prefix only if its name is exactly SegmentPath(prefix,
//     i), so the writer, the tools, replay and Dynamo's own writer claim the same files and no
//     others (another producer's, ".tmp" siblings, a directory's other files).
//   - A segment is whole gzip members, each holding whole lines, except for a torn last member of a
//     producer's newest segment after a crash. ReadSegment delivers a member's lines only once the
//     member is complete, so on a *CorruptError the caller has seen exactly the lines before its
//     offset; Repair cuts there, atomically (a temporary file renamed over the segment, the directory
//     fsynced), and never writes through a symbolic link or another non-regular file.
//   - A line carries nothing fpmbus-specific: it is matched to its stream message by its identity
//     alone (identity.go), which every reader of the files computes the same way.
//   - Whoever writes, repairs, rewrites or prunes a prefix's files owns the prefix first (Owner) and
//     holds it while it may touch them: the trace writer, `trace verify --repair` and `trace backfill`
//     refuse each other, and a worker's own Dynamo writer, by the same lock file.
//   - Info and Verify report damage, they do not fail on it; Verify rewrites a segment only with
//     Repair, only from what the stream holds, only a sealed segment (below its producer's newest, or
//     with IncludeActive), and only the file it read.
package tracefile
