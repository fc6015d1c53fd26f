package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

// The generator builds rank artefacts shaped like Dynamo's: the fields, nesting and key order of
// worker_factory.py's rank files and the measurement protocol's blocks, with deterministic values.
// Golden inputs under testdata/golden are written by it (go test -run TestBenchGolden -update), the rule
// table mutates its output, and the size measurement uses it at 8 ranks x 2,000 points.

type runSpec struct {
	runID, grid string
	size        int
	points      int
	raw         int  // raw samples per rank-point (>= 1); 0 means 3
	protocol    bool // measurement_protocol + benchmark_measurement
	exec        bool // execution_evidence + benchmark_sample + warmup_evidence (needs protocol)
	engine      bool
	tp, pp, pcp int
	pathFor     func(rank int) string
}

func (s runSpec) rawN() int {
	if s.raw <= 0 {
		return 3
	}
	return s.raw
}

// path is Dynamo's rank file naming under /tmp.
func (s runSpec) path(rank int) string {
	if s.pathFor != nil {
		return s.pathFor(rank)
	}
	if rank == 0 {
		return "/tmp/benchmark_results.json"
	}
	return fmt.Sprintf("/tmp/benchmark_results_dp%d.json", rank)
}

// v converts Go values to BenchNodes: string, int, int64, float64 (Python repr), bool, nil, BenchNode,
// []any, and obj.
func v(x any) schemas.BenchNode {
	switch t := x.(type) {
	case nil:
		return schemas.NewBenchNull()
	case string:
		return schemas.NewBenchString(t)
	case int:
		return schemas.NewBenchInt(int64(t))
	case int64:
		return schemas.NewBenchInt(t)
	case float64:
		return schemas.NewBenchFloat(t)
	case bool:
		return schemas.NewBenchBool(t)
	case schemas.BenchNode:
		return t
	case *schemas.BenchNode:
		return *t
	case []any:
		a := schemas.NewBenchArray()
		for _, e := range t {
			a.Append(v(e))
		}
		return a
	case []int:
		a := schemas.NewBenchArray()
		for _, e := range t {
			a.Append(schemas.NewBenchInt(int64(e)))
		}
		return a
	}
	panic(fmt.Sprintf("gen: unsupported %T", x))
}

// obj builds an object from alternating keys and values.
func obj(kv ...any) schemas.BenchNode {
	o := schemas.NewBenchObject()
	for i := 0; i < len(kv); i += 2 {
		o.Set(kv[i].(string), v(kv[i+1]))
	}
	return o
}

func hexDigest(parts ...any) string {
	h := sha256.Sum256([]byte(fmt.Sprint(parts...)))
	return hex.EncodeToString(h[:])
}

// round6 keeps generated timings short and exact in text.
func round6(f float64) float64 { return math.Round(f*1e6) / 1e6 }

var captureSizes = []int{1, 2, 4, 8, 16, 32}

func padTo(n int) int {
	for _, s := range captureSizes {
		if s >= n {
			return s
		}
	}
	return n
}

func (s runSpec) point(id int) schemas.BenchNode {
	batch := 1 << ((id - 1) % 4) // 1, 2, 4, 8
	if id%2 == 1 {
		return obj("benchmark_id", id, "point_type", "prefill", "batch_size", batch, "isl", 128*((id-1)%3+1),
			"prefix_len", 0, "expected_cudagraph_mode", "PIECEWISE", "expected_capture_size", nil)
	}
	return obj("benchmark_id", id, "point_type", "decode", "batch_size", batch, "total_kv_read_tokens", 512*batch,
		"expected_cudagraph_mode", "FULL", "expected_capture_size", padTo(batch))
}

