package merge

import (
	"errors"
	"strconv"
	"strings"
)

// rule names one merge rule. Its value is the stable snake_case name used in rejection events, log lines
// and error messages.
type rule string

// The rules, in the order Merge checks them: each rank artefact on its own (the rules `fpmbus bench
// publish` also applies before publishing), then every rank against the reference (lowest) rank, then
// the reference rank's synchronised groups point by point, then every rank's copy of the groups and its
// own results. The first rule broken is reported.
const (
	// Each rank on its own.
	RuleArtefactSize       rule = "artefact_size"               // larger than the maximum artefact size (refused before it is read when its size is known)
	RuleMalformedJSON      rule = "malformed_json"              // not one JSON object (syntax, duplicate key, ...), or a body that does not match its sha256
	ruleSchemaVersion      rule = "schema_version"              // schema_version is not 2
	ruleArtifactType       rule = "artifact_type"               // artifact_type present and not "rank"
	ruleMissingRunID       rule = "missing_run_id"              // run_id missing or empty
	RuleRunID              rule = "run_id"                      // run_id holds a control character or is over streams.MaxRunIDToken as a subject token
	ruleMissingGridDigest  rule = "missing_grid_digest"         // grid_digest missing or empty
	ruleDPSize             rule = "dp_size"                     // dp.size not an integer >= 1
	ruleRankMismatch       rule = "rank_mismatch"               // dp.rank outside 0..dp.size-1, or not the rank the file was supplied as (subject, _dpN name)
	ruleStatus             rule = "status"                      // status not complete|partial, or inconsistent with valid/usable/stop_reason/error/coverage/missing_phases
	ruleCoverageArithmetic rule = "coverage_arithmetic"         // coverage counts invalid, or results/iteration_groups/skipped_points counts disagree with them
	ruleTimingInvalid      rule = "timing_invalid"              // timing block, timestamps or elapsed seconds invalid
	ruleProtocolInvalid    rule = "protocol_invalid"            // measurement_protocol not an object with schema_version 1
	ruleExecutionContract  rule = "execution_evidence_contract" // invalid execution_evidence contract, or warmup_evidence / benchmark_sample without one
	ruleWarmupEvidence     rule = "warmup_evidence"             // the warmup ledger or one of its records is invalid
	ruleDuplicateRank      rule = "duplicate_rank"              // two artefacts for the same rank

	// Every rank against the reference rank.
	ruleRunMismatch       rule = "run_mismatch"         // run_id differs
	ruleGridMismatch      rule = "grid_digest_mismatch" // grid_digest differs
	ruleDPSizeMismatch    rule = "dp_size_mismatch"     // dp.size differs
	ruleMissingRanks      rule = "missing_ranks"        // a rank of 0..dp.size-1 was not supplied (when every rank is required)
	ruleLegacyProtocolMix rule = "legacy_protocol_mix"  // some ranks have a measurement_protocol and others are legacy artefacts without one
	ruleProtocolMismatch  rule = "protocol_mismatch"    // measurement protocols differ
	ruleStatusMismatch    rule = "status_mismatch"      // status or stop_reason differs
	ruleCoverageMismatch  rule = "coverage_mismatch"    // coverage differs
	ruleEngineMismatch    rule = "engine_mismatch"      // startup engine blocks differ outside the excluded post-run fields and parallel.data_parallel_rank

	// The reference rank's iteration groups, point by point.
	ruleMissingIterationGroups     rule = "missing_iteration_groups"     // no iteration groups
	ruleBenchmarkID                rule = "benchmark_id"                 // benchmark_id not an integer >= 1, or the group's point names another id
	ruleDuplicateBenchmarkID       rule = "duplicate_benchmark_id"       // the same benchmark_id twice
	ruleGroupRanks                 rule = "group_ranks"                  // expected_dp_ranks or rank_results ranks are not 0..dp.size-1, or the group is not complete
	ruleRankPointFPM               rule = "rank_point_fpm"               // a rank-point lacks exactly one FPM with counter_id == benchmark_id, matching dp_rank and a finite wall_time >= 0
	ruleMeasurementWithoutProtocol rule = "measurement_without_protocol" // benchmark_measurement in a run without a measurement_protocol
	ruleMissingGroupEvidence       rule = "missing_group_evidence"       // a member of a synchronised group lacks benchmark_measurement (schema_version 1, its dp_rank)
	ruleMeasurementIdentity        rule = "measurement_identity"         // point_key empty or differing between the ranks of a point, or preparation.grid_digest not the run's
	ruleRawSamples                 rule = "raw_samples"                  // raw_fpms missing/empty/over expected_internal_samples, a retained benchmark_sample, or a raw sample of another point/rank/worker
	ruleSampleIndex                rule = "sample_index"                 // sample_index is not the sample's position in raw_fpms
	ruleForwardIndexOrder          rule = "forward_index_order"          // forward_index does not strictly increase within a rank
	ruleTimingMismatch             rule = "sample_timing"                // a raw sample's timing basis or interval contradicts its wall_time
	ruleCudagraphPadding           rule = "cudagraph"                    // observed: paddings != padded - unpadded or padded < unpadded; unavailable: a non-null value
	ruleEstimate                   rule = "estimate"                     // estimate method, raw_sample_indices or retained wall_time inconsistent
	ruleWarmupReference            rule = "warmup_reference"             // warmup_records_before invalid, or a counted warmup record overlaps the point's first raw sample
	ruleGroupWallTime              rule = "group_wall_time"              // group wall_time is not the maximum rank wall time, or that maximum is not positive (a step's latency is its slowest rank's)
	ruleNonContiguousBenchmarkIDs  rule = "non_contiguous_benchmark_ids" // ids are not 1..n

	// Every rank's copy of the groups, its timing, its own results.
	ruleIterationGroupsMismatch rule = "iteration_groups_mismatch"  // the rank's synchronised iteration groups differ from the reference rank's
	ruleMeasuredTime            rule = "measured_iteration_seconds" // measured_iteration_seconds is not the sum of group wall times, or exceeds elapsed
	ruleResultIDSet             rule = "result_id_set"              // results name another set of benchmark ids (or one twice)
	rulePointMismatch           rule = "point_mismatch"             // a result's point differs from its group's
	ruleLocalResultMismatch     rule = "local_result_mismatch"      // a rank's own FPM differs from its copy in the synchronised group
)

