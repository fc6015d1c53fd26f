// Package merge is fpmbus's benchmark merger: it folds the per-rank self-benchmark artefacts of one
// Dynamo run (vLLM --benchmark-mode) into the merged artefact and its worker-probe sidecar, following
// Dynamo's worker_factory.py merge and Dynamo's FPM trace reference (measurement protocol, per-sample
// timing and graph dispatch, warmup evidence, engine provenance, worker probe sidecar and coverage).
// Where upstream writes the worker probe inline into the artefacts, fpmbus does as the reference says:
// the rank and merged artefacts keep their startup engine block and the probe's results go to a separate
// sidecar.
//
// # Pieces
//
//   - Merge (merge.go, evidence.go, probe.go): the pure merge. Rank artefacts in, a *result or a
//     *RejectError naming the run, rank, point and rule broken out; nothing is written.
//   - WriteResult (write.go): the files, so that a sidecar never sits next to another run's merged
//     artefact: remove a sidecar left by an earlier run, write the merged artefact atomically (temp file,
//     fsync, rename, directory fsync), then the sidecar.
//   - benchstore.BenchStore: bodies on FPM_BENCH, inline up to 1 MiB, otherwise in the object store
//     FPM_BENCH_OBJECTS behind a small manifest message. The subjects, headers, message ids and the
//     store are the wire contract, in streams/ (bench.go, objectstore.go), shared with the sealer.
//   - Consumer (consumer.go): the durable merger behind `fpmbus merge` and `fpmbus up`.
//   - `fpmbus bench merge` runs Merge + WriteResult offline over OpenRankFiles (files.go: every
//     artefact file read size-checked, ReadArtefact); `fpmbus bench publish` runs validateRank and
//     ProbeRun (publish.go) through NewPublication (files.go), then benchstore.BenchStore.PublishBench.
//
// # How a merge reads a run
//
// Rank artefacts of a large run are big (8 ranks x 2,000 points with raw samples: 170 MB each, because
// every rank's file carries every rank's FPMs in its synchronised iteration groups). Merge never holds
// more than one tree: (1) it scans every rank's run-level fields, skipping results and
// iteration_groups; (2) it builds the reference (lowest) rank's tree without its own results and checks
// its groups point by point; (3) it streams every rank against that tree with schemas.BenchScanner —
// its copy of the groups is compared without being built, each of its results is parsed alone — a few
// ranks at a time; (4) it assembles the merged document from the reference tree.
//
// # The merged artefact
//
// It is the reference rank's document, every field kept (unknown ones included, numbers as written),
// with these members set as Dynamo sets them; a member the reference has keeps its position, a new one
// is appended in this order: engine (reseeded from the first rank whose capture succeeded when the
// reference's failed; parallel.data_parallel_rank null; capture_errors for degraded ranks),
// artifact_type "merged", dp {ranks, source_ranks, managed_size, global_size}, rank_files,
// merged_output_path, worker_probe_path (right after merged_output_path, only with an engine block),
// results (flattened per benchmark id, then rank, point.dp_rank set, kv_seed_regime carried),
// iteration_groups, rank_warmup_evidence (execution-evidence runs; warmup_evidence removed), timing (the
// slowest rank's, with measured_iteration_seconds the sum of group wall times and
// rank_benchmark_elapsed_seconds), coverage (times global_size), skipped_points. It is written as
// Python's json.dump(indent=2) writes it (see schemas.WriteBenchJSON), so it is byte-identical to
// Dynamo's merger output for the same inputs.
//
// # Scale-out
//
// The merger is a durable.Consumer (consumers/durable) run in a consumers/partition group named by
// Config.Durable: FPM_BENCH's fpmbench.rank.<run>.<rank> and fpmbench.probe.<run>, both keyed by the run
// token, so a run's ranks and probe replies share a partition and a partition has one owner at a time.
// Partitions 1 (the default) is one active merger with hot standbys; N > 1 spreads the runs over the
// instances. A run's ranks are held (not acked) until its outcome is durable; when a partition moves
// (rebalance, stop, crash after PinnedTTL) its unacked ranks come again, in stream order, to the next
// owner, and the outcome checks (a merged message or an outcome event makes a run final) make that
// takeover safe: a run is merged once whichever instance folds it. The static fnv(run_id) mod N
// partitioning of earlier versions, one instance per partition, is gone.
package merge
