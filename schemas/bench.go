package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Dynamo self-benchmark artefacts (vLLM --benchmark-mode): one rank artefact per data-parallel rank, the
// merged artefact fpmbus builds from them, and the worker-probe sidecar written next to the merged one.
// The formats follow Dynamo's worker_factory.py and Dynamo's FPM trace reference ("Measurement Protocol
// in the Self-Benchmark Artifact" through "Worker Probe Coverage"). The JSON Schema documents are
// jsonschema/bench-*.schema.json.
//
// The structs below are typed views of the fields fpmbus reads or writes; they are not the storage format
// of a merge (see BenchNode), and decoding into them drops unknown fields. Nullable fields are pointers or
// json.RawMessage. Free-form producer data (a point's coordinates, a requested shape) is json.RawMessage.

// Constants of the benchmark formats.
const (
	// BenchArtifactSchemaVersion is the schema_version of rank and merged artefacts (it stays 2 when the
	// measurement, warmup and engine blocks are present; those blocks carry their own versions).
	BenchArtifactSchemaVersion = 2
	BenchArtifactRank          = "rank"
	BenchArtifactMerged        = "merged"

	// MeasurementSchemaVersion is the schema_version of measurement_protocol, benchmark_measurement and
	// measurement_protocol.execution_evidence.
	MeasurementSchemaVersion = 1

	BenchStatusComplete = "complete"
	BenchStatusPartial  = "partial"

	WorkerProbeSchema        = "dynamo.fpm.benchmark_worker_probe"
	WorkerProbeSchemaVersion = 1
	WorkerProbeScope         = "post_collection_collective_rpc"
	WorkerProbeCoverageScope = "artifact_workers"
	// ResolvedScopeRepresentative labels a probe result's resolved reply.
	ResolvedScopeRepresentative = "representative_worker"

	// Resolution values. Artefacts keep resolutionPending; probe results use the others, or a failure
	// string that starts with ResolutionFailedPrefix or ResolutionSkippedPrefix.
	resolutionPending       = "pending_worker_probe"
	resolutionPreResolution = "pre_resolution"
	ResolutionProbe         = "worker_probe"
	ResolutionPartial       = "worker_probe_partial"
	ResolutionMixed         = "worker_probe_mixed"
	ResolutionUnobserved    = "worker_probe_unobserved"
	ResolutionFailedPrefix  = "probe_failed: "
	ResolutionSkippedPrefix = "probe_skipped: "

	// WarmupUnavailableReasonNotLoaded is the reason of the unavailable ledger a merged artefact records
	// under rank_warmup_evidence for a rank whose artefact was not loaded.
	WarmupUnavailableReasonNotLoaded = "rank_artifact_not_loaded"
	// EngineMissingBlock is the capture_errors value of a rank without an engine block.
	EngineMissingBlock = "missing engine block"
)

// benchRankArtifact is a typed view of one rank's self-benchmark artefact (artifact_type "rank").
type benchRankArtifact struct {
	SchemaVersion   int                   `json:"schema_version"`
	ArtifactType    string                `json:"artifact_type,omitempty"`
	Status          string                `json:"status,omitempty"` // complete | partial
	Valid           *bool                 `json:"valid"`
	Usable          *bool                 `json:"usable,omitempty"`
	StopReason      *string               `json:"stop_reason"`
	Error           json.RawMessage       `json:"error,omitempty"`
	RunID           string                `json:"run_id"`
	GridDigest      string                `json:"grid_digest"`
	Timing          benchTiming           `json:"timing"`
	DP              benchRankDP           `json:"dp"`
	Coverage        benchCoverage         `json:"coverage"`
	Results         []benchResult         `json:"results"`
	IterationGroups []benchIterationGroup `json:"iteration_groups"`
	SkippedPoints   []json.RawMessage     `json:"skipped_points"`
	MissingPhases   []json.RawMessage     `json:"missing_phases,omitempty"`
	// Limits holds rank-varying engine data (num_gpu_blocks, max_model_len).
	Limits              json.RawMessage      `json:"limits,omitempty"`
	Engine              *benchEngine         `json:"engine,omitempty"`
	MeasurementProtocol *measurementProtocol `json:"measurement_protocol,omitempty"`
	WarmupEvidence      *warmupEvidence      `json:"warmup_evidence,omitempty"`
}

