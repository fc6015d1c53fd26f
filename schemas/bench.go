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

	// Resolution values. Artefacts keep ResolutionPending; probe results use the others, or a failure
	// string that starts with ResolutionFailedPrefix or ResolutionSkippedPrefix.
	ResolutionPending       = "pending_worker_probe"
	ResolutionPreResolution = "pre_resolution"
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

// BenchRankArtifact is a typed view of one rank's self-benchmark artefact (artifact_type "rank").
type BenchRankArtifact struct {
	SchemaVersion   int                   `json:"schema_version"`
	ArtifactType    string                `json:"artifact_type,omitempty"`
	Status          string                `json:"status,omitempty"` // complete | partial
	Valid           *bool                 `json:"valid"`
	Usable          *bool                 `json:"usable,omitempty"`
	StopReason      *string               `json:"stop_reason"`
	Error           json.RawMessage       `json:"error,omitempty"`
	RunID           string                `json:"run_id"`
	GridDigest      string                `json:"grid_digest"`
	Timing          BenchTiming           `json:"timing"`
	DP              BenchRankDP           `json:"dp"`
	Coverage        BenchCoverage         `json:"coverage"`
	Results         []BenchResult         `json:"results"`
	IterationGroups []BenchIterationGroup `json:"iteration_groups"`
	SkippedPoints   []json.RawMessage     `json:"skipped_points"`
	MissingPhases   []json.RawMessage     `json:"missing_phases,omitempty"`
	// Limits holds rank-varying engine data (num_gpu_blocks, max_model_len).
	Limits              json.RawMessage      `json:"limits,omitempty"`
	Engine              *BenchEngine         `json:"engine,omitempty"`
	MeasurementProtocol *MeasurementProtocol `json:"measurement_protocol,omitempty"`
	WarmupEvidence      *WarmupEvidence      `json:"warmup_evidence,omitempty"`
}

// BenchMergedArtifact is a typed view of a merged artefact (artifact_type "merged"). It carries the
// reference rank's other fields unchanged.
type BenchMergedArtifact struct {
	SchemaVersion       int                       `json:"schema_version"`
	ArtifactType        string                    `json:"artifact_type"`
	Status              string                    `json:"status,omitempty"`
	RunID               string                    `json:"run_id"`
	GridDigest          string                    `json:"grid_digest"`
	Timing              BenchTiming               `json:"timing"`
	DP                  BenchMergedDP             `json:"dp"`
	Coverage            BenchCoverage             `json:"coverage"`
	RankFiles           []string                  `json:"rank_files"`
	MergedOutputPath    string                    `json:"merged_output_path"`
	WorkerProbePath     string                    `json:"worker_probe_path,omitempty"`
	Results             []BenchResult             `json:"results"`
	IterationGroups     []BenchIterationGroup     `json:"iteration_groups"`
	SkippedPoints       []json.RawMessage         `json:"skipped_points"`
	Engine              *BenchEngine              `json:"engine,omitempty"`
	MeasurementProtocol *MeasurementProtocol      `json:"measurement_protocol,omitempty"`
	RankWarmupEvidence  map[string]WarmupEvidence `json:"rank_warmup_evidence,omitempty"`
}

// BenchTiming is an artefact's timing block. A merged artefact takes the slowest rank's block, with
// benchmark_elapsed_seconds the maximum over ranks, measured_iteration_seconds the sum of the group wall
// times, and rank_benchmark_elapsed_seconds per rank.
type BenchTiming struct {
	StartedAt                   string             `json:"started_at"`
	CompletedAt                 string             `json:"completed_at"`
	BenchmarkElapsedSeconds     float64            `json:"benchmark_elapsed_seconds"`
	MeasuredIterationSeconds    float64            `json:"measured_iteration_seconds"`
	RankBenchmarkElapsedSeconds map[string]float64 `json:"rank_benchmark_elapsed_seconds,omitempty"`
}

// BenchRankDP is a rank artefact's dp block.
type BenchRankDP struct {
	Rank int `json:"rank"`
	Size int `json:"size"`
}

// BenchMergedDP is a merged artefact's dp block.
type BenchMergedDP struct {
	Ranks       []int `json:"ranks"`        // 0..global_size-1
	SourceRanks []int `json:"source_ranks"` // the ranks whose artefacts were merged
	ManagedSize int   `json:"managed_size"` // len(source_ranks)
	GlobalSize  int   `json:"global_size"`
}