// wall is rank r's retained wall time at point id; rank-dependent so the maximum rank varies by point.
func (s runSpec) rawWalls(r, id int) []float64 {
	n := s.rawN()
	base := 0.01 + 0.002*float64((id*7+r*3)%11) + 0.0005*float64(r)
	walls := make([]float64, n)
	for j := range walls {
		walls[j] = round6(base + 0.0003*float64((j*5+r+id)%4))
	}
	if n > 1 {
		walls[0] = round6(base * 3) // the discarded admission step is slow
	}
	return walls
}

func retainedWall(walls []float64) (float64, string, []int) {
	if len(walls) == 1 {
		return walls[0], "single_step", []int{0}
	}
	sel := append([]float64(nil), walls[1:]...)
	idx := make([]int, 0, len(sel))
	for i := 1; i < len(walls); i++ {
		idx = append(idx, i)
	}
	for i := range sel { // insertion sort (tiny)
		for j := i; j > 0 && sel[j] < sel[j-1]; j-- {
			sel[j], sel[j-1] = sel[j-1], sel[j]
		}
	}
	return sel[len(sel)/2], "adjacent_upper_median", idx
}

func scheduled(point schemas.BenchNode) schemas.BenchNode {
	b, _ := point.Get("batch_size").Int()
	if pt, _ := point.Get("point_type").Text(); pt == "prefill" {
		isl, _ := point.Get("isl").Int()
		return obj("num_prefill_requests", b, "sum_prefill_tokens", b*isl, "var_prefill_length", 0.0,
			"sum_prefill_kv_tokens", 0, "num_decode_requests", 0, "sum_decode_kv_tokens", 0, "var_decode_kv_tokens", 0.0)
	}
	kv, _ := point.Get("total_kv_read_tokens").Int()
	return obj("num_prefill_requests", 0, "sum_prefill_tokens", 0, "var_prefill_length", 0.0,
		"sum_prefill_kv_tokens", 0, "num_decode_requests", b, "sum_decode_kv_tokens", kv, "var_decode_kv_tokens", 0.0)
}

func queued() schemas.BenchNode {
	return obj("num_prefill_requests", 0, "sum_prefill_tokens", 0, "var_prefill_length", 0.0,
		"num_decode_requests", 0, "sum_decode_kv_tokens", 0, "var_decode_kv_tokens", 0.0)
}

func pointKey(point schemas.BenchNode) string {
	pt, _ := point.Get("point_type").Text()
	b, _ := point.Get("batch_size").Int()
	if pt == "prefill" {
		isl, _ := point.Get("isl").Int()
		return fmt.Sprintf("prefill:batch=%d:isl=%d:prefix=0", b, isl)
	}
	kv, _ := point.Get("total_kv_read_tokens").Int()
	return fmt.Sprintf("decode:batch=%d:kv=%d", b, kv)
}

// warmupRecords is the number of warmup records in each rank's ledger; they use forwards [0, 6).
const warmupRecords = 2

func (s runSpec) ledger(r int) schemas.BenchNode {
	return obj("status", "recorded", "records", []any{
		obj("kind", "global", "requested_shape", obj("prompt_tokens", []int{32 + r, 32 + r}), "status", "completed",
			"forward_index_start", 0, "forward_index_end", 4, "completed_points_before", 0, "observed_forward_count", 4,
			"first_scheduled_requests", obj("num_prefill_requests", 2, "sum_prefill_tokens", 64+2*r),
			"last_scheduled_requests", obj("num_decode_requests", 2, "sum_decode_kv_tokens", 70+2*r),
			"validation", obj("status", "not_performed", "reason", nil)),
		obj("kind", "eager_shape", "requested_shape", obj("benchmark_id", 1), "status", "completed",
			"forward_index_start", 4, "forward_index_end", 6, "completed_points_before", 0, "observed_forward_count", 2,
			"first_scheduled_requests", nil, "last_scheduled_requests", nil,
			"validation", obj("status", "passed", "reason", nil, "scope", "attention_dp_group", "failed_dp_rank", nil)),
	})
}