// benchMergedArtifact is a typed view of a merged artefact (artifact_type "merged"). It carries the
// reference rank's other fields unchanged.
type benchMergedArtifact struct {
	SchemaVersion       int                       `json:"schema_version"`
	ArtifactType        string                    `json:"artifact_type"`
	Status              string                    `json:"status,omitempty"`
	RunID               string                    `json:"run_id"`
	GridDigest          string                    `json:"grid_digest"`
	Timing              benchTiming               `json:"timing"`
	DP                  benchMergedDP             `json:"dp"`
	Coverage            benchCoverage             `json:"coverage"`
	RankFiles           []string                  `json:"rank_files"`
	MergedOutputPath    string                    `json:"merged_output_path"`
	WorkerProbePath     string                    `json:"worker_probe_path,omitempty"`
	Results             []benchResult             `json:"results"`
	IterationGroups     []benchIterationGroup     `json:"iteration_groups"`
	SkippedPoints       []json.RawMessage         `json:"skipped_points"`
	Engine              *benchEngine              `json:"engine,omitempty"`
	MeasurementProtocol *measurementProtocol      `json:"measurement_protocol,omitempty"`
	RankWarmupEvidence  map[string]warmupEvidence `json:"rank_warmup_evidence,omitempty"`
}

// benchTiming is an artefact's timing block. A merged artefact takes the slowest rank's block, with
// benchmark_elapsed_seconds the maximum over ranks, measured_iteration_seconds the sum of the group wall
// times, and rank_benchmark_elapsed_seconds per rank.
type benchTiming struct {
	StartedAt                   string             `json:"started_at"`
	CompletedAt                 string             `json:"completed_at"`
	BenchmarkElapsedSeconds     float64            `json:"benchmark_elapsed_seconds"`
	MeasuredIterationSeconds    float64            `json:"measured_iteration_seconds"`
	RankBenchmarkElapsedSeconds map[string]float64 `json:"rank_benchmark_elapsed_seconds,omitempty"`
}

// benchRankDP is a rank artefact's dp block.
type benchRankDP struct {
	Rank int `json:"rank"`
	Size int `json:"size"`
}

// benchMergedDP is a merged artefact's dp block.
type benchMergedDP struct {
	Ranks       []int `json:"ranks"`        // 0..global_size-1
	SourceRanks []int `json:"source_ranks"` // the ranks whose artefacts were merged
	ManagedSize int   `json:"managed_size"` // len(source_ranks)
	GlobalSize  int   `json:"global_size"`
}

// benchCoverage counts benchmark points (per rank in a rank artefact, times global_size when merged).
type benchCoverage struct {
	ExpectedPoints  int `json:"expected_points"`
	CompletedPoints int `json:"completed_points"`
	SkippedPoints   int `json:"skipped_points"`
}

// benchResult is one retained point: in a rank artefact that rank's own FPM; flattened per
// (benchmark_id, rank) in a merged artefact, where point carries dp_rank.
type benchResult struct {
	Point        json.RawMessage `json:"point"` // has benchmark_id; free-form coordinates
	FPMs         []benchFPM      `json:"fpms"`
	KVSeedRegime json.RawMessage `json:"kv_seed_regime,omitempty"`
}

// benchIterationGroup is one synchronised benchmark iteration across every DP rank of the run.
type benchIterationGroup struct {
	BenchmarkID     int               `json:"benchmark_id"`
	Point           json.RawMessage   `json:"point"`
	ExpectedDPRanks []int             `json:"expected_dp_ranks"`
	Complete        bool              `json:"complete"`
	WallTime        float64           `json:"wall_time"` // the maximum rank wall time: the point's latency
	RankResults     []benchRankResult `json:"rank_results"`
}

// benchRankResult is one rank's FPM in an iteration group.
type benchRankResult struct {
	DPRank int        `json:"dp_rank"`
	FPMs   []benchFPM `json:"fpms"`
}