// BenchCoverage counts benchmark points (per rank in a rank artefact, times global_size when merged).
type BenchCoverage struct {
	ExpectedPoints  int `json:"expected_points"`
	CompletedPoints int `json:"completed_points"`
	SkippedPoints   int `json:"skipped_points"`
}

// BenchResult is one retained point: in a rank artefact that rank's own FPM; flattened per
// (benchmark_id, rank) in a merged artefact, where point carries dp_rank.
type BenchResult struct {
	Point        json.RawMessage `json:"point"` // has benchmark_id; free-form coordinates
	FPMs         []BenchFPM      `json:"fpms"`
	KVSeedRegime json.RawMessage `json:"kv_seed_regime,omitempty"`
}

// BenchIterationGroup is one synchronised benchmark iteration across every DP rank of the run.
type BenchIterationGroup struct {
	BenchmarkID     int               `json:"benchmark_id"`
	Point           json.RawMessage   `json:"point"`
	ExpectedDPRanks []int             `json:"expected_dp_ranks"`
	Complete        bool              `json:"complete"`
	WallTime        float64           `json:"wall_time"` // the maximum rank wall time: the point's latency
	RankResults     []BenchRankResult `json:"rank_results"`
}

// BenchRankResult is one rank's FPM in an iteration group.
type BenchRankResult struct {
	DPRank int        `json:"dp_rank"`
	FPMs   []BenchFPM `json:"fpms"`
}

// BenchFPM is a retained or raw ForwardPassMetrics in a benchmark artefact: counter_id is the benchmark
// point id. The scheduled/queued request blocks are kept raw.
type BenchFPM struct {
	Version              int                   `json:"version,omitempty"`
	WorkerID             string                `json:"worker_id,omitempty"`
	DPRank               int                   `json:"dp_rank"`
	CounterID            int                   `json:"counter_id"`
	WallTime             float64               `json:"wall_time"`
	ScheduledRequests    json.RawMessage       `json:"scheduled_requests,omitempty"`
	QueuedRequests       json.RawMessage       `json:"queued_requests,omitempty"`
	BenchmarkMeasurement *BenchmarkMeasurement `json:"benchmark_measurement,omitempty"` // retained FPMs only
	BenchmarkSample      *BenchmarkSample      `json:"benchmark_sample,omitempty"`      // raw FPMs only
}

// MeasurementProtocol is the shared top-level measurement_protocol block; every rank of a run must
// record an identical one.
type MeasurementProtocol struct {
	SchemaVersion          int                        `json:"schema_version"`
	ContentIdentity        string                     `json:"content_identity"` // coordinate_rank_slot_v1
	ContentSeed            string                     `json:"content_seed"`
	SyntheticContent       string                     `json:"synthetic_content"`
	SyntheticPoolTag       string                     `json:"synthetic_pool_tag"`
	PromptHashEncoding     string                     `json:"prompt_hash_encoding"`    // uint32_le
	IndependentRepetitions int                        `json:"independent_repetitions"` // 1
	TimingMetric           string                     `json:"timing_metric"`           // scheduler_wall_time
	ExecutionEvidence      *ExecutionEvidenceContract `json:"execution_evidence,omitempty"`
	InputEvidenceScope     string                     `json:"input_evidence_scope"` // injected_prompt_token_ids
	Unobserved             []string                   `json:"unobserved"`
	Preparation            json.RawMessage            `json:"preparation"`
}

// ExecutionEvidenceContract declares the per-sample and warmup evidence fields.
type ExecutionEvidenceContract struct {
	SchemaVersion     int    `json:"schema_version"` // 1
	SampleField       string `json:"sample_field"`   // benchmark_sample
	WarmupField       string `json:"warmup_field"`   // warmup_evidence
	ForwardIndexScope string `json:"forward_index_scope,omitempty"`
	TimingClock       string `json:"timing_clock,omitempty"`
	CudagraphSource   string `json:"cudagraph_source,omitempty"`
}