// rules lists every rule in check order.
var rules = []rule{
	RuleArtefactSize, RuleMalformedJSON, ruleSchemaVersion, ruleArtifactType, ruleMissingRunID, RuleRunID, ruleMissingGridDigest, ruleDPSize,
	ruleRankMismatch, ruleStatus, ruleCoverageArithmetic, ruleTimingInvalid, ruleProtocolInvalid,
	ruleExecutionContract, ruleWarmupEvidence, ruleDuplicateRank,
	ruleRunMismatch, ruleGridMismatch, ruleDPSizeMismatch, ruleMissingRanks, ruleLegacyProtocolMix,
	ruleProtocolMismatch, ruleStatusMismatch, ruleCoverageMismatch, ruleEngineMismatch,
	ruleMissingIterationGroups, ruleBenchmarkID, ruleDuplicateBenchmarkID, ruleGroupRanks, ruleRankPointFPM,
	ruleMeasurementWithoutProtocol, ruleMissingGroupEvidence, ruleMeasurementIdentity, ruleRawSamples,
	ruleSampleIndex, ruleForwardIndexOrder, ruleTimingMismatch, ruleCudagraphPadding, ruleEstimate,
	ruleWarmupReference, ruleGroupWallTime, ruleNonContiguousBenchmarkIDs,
	ruleIterationGroupsMismatch, ruleMeasuredTime, ruleResultIDSet, rulePointMismatch, ruleLocalResultMismatch,
}

// errRejected matches every *RejectError (errors.Is).
var errRejected = errors.New("merge: benchmark run rejected")

// RejectError is a merge that broke a rule. Nothing was written. Rank and Point are set when the rule
// concerns one rank or one benchmark point (Point is the benchmark_id in decimal).
type RejectError struct {
	RunID  string
	Rank   *int
	Point  string
	Rule   rule
	Detail string
	// File is the rank artefact's recorded path, when the rule concerns one rank file.
	File string
}

func (e *RejectError) Error() string {
	var b strings.Builder
	b.WriteString("merge: rejected")
	if e.RunID != "" {
		b.WriteString(" run ")
		b.WriteString(strconv.Quote(e.RunID))
	}
	if e.Rank != nil {
		b.WriteString(" rank ")
		b.WriteString(strconv.Itoa(*e.Rank))
	}
	if e.Point != "" {
		b.WriteString(" point ")
		b.WriteString(e.Point)
	}
	if e.File != "" {
		b.WriteString(" (")
		b.WriteString(e.File)
		b.WriteString(")")
	}
	b.WriteString(": rule ")
	b.WriteString(string(e.Rule))
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Is reports whether target is errRejected.
func (e *RejectError) Is(target error) bool { return target == errRejected }

// LogAttrs returns the error as slog key/value pairs: run_id, rank, point, rule, detail (and file).
func (e *RejectError) LogAttrs() []any {
	a := []any{"run_id", e.RunID}
	if e.Rank != nil {
		a = append(a, "rank", *e.Rank)
	} else {
		a = append(a, "rank", nil)
	}
	a = append(a, "point", e.Point, "rule", string(e.Rule), "detail", e.Detail)
	if e.File != "" {
		a = append(a, "file", e.File)
	}
	return a
}

func intp(v int) *int { return &v }

func pointName(id int64) string { return strconv.FormatInt(id, 10) }