// benchFPM is a retained or raw ForwardPassMetrics in a benchmark artefact: counter_id is the benchmark
// point id. The scheduled/queued request blocks are kept raw.
type benchFPM struct {
	Version              int                   `json:"version,omitempty"`
	WorkerID             string                `json:"worker_id,omitempty"`
	DPRank               int                   `json:"dp_rank"`
	CounterID            int                   `json:"counter_id"`
	WallTime             float64               `json:"wall_time"`
	ScheduledRequests    json.RawMessage       `json:"scheduled_requests,omitempty"`
	QueuedRequests       json.RawMessage       `json:"queued_requests,omitempty"`
	BenchmarkMeasurement *benchmarkMeasurement `json:"benchmark_measurement,omitempty"` // retained FPMs only
	BenchmarkSample      *benchmarkSample      `json:"benchmark_sample,omitempty"`      // raw FPMs only
}

// measurementProtocol is the shared top-level measurement_protocol block; every rank of a run must
// record an identical one.
type measurementProtocol struct {
	SchemaVersion          int                        `json:"schema_version"`
	ContentIdentity        string                     `json:"content_identity"` // coordinate_rank_slot_v1
	ContentSeed            string                     `json:"content_seed"`
	SyntheticContent       string                     `json:"synthetic_content"`
	SyntheticPoolTag       string                     `json:"synthetic_pool_tag"`
	PromptHashEncoding     string                     `json:"prompt_hash_encoding"`    // uint32_le
	IndependentRepetitions int                        `json:"independent_repetitions"` // 1
	TimingMetric           string                     `json:"timing_metric"`           // scheduler_wall_time
	ExecutionEvidence      *executionEvidenceContract `json:"execution_evidence,omitempty"`
	InputEvidenceScope     string                     `json:"input_evidence_scope"` // injected_prompt_token_ids
	Unobserved             []string                   `json:"unobserved"`
	Preparation            json.RawMessage            `json:"preparation"`
}

// executionEvidenceContract declares the per-sample and warmup evidence fields.
type executionEvidenceContract struct {
	SchemaVersion     int    `json:"schema_version"` // 1
	SampleField       string `json:"sample_field"`   // benchmark_sample
	WarmupField       string `json:"warmup_field"`   // warmup_evidence
	ForwardIndexScope string `json:"forward_index_scope,omitempty"`
	TimingClock       string `json:"timing_clock,omitempty"`
	CudagraphSource   string `json:"cudagraph_source,omitempty"`
}

// benchmarkMeasurement is the benchmark_measurement block of a retained FPM.
type benchmarkMeasurement struct {
	SchemaVersion           int                    `json:"schema_version"`
	PointKey                string                 `json:"point_key"`
	DPRank                  int                    `json:"dp_rank"`
	Prompts                 benchPrompts           `json:"prompts"`
	Preparation             measurementPreparation `json:"preparation"`
	ExpectedInternalSamples int                    `json:"expected_internal_samples"`
	RawFPMs                 []benchFPM             `json:"raw_fpms"`
	Estimate                benchEstimate          `json:"estimate"`
}

// benchPrompts is the prompt evidence of one rank-point.
type benchPrompts struct {
	Status   string            `json:"status"` // recorded | unavailable
	SHA256   *string           `json:"sha256"`
	Requests []json.RawMessage `json:"requests"`
}

// measurementPreparation is the per-point preparation evidence.
type measurementPreparation struct {
	GridDigest            string          `json:"grid_digest"`
	CompletedPointsBefore *int            `json:"completed_points_before,omitempty"`
	KVSeedRegime          json.RawMessage `json:"kv_seed_regime,omitempty"`
	WarmupRecordsBefore   *int            `json:"warmup_records_before,omitempty"`
}

// benchEstimate names the reduction of raw samples to the retained FPM.
type benchEstimate struct {
	Method           string `json:"method"` // single_step | last_step | adjacent_upper_median
	RawSampleIndices []int  `json:"raw_sample_indices"`
}

// benchmarkSample is the execution evidence of one raw FPM.
type benchmarkSample struct {
	SampleIndex  int             `json:"sample_index"`  // position in raw_fpms
	ForwardIndex int             `json:"forward_index"` // strictly increasing per rank
	Timing       sampleTiming    `json:"timing"`
	Cudagraph    sampleCudagraph `json:"cudagraph"`
}

// sampleTiming is a raw sample's interval in the rank's process-local monotonic clock.
type sampleTiming struct {
	Basis          string   `json:"basis"` // schedule_to_output | inter_output
	StartMonotonic *float64 `json:"start_monotonic"`
	EndMonotonic   float64  `json:"end_monotonic"`
}