// BenchmarkMeasurement is the benchmark_measurement block of a retained FPM.
type BenchmarkMeasurement struct {
	SchemaVersion           int                    `json:"schema_version"`
	PointKey                string                 `json:"point_key"`
	DPRank                  int                    `json:"dp_rank"`
	Prompts                 BenchPrompts           `json:"prompts"`
	Preparation             MeasurementPreparation `json:"preparation"`
	ExpectedInternalSamples int                    `json:"expected_internal_samples"`
	RawFPMs                 []BenchFPM             `json:"raw_fpms"`
	Estimate                BenchEstimate          `json:"estimate"`
}

// BenchPrompts is the prompt evidence of one rank-point.
type BenchPrompts struct {
	Status   string            `json:"status"` // recorded | unavailable
	SHA256   *string           `json:"sha256"`
	Requests []json.RawMessage `json:"requests"`
}

// MeasurementPreparation is the per-point preparation evidence.
type MeasurementPreparation struct {
	GridDigest            string          `json:"grid_digest"`
	CompletedPointsBefore *int            `json:"completed_points_before,omitempty"`
	KVSeedRegime          json.RawMessage `json:"kv_seed_regime,omitempty"`
	WarmupRecordsBefore   *int            `json:"warmup_records_before,omitempty"`
}

// BenchEstimate names the reduction of raw samples to the retained FPM.
type BenchEstimate struct {
	Method           string `json:"method"` // single_step | last_step | adjacent_upper_median
	RawSampleIndices []int  `json:"raw_sample_indices"`
}

// BenchmarkSample is the execution evidence of one raw FPM.
type BenchmarkSample struct {
	SampleIndex  int             `json:"sample_index"`  // position in raw_fpms
	ForwardIndex int             `json:"forward_index"` // strictly increasing per rank
	Timing       SampleTiming    `json:"timing"`
	Cudagraph    SampleCudagraph `json:"cudagraph"`
}

// SampleTiming is a raw sample's interval in the rank's process-local monotonic clock.
type SampleTiming struct {
	Basis          string   `json:"basis"` // schedule_to_output | inter_output
	StartMonotonic *float64 `json:"start_monotonic"`
	EndMonotonic   float64  `json:"end_monotonic"`
}

// SampleCudagraph is a raw sample's observed graph dispatch; all null when status is unavailable.
type SampleCudagraph struct {
	Status            string  `json:"status"` // observed | unavailable
	RuntimeMode       *string `json:"runtime_mode"`
	NumUnpaddedTokens *int    `json:"num_unpadded_tokens"`
	NumPaddedTokens   *int    `json:"num_padded_tokens"`
	NumPaddings       *int    `json:"num_paddings"`
}

// WarmupEvidence is a rank's warmup ledger (warmup_evidence; rank_warmup_evidence[rank] when merged).
type WarmupEvidence struct {
	Status  string         `json:"status"` // recorded | unavailable
	Records []WarmupRecord `json:"records"`
	Reason  string         `json:"reason,omitempty"` // rank_artifact_not_loaded in a merged artefact
}

// WarmupRecord is one warmup attempt.
type WarmupRecord struct {
	Kind                   string           `json:"kind"` // global | eager_shape | real_prefix_seed | real_prefix_shape
	RequestedShape         json.RawMessage  `json:"requested_shape"`
	Status                 string           `json:"status"` // running | completed | failed
	ForwardIndexStart      *int             `json:"forward_index_start"`
	ForwardIndexEnd        *int             `json:"forward_index_end"` // exclusive
	CompletedPointsBefore  *int             `json:"completed_points_before,omitempty"`
	ObservedForwardCount   *int             `json:"observed_forward_count"`
	FirstScheduledRequests json.RawMessage  `json:"first_scheduled_requests"`
	LastScheduledRequests  json.RawMessage  `json:"last_scheduled_requests"`
	Validation             WarmupValidation `json:"validation"`
}

// WarmupValidation is a warmup record's shape validation.
type WarmupValidation struct {
	Status       string  `json:"status"` // not_performed | passed | failed
	Reason       *string `json:"reason,omitempty"`
	Scope        *string `json:"scope,omitempty"` // attention_dp_group
	FailedDPRank *int    `json:"failed_dp_rank,omitempty"`
}