func protocol(exec bool) schemas.BenchNode {
	p := obj("schema_version", 1, "content_identity", "coordinate_rank_slot_v1", "content_seed", "0",
		"synthetic_content", "random", "synthetic_pool_tag", "", "prompt_hash_encoding", "uint32_le",
		"independent_repetitions", 1, "timing_metric", "scheduler_wall_time")
	if exec {
		p.Set("execution_evidence", obj("schema_version", 1, "sample_field", "benchmark_sample",
			"warmup_field", "warmup_evidence", "forward_index_scope", "rank_process",
			"timing_clock", "process_local_monotonic", "cudagraph_source", "ModelRunnerOutput.cudagraph_stats"))
	}
	p.Set("input_evidence_scope", v("injected_prompt_token_ids"))
	p.Set("unobserved", v([]any{"sampled_continuation_token_ids", "kv_cache_tensors", "recurrent_state_tensors",
		"decode_real_kv_chain_warmup_history", "execution_history_equivalence", "graph_kernel_cache_warming_equivalence"}))
	p.Set("preparation", obj("warmup_iterations", 5, "prefill_real_seed", false, "decode_real_kv_warmup", true,
		"giant_kv_threshold", 1000000, "giant_kv_repeats", 3))
	return p
}

func (s runSpec) engineBlock(r int) schemas.BenchNode {
	tp, pp, pcp := max(s.tp, 1), max(s.pp, 1), max(s.pcp, 1)
	return obj(
		"attention", obj("backend_requested", nil, "backend_per_kind", obj(), "mla_prefill_backend_requested", nil,
			"flash_attn_version", 3, "use_trtllm_attention", false, "indexer_kv_dtype", "fp8",
			"indexer_kv_dtype_configured", "auto", "backend_resolved", nil, "mla_prefill_backend_resolved", nil,
			"resolution", "pending_worker_probe",
			"indexer", obj("index_topk", 2048, "index_n_heads", 1, "index_head_dim", 128)),
		"kv_cache", obj("cache_dtype", "auto", "block_size", 64, "enable_prefix_caching", true,
			"groups", []any{obj("type", "FullAttentionSpec", "dtype", "bfloat16", "head_size", 128, "num_kv_heads", 8,
				"block_size", 64, "kv_quant_mode", "NONE")},
			"kv_cache_layout", "LBHNC"),
		"quantization", obj("method", "fp8", "checkpoint_config", obj("quant_method", "fp8", "activation_scheme", "dynamic"),
			"quant_config_class", "Fp8Config"),
		"scheduler", obj("max_num_batched_tokens", 8192, "max_num_seqs", 256, "async_scheduling", true,
			"enable_chunked_prefill", true, "long_prefill_token_threshold", 0),
		"model", obj("dtype", "bfloat16", "model_type", "deepseek_v3", "architectures", []any{"DeepseekV3ForCausalLM"},
			"model", "deepseek-ai/DeepSeek-V3"),
		"parallel", obj("data_parallel_size", s.size, "data_parallel_rank", r, "tensor_parallel_size", tp,
			"pipeline_parallel_size", pp, "prefill_context_parallel_size", pcp, "enable_expert_parallel", true,
			"enable_eplb", false, "all2all_backend", "deepep_high_throughput",
			"eplb_config", obj("window_size", 1000, "step_interval", 3000, "num_redundant_experts", 0,
				"log_balancedness", false, "log_balancedness_interval", 1, "use_async", true, "policy", "default",
				"communicator", nil)),
		"speculative", nil,
		"graph", obj("cudagraph_mode", "FULL", "cudagraph_capture_sizes", captureSizes, "resolution", "pre_resolution"),
		"versions", obj("vllm", "0.29.0", "vllm_build_commit", "abcdef0", "dynamo", "0.9.0", "python", "3.12.3"),
		"resolved", nil,
		"resolution", "pending_worker_probe",
	)
}