// sampleCudagraph is a raw sample's observed graph dispatch; all null when status is unavailable.
type sampleCudagraph struct {
	Status            string  `json:"status"` // observed | unavailable
	RuntimeMode       *string `json:"runtime_mode"`
	NumUnpaddedTokens *int    `json:"num_unpadded_tokens"`
	NumPaddedTokens   *int    `json:"num_padded_tokens"`
	NumPaddings       *int    `json:"num_paddings"`
}

// warmupEvidence is a rank's warmup ledger (warmup_evidence; rank_warmup_evidence[rank] when merged).
type warmupEvidence struct {
	Status  string         `json:"status"` // recorded | unavailable
	Records []warmupRecord `json:"records"`
	Reason  string         `json:"reason,omitempty"` // rank_artifact_not_loaded in a merged artefact
}

// warmupRecord is one warmup attempt.
type warmupRecord struct {
	Kind                   string           `json:"kind"` // global | eager_shape | real_prefix_seed | real_prefix_shape
	RequestedShape         json.RawMessage  `json:"requested_shape"`
	Status                 string           `json:"status"` // running | completed | failed
	ForwardIndexStart      *int             `json:"forward_index_start"`
	ForwardIndexEnd        *int             `json:"forward_index_end"` // exclusive
	CompletedPointsBefore  *int             `json:"completed_points_before,omitempty"`
	ObservedForwardCount   *int             `json:"observed_forward_count"`
	FirstScheduledRequests json.RawMessage  `json:"first_scheduled_requests"`
	LastScheduledRequests  json.RawMessage  `json:"last_scheduled_requests"`
	Validation             warmupValidation `json:"validation"`
}

// warmupValidation is a warmup record's shape validation.
type warmupValidation struct {
	Status       string  `json:"status"` // not_performed | passed | failed
	Reason       *string `json:"reason,omitempty"`
	Scope        *string `json:"scope,omitempty"` // attention_dp_group
	FailedDPRank *int    `json:"failed_dp_rank,omitempty"`
}

// benchEngine is the startup engine block (engine) of an artefact. A merged copy sets
// parallel.data_parallel_rank to null and may add capture_errors.
type benchEngine struct {
	Attention    *engineAttention   `json:"attention,omitempty"`
	KVCache      json.RawMessage    `json:"kv_cache,omitempty"`
	Quantization json.RawMessage    `json:"quantization,omitempty"`
	Scheduler    json.RawMessage    `json:"scheduler,omitempty"`
	Model        json.RawMessage    `json:"model,omitempty"`
	Parallel     *engineParallel    `json:"parallel,omitempty"`
	Speculative  json.RawMessage    `json:"speculative,omitempty"`
	Graph        json.RawMessage    `json:"graph,omitempty"`
	Versions     map[string]*string `json:"versions,omitempty"`
	Resolved     json.RawMessage    `json:"resolved,omitempty"`
	Resolution   *string            `json:"resolution,omitempty"`
	// CaptureError is present only when the capture raised partway.
	CaptureError json.RawMessage `json:"capture_error,omitempty"`
	// CaptureErrors (merged only) maps a degraded rank to its capture error or "missing engine block".
	CaptureErrors map[string]string `json:"capture_errors,omitempty"`
}

// engineAttention is the requested attention configuration; the *_resolved fields stay null and
// resolution "pending_worker_probe" in artefacts.
type engineAttention struct {
	BackendRequested           *string         `json:"backend_requested"`
	BackendPerKind             json.RawMessage `json:"backend_per_kind,omitempty"`
	MLAPrefillBackendRequested *string         `json:"mla_prefill_backend_requested"`
	BackendResolved            *string         `json:"backend_resolved"`
	MLAPrefillBackendResolved  *string         `json:"mla_prefill_backend_resolved"`
	Resolution                 *string         `json:"resolution"`
}

// engineParallel is the parallel topology; tensor, pipeline and prefill-context sizes give a probe's
// expected workers per DP rank.
type engineParallel struct {
	DataParallelSize           *int `json:"data_parallel_size,omitempty"`
	DataParallelRank           *int `json:"data_parallel_rank"`
	TensorParallelSize         *int `json:"tensor_parallel_size,omitempty"`
	PipelineParallelSize       *int `json:"pipeline_parallel_size,omitempty"`
	PrefillContextParallelSize *int `json:"prefill_context_parallel_size,omitempty"`
}