// BenchEngine is the startup engine block (engine) of an artefact. A merged copy sets
// parallel.data_parallel_rank to null and may add capture_errors.
type BenchEngine struct {
	Attention    *EngineAttention   `json:"attention,omitempty"`
	KVCache      json.RawMessage    `json:"kv_cache,omitempty"`
	Quantization json.RawMessage    `json:"quantization,omitempty"`
	Scheduler    json.RawMessage    `json:"scheduler,omitempty"`
	Model        json.RawMessage    `json:"model,omitempty"`
	Parallel     *EngineParallel    `json:"parallel,omitempty"`
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

// EngineAttention is the requested attention configuration; the *_resolved fields stay null and
// resolution "pending_worker_probe" in artefacts.
type EngineAttention struct {
	BackendRequested           *string         `json:"backend_requested"`
	BackendPerKind             json.RawMessage `json:"backend_per_kind,omitempty"`
	MLAPrefillBackendRequested *string         `json:"mla_prefill_backend_requested"`
	BackendResolved            *string         `json:"backend_resolved"`
	MLAPrefillBackendResolved  *string         `json:"mla_prefill_backend_resolved"`
	Resolution                 *string         `json:"resolution"`
}

// EngineParallel is the parallel topology; tensor, pipeline and prefill-context sizes give a probe's
// expected workers per DP rank.
type EngineParallel struct {
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
	Merged           ProbeResult            `json:"merged"`
	Ranks            map[string]ProbeResult `json:"ranks"` // keyed by DP rank
}

// ProbeResult is the probe outcome for the workers of one artefact (every DP rank for merged, one rank
// for an entry of ranks).
type ProbeResult struct {
	RankFile      string          `json:"rank_file,omitempty"` // entries of ranks only
	Resolved      json.RawMessage `json:"resolved"`            // one in-scope reply, or null
	ResolvedScope *string         `json:"resolved_scope"`      // representative_worker, or null
	Resolution    string          `json:"resolution"`
	WorkerProbe   WorkerProbe     `json:"worker_probe"`
	Attention     *ProbeAttention `json:"attention,omitempty"` // when the engine block has attention
}

// WorkerProbe keeps every returned reply and the coverage they establish.
type WorkerProbe struct {
	SchemaVersion int             `json:"schema_version"` // 1
	Scope         string          `json:"scope"`          // post_collection_collective_rpc
	Responses     []ProbeResponse `json:"responses"`
	Coverage      ProbeCoverage   `json:"coverage"`
	Disagreements []string        `json:"disagreements"`
	Error         *string         `json:"error"`
}

// ProbeResponse is one reply as returned, with its validation issues.
type ProbeResponse struct {
	RPCIndex int             `json:"rpc_index"`
	Response json.RawMessage `json:"response"`
	Issues   []string        `json:"issues"`
}

// ProbeCoverage says which workers the replies cover.
type ProbeCoverage struct {
	Scope                string                `json:"scope"` // artifact_workers
	ExpectedDPRanks      []int                 `json:"expected_dp_ranks"`
	ExpectedWorkersPerDP *int                  `json:"expected_workers_per_dp"`
	ObservedWorkers      []ProbeObservedWorker `json:"observed_workers"`
	MissingDPRanks       []int                 `json:"missing_dp_ranks"`
	Complete             bool                  `json:"complete"`
}

// ProbeObservedWorker is the identity of one valid, unique in-scope reply.
type ProbeObservedWorker struct {
	DPRank     *int `json:"dp_rank"`
	WorkerRank *int `json:"worker_rank"`
	TPRank     *int `json:"tp_rank"`
	PPRank     *int `json:"pp_rank"`
	PCPRank    *int `json:"pcp_rank"`
}

// ProbeAttention summarises the resolved attention backends of the in-scope replies.
type ProbeAttention struct {
	BackendResolved           *string `json:"backend_resolved"`
	MLAPrefillBackendResolved *string `json:"mla_prefill_backend_resolved"`
	Resolution                string  `json:"resolution"`
}

// WorkerProbeReply is one model worker's reply to fpm_engine_probe.
type WorkerProbeReply struct {
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

// DecodeBenchTyped decodes a benchmark document into one of the typed views above (for example
// *BenchRankArtifact or *WorkerProbeSidecar). Unknown fields are ignored; use ParseBenchJSON to keep them.
func DecodeBenchTyped(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("schemas: decode benchmark document: %w", err)
	}
	return nil
}