// fpm is rank r's retained FPM at point id; fwd is the rank's next forward index (advanced).
func (s runSpec) fpm(r, id int, point schemas.BenchNode, fwd *int, clock *float64) schemas.BenchNode {
	walls := s.rawWalls(r, id)
	ret, method, idx := retainedWall(walls)
	base := obj("version", 1, "worker_id", "dynamo-bench-7f3a", "dp_rank", r, "counter_id", id, "wall_time", ret,
		"scheduled_requests", scheduled(point), "queued_requests", queued())
	if !s.protocol {
		return base
	}
	raws := schemas.NewBenchArray()
	pt, _ := point.Get("point_type").Text()
	b, _ := point.Get("batch_size").Int()
	for j, w := range walls {
		raw := base.ShallowCopy()
		raw.Set("wall_time", v(w))
		if s.exec {
			*fwd += 1 + j%2 // preparation forwards leave gaps
			start := round6(*clock)
			end := start + w
			*clock = end + 0.0005
			startNode := v(start)
			if r == 3 && id == 2 && j == 0 {
				startNode = v(nil) // an unavailable start timestamp
			}
			var graph schemas.BenchNode
			switch {
			case r == 3 && id == 2 && j == 0:
				graph = obj("status", "unavailable", "runtime_mode", nil, "num_unpadded_tokens", nil,
					"num_padded_tokens", nil, "num_paddings", nil)
			case pt == "decode":
				graph = obj("status", "observed", "runtime_mode", "FULL", "num_unpadded_tokens", b,
					"num_padded_tokens", padTo(int(b)), "num_paddings", padTo(int(b))-int(b))
			default:
				isl, _ := point.Get("isl").Int()
				graph = obj("status", "observed", "runtime_mode", "PIECEWISE", "num_unpadded_tokens", b*isl,
					"num_padded_tokens", b*isl, "num_paddings", 0)
			}
			basis := "schedule_to_output"
			if j > 0 && pt == "decode" {
				basis = "inter_output"
			}
			raw.Set("benchmark_sample", obj("sample_index", j, "forward_index", *fwd,
				"timing", obj("basis", basis, "start_monotonic", startNode, "end_monotonic", end),
				"cudagraph", graph))
		}
		raws.Append(raw)
	}
	reqs := schemas.NewBenchArray()
	for slot := range int(b) {
		reqs.Append(obj("slot", slot, "num_tokens", 128+slot, "sha256", hexDigest("prompt", s.runID, r, id, slot)))
	}
	prep := obj("grid_digest", s.grid, "completed_points_before", id-1, "kv_seed_regime", map[bool]string{true: "real_kv", false: "none"}[pt == "decode"])
	if s.exec {
		prep.Set("warmup_records_before", v(warmupRecords))
	}
	meas := obj("schema_version", 1, "point_key", pointKey(point), "dp_rank", r,
		"prompts", obj("status", "recorded", "sha256", hexDigest("prompts", s.runID, r, id), "requests", reqs),
		"preparation", prep,
		"expected_internal_samples", len(walls)+1,
		"raw_fpms", raws,
		"estimate", obj("method", method, "raw_sample_indices", idx))
	base.Set("benchmark_measurement", meas)
	return base
}