// WorkerProbeSidecar is the dynamo.fpm.benchmark_worker_probe document written next to a merged artefact
// (<merged stem>_worker_probe<ext>).
type WorkerProbeSidecar struct {
	Schema           string                 `json:"schema"`         // dynamo.fpm.benchmark_worker_probe
	SchemaVersion    int                    `json:"schema_version"` // 1
	RunID            string                 `json:"run_id"`         // the merged artefact's run_id
	MergedOutputPath string                 `json:"merged_output_path"`
	RankFiles        []string               `json:"rank_files"`
	Merged           probeResult            `json:"merged"`
	Ranks            map[string]probeResult `json:"ranks"` // keyed by DP rank
}

// probeResult is the probe outcome for the workers of one artefact (every DP rank for merged, one rank
// for an entry of ranks).
type probeResult struct {
	RankFile      string          `json:"rank_file,omitempty"` // entries of ranks only
	Resolved      json.RawMessage `json:"resolved"`            // one in-scope reply, or null
	ResolvedScope *string         `json:"resolved_scope"`      // representative_worker, or null
	Resolution    string          `json:"resolution"`
	WorkerProbe   workerProbe     `json:"worker_probe"`
	Attention     *probeAttention `json:"attention,omitempty"` // when the engine block has attention
}

// workerProbe keeps every returned reply and the coverage they establish.
type workerProbe struct {
	SchemaVersion int             `json:"schema_version"` // 1
	Scope         string          `json:"scope"`          // post_collection_collective_rpc
	Responses     []probeResponse `json:"responses"`
	Coverage      probeCoverage   `json:"coverage"`
	Disagreements []string        `json:"disagreements"`
	Error         *string         `json:"error"`
}

// probeResponse is one reply as returned, with its validation issues.
type probeResponse struct {
	RPCIndex int             `json:"rpc_index"`
	Response json.RawMessage `json:"response"`
	Issues   []string        `json:"issues"`
}

// probeCoverage says which workers the replies cover.
type probeCoverage struct {
	Scope                string                `json:"scope"` // artifact_workers
	ExpectedDPRanks      []int                 `json:"expected_dp_ranks"`
	ExpectedWorkersPerDP *int                  `json:"expected_workers_per_dp"`
	ObservedWorkers      []probeObservedWorker `json:"observed_workers"`
	MissingDPRanks       []int                 `json:"missing_dp_ranks"`
	Complete             bool                  `json:"complete"`
}

// probeObservedWorker is the identity of one valid, unique in-scope reply.
type probeObservedWorker struct {
	DPRank     *int `json:"dp_rank"`
	WorkerRank *int `json:"worker_rank"`
	TPRank     *int `json:"tp_rank"`
	PPRank     *int `json:"pp_rank"`
	PCPRank    *int `json:"pcp_rank"`
}

// probeAttention summarises the resolved attention backends of the in-scope replies.
type probeAttention struct {
	BackendResolved           *string `json:"backend_resolved"`
	MLAPrefillBackendResolved *string `json:"mla_prefill_backend_resolved"`
	Resolution                string  `json:"resolution"`
}

// workerProbeReply is one model worker's reply to fpm_engine_probe.
type workerProbeReply struct {
	TPRank                        *int              `json:"tp_rank"`
	PPRank                        *int              `json:"pp_rank"`
	PCPRank                       *int              `json:"pcp_rank"`
	WorkerRank                    *int              `json:"worker_rank"`
	DPRank                        *int              `json:"dp_rank"`
	AttentionBackends             map[string]string `json:"attention_backends"`
	MLAPrefillBackend             *string           `json:"mla_prefill_backend"`
	CudagraphModeResolved         *string           `json:"cudagraph_mode_resolved"`
	CudagraphCaptureSizesResolved []int             `json:"cudagraph_capture_sizes_resolved"`
	CaptureErrors                 map[string]string `json:"capture_errors"`
}

// decodeBenchTyped decodes a benchmark document into one of the typed views above (for example
// *benchRankArtifact or *WorkerProbeSidecar). Unknown fields are ignored; use ParseBenchJSON to keep them.
func decodeBenchTyped(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("schemas: decode benchmark document: %w", err)
	}
	return nil
}