// build returns every rank's artefact as a tree, indexed by rank.
func (s runSpec) build() []schemas.BenchNode {
	// Every rank's FPMs at every point (the synchronised groups carry all of them).
	fpms := make([][]schemas.BenchNode, s.points+1)
	points := make([]schemas.BenchNode, s.points+1)
	fwd := make([]int, s.size)
	clock := make([]float64, s.size)
	for r := range s.size {
		fwd[r] = 5 // the ledger's warmups use forwards 0..5
		clock[r] = 100.0 + 37.5*float64(r)
	}
	for id := 1; id <= s.points; id++ {
		points[id] = s.point(id)
		fpms[id] = make([]schemas.BenchNode, s.size)
		for r := range s.size {
			fpms[id][r] = s.fpm(r, id, points[id], &fwd[r], &clock[r])
		}
	}
	groups := schemas.NewBenchArray()
	measured := 0.0
	for id := 1; id <= s.points; id++ {
		rr := schemas.NewBenchArray()
		wall := 0.0
		for r := range s.size {
			rr.Append(obj("dp_rank", r, "fpms", []any{fpms[id][r]}))
			w, _ := fpms[id][r].Get("wall_time").FiniteFloat()
			wall = max(wall, w)
		}
		measured += wall
		ranks := make([]int, s.size)
		for r := range ranks {
			ranks[r] = r
		}
		groups.Append(obj("benchmark_id", id, "point", points[id], "expected_dp_ranks", ranks, "complete", true,
			"wall_time", wall, "rank_results", rr))
	}
	out := make([]schemas.BenchNode, s.size)
	for r := range s.size {
		results := schemas.NewBenchArray()
		for id := 1; id <= s.points; id++ {
			res := obj("point", points[id], "fpms", []any{fpms[id][r]})
			if pt, _ := points[id].Get("point_type").Text(); pt == "decode" {
				res.Set("kv_seed_regime", v("real_kv"))
			}
			results.Append(res)
		}
		elapsed := round6(measured + 12.5 + 0.25*float64(r))
		doc := obj("schema_version", 2, "artifact_type", "rank", "status", "complete", "valid", true, "usable", true,
			"stop_reason", nil, "error", nil, "run_id", s.runID, "grid_digest", s.grid,
			"benchmark_config", obj("mode", "graph_aware", "content_mode", "synthetic", "pool_tag", ""),
			"timing", obj("started_at", "2026-09-19T12:00:00Z", "completed_at", "2026-09-19T12:"+pad2(int(elapsed)/60)+":"+pad2(int(elapsed)%60)+"Z",
				"benchmark_elapsed_seconds", elapsed, "measured_iteration_seconds", measured),
			"dp", obj("rank", r, "size", s.size),
			"coverage", obj("expected_points", s.points, "completed_points", s.points, "skipped_points", 0),
			"limits", obj("num_gpu_blocks", 41000+17*r, "max_model_len", 16384))
		if s.engine {
			doc.Set("engine", s.engineBlock(r))
		}
		if s.protocol {
			doc.Set("measurement_protocol", protocol(s.exec))
		}
		if s.exec {
			doc.Set("warmup_evidence", s.ledger(r))
		}
		doc.Set("results", results)
		doc.Set("iteration_groups", groups)
		doc.Set("skipped_points", schemas.NewBenchArray())
		doc.Set("missing_phases", schemas.NewBenchArray())
		out[r] = doc.Clone() // no subtree shared between ranks or between results and groups
	}
	return out
}

func pad2(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

// rankFiles renders the artefacts as Dynamo would write them (json.dump indent=2).
func (s runSpec) rankFiles() []RankFile {
	docs := s.build()
	out := make([]RankFile, len(docs))
	for r := range docs {
		out[r] = RankFile{Rank: r, Path: s.path(r), Data: schemas.AppendBenchJSON(nil, &docs[r])}
	}
	return out
}

// workerReply is one worker's reply to fpm_engine_probe.
func workerReply(dp, worker, tp, pp, pcp int, backends map[string]string, layers []string) schemas.BenchNode {
	ab := schemas.NewBenchObject()
	for _, l := range layers {
		ab.Set(l, v(backends[l]))
	}
	return obj("tp_rank", tp, "pp_rank", pp, "pcp_rank", pcp, "worker_rank", worker, "dp_rank", dp,
		"attention_backends", ab, "mla_prefill_backend", "FlashAttnPrefillBackend",
		"cudagraph_mode_resolved", "FULL", "cudagraph_capture_sizes_resolved", captureSizes, "capture_errors", obj())
}
