package merge

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// Worker probe (the worker-probe sidecar and its coverage rule). After collection Dynamo asks every model
// worker for its resolved configuration with one collective_rpc; fpmbus takes those replies from the user
// (a file, or a message on FPM_BENCH) and turns them into the sidecar. Upstream Dynamo writes the same
// evidence inline into the artefacts; fpmbus writes a separate sidecar, as Dynamo's FPM trace reference
// says: the probe neither reads nor rewrites the rank and merged artefacts, whose startup engine block
// stays untouched.

// probeRepliesSchema names the optional envelope of a probe reply file.
const probeRepliesSchema = "fpmbus.benchmark_worker_probe_replies"

// ProbeReplies is one batch of worker-probe replies, in RPC order, or the reason there are none.
type ProbeReplies struct {
	// Source says where the batch came from (a file path, a stream sequence), for logs.
	Source string
	// RunID is the run the batch says it belongs to ("" when it does not say).
	RunID string
	// Replies are the RPC's return values exactly as given: any JSON value, malformed ones included.
	Replies []schemas.BenchNode
	// Error is the probe's own failure or skip reason ("probe_failed: ...", "probe_skipped: ...").
	Error string
}

// parseProbeReplies reads a probe reply file. Three forms are accepted:
//
//   - a JSON array: collective_rpc's return value, one element per worker, in RPC order;
//   - an envelope object {"schema": "fpmbus.benchmark_worker_probe_replies", "run_id": "...",
//     "replies": [...], "error": null | "probe_failed: ..." | "probe_skipped: ..."}, recognised by a
//     "replies" or "error" member (schema and run_id optional);
//   - any other object: one worker's reply.
func parseProbeReplies(data []byte, source string) (ProbeReplies, error) {
	doc, err := schemas.ParseBenchJSON(data)
	if err != nil {
		return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: %w", source, err)
	}
	pr := ProbeReplies{Source: source}
	switch {
	case doc.IsArray():
		pr.Replies = doc.Kids
	case doc.IsObject() && (doc.Has("replies") || doc.Has("error")):
		if s := doc.Get("schema"); s != nil {
			if v, _ := s.Text(); v != probeRepliesSchema {
				return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: schema is %s, want %q", source, describe(s), probeRepliesSchema)
			}
		}
		if r := doc.Get("replies"); r != nil {
			if !r.IsArray() {
				return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: replies is %s, want a list", source, describe(r))
			}
			pr.Replies = r.Kids
		}
		if e := doc.Get("error"); !e.IsNull() {
			s, ok := e.Text()
			if !ok {
				return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: error is %s, want a string or null", source, describe(e))
			}
			pr.Error = s
		}
		if r := doc.Get("run_id"); !r.IsNull() {
			s, ok := r.Text()
			if !ok {
				return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: run_id is %s, want a string", source, describe(r))
			}
			pr.RunID = s
		}
	case doc.IsObject():
		pr.Replies = []schemas.BenchNode{*doc}
	default:
		return ProbeReplies{}, fmt.Errorf("merge: probe replies %s: top-level value is %s, want a list of replies or an object", source, doc.Kind)
	}
	return pr, nil
}

// probeContext is what a sidecar is computed from besides the replies: small, JSON-encodable, so the
// consumer can store it with the merged artefact and recompute the sidecar when late replies arrive.
type probeContext struct {
	RunID            string   `json:"run_id"`
	MergedOutputPath string   `json:"merged_output_path"`
	WorkerProbePath  string   `json:"worker_probe_path"`
	RankFiles        []string `json:"rank_files"`
	SourceRanks      []int    `json:"source_ranks"`
	GlobalRanks      []int    `json:"global_ranks"`
	// TP, PP and PCP sizes from the merged engine block's parallel sub-block; nil when unknown.
	TPSize       *int64 `json:"tp_size"`
	PPSize       *int64 `json:"pp_size"`
	PCPSize      *int64 `json:"pcp_size"`
	HasAttention bool   `json:"has_attention"`
}

func newProbeContext(runID, mergedPath, sidecarPath string, rankFiles []string, source, global []int, engine *schemas.BenchNode) probeContext {
	pc := probeContext{RunID: runID, MergedOutputPath: mergedPath, WorkerProbePath: sidecarPath,
		RankFiles: rankFiles, SourceRanks: source, GlobalRanks: global, HasAttention: engine.Get("attention").IsObject()}
	size := func(name string) *int64 {
		if v, ok := engine.Get("parallel").Get(name).Int(); ok && v > 0 {
			return &v
		}
		return nil
	}
	pc.TPSize, pc.PPSize, pc.PCPSize = size("tensor_parallel_size"), size("pipeline_parallel_size"), size("prefill_context_parallel_size")
	return pc
}

// NoRepliesReason is the sidecar's failure when no probe replies were supplied at all.
const NoRepliesReason = schemas.ResolutionFailedPrefix + "no worker probe replies were supplied to the merger"

// buildSidecar computes the dynamo.fpm.benchmark_worker_probe document for a merged artefact from the
// probe replies of its run (every batch, in order; rpc_index counts across batches). With no replies the
// sidecar records why: the batches' own error, or NoRepliesReason.
func buildSidecar(pc probeContext, probes []ProbeReplies) *schemas.BenchNode {
	var replies []schemas.BenchNode
	batchErr := ""
	for _, b := range probes {
		replies = append(replies, b.Replies...)
		if batchErr == "" && b.Error != "" {
			batchErr = b.Error
		}
	}
	responses := checkReplies(replies)
	failure := ""
	switch {
	case len(replies) == 0 && batchErr != "":
		failure = batchErr
		if !strings.HasPrefix(failure, schemas.ResolutionFailedPrefix) && !strings.HasPrefix(failure, schemas.ResolutionSkippedPrefix) {
			failure = schemas.ResolutionFailedPrefix + failure
		}
	case len(replies) == 0 && len(probes) == 0:
		failure = NoRepliesReason
	case len(replies) == 0 || allHaveIssues(responses):
		failure = schemas.ResolutionFailedPrefix + "no valid worker probe responses"
	}
	sc := schemas.NewBenchObject()
	sc.Set("schema", schemas.NewBenchString(schemas.WorkerProbeSchema))
	sc.Set("schema_version", schemas.NewBenchInt(schemas.WorkerProbeSchemaVersion))
	sc.Set("run_id", schemas.NewBenchString(pc.RunID))
	sc.Set("merged_output_path", schemas.NewBenchString(pc.MergedOutputPath))
	files := schemas.NewBenchArray()
	for _, f := range pc.RankFiles {
		files.Append(schemas.NewBenchString(f))
	}
	sc.Set("rank_files", files)
	sc.Set("merged", probeResult(pc, responses, pc.GlobalRanks, failure))
	ranks := schemas.NewBenchObject()
	for i, r := range pc.SourceRanks {
		res := schemas.NewBenchObject()
		file := ""
		if i < len(pc.RankFiles) {
			file = pc.RankFiles[i]
		}
		res.Set("rank_file", schemas.NewBenchString(file))
		scoped := probeResult(pc, responses, []int{r}, failure)
		for j, k := range scoped.Keys {
			res.Set(k, scoped.Kids[j])
		}
		ranks.Set(strconv.Itoa(r), res)
	}
	sc.Set("ranks", ranks)
	return &sc
}

// probeReply is one returned reply with its validation issues.
type probeReply struct {
	index  int
	node   *schemas.BenchNode
	issues []string
}

// checkReplies keeps every reply, including malformed and duplicate ones, and records its issues.
func checkReplies(replies []schemas.BenchNode) []probeReply {
	out := make([]probeReply, len(replies))
	ids := map[[2]int64][]int{}
	for i := range replies {
		r := &replies[i]
		out[i] = probeReply{index: i, node: r}
		var issues []string
		if !r.IsObject() {
			issues = append(issues, "response is not an object")
		} else {
			for _, f := range []string{"dp_rank", "worker_rank", "tp_rank"} {
				if v, ok := r.Get(f).Int(); !ok || v < 0 {
					issues = append(issues, "missing or invalid "+f)
				}
			}
			for _, f := range []string{"pp_rank", "pcp_rank"} {
				if n := r.Get(f); !n.IsNull() {
					if v, ok := n.Int(); !ok || v < 0 {
						issues = append(issues, "invalid "+f)
					}
				}
			}
			ab := r.Get("attention_backends")
			if !ab.IsObject() || slices.ContainsFunc(ab.Kids, func(n schemas.BenchNode) bool { s, ok := n.Text(); return !ok || s == "" }) {
				issues = append(issues, "invalid attention_backends")
			}
			for _, f := range []string{"mla_prefill_backend", "cudagraph_mode_resolved"} {
				if n := r.Get(f); !n.IsNull() && !n.IsString() {
					issues = append(issues, "invalid "+f)
				}
			}
			sizes := r.Get("cudagraph_capture_sizes_resolved")
			if !sizes.IsArray() || slices.ContainsFunc(sizes.Kids, func(n schemas.BenchNode) bool { v, ok := n.Int(); return !ok || v < 1 }) {
				issues = append(issues, "invalid cudagraph_capture_sizes_resolved")
			}
			if len(issues) == 0 {
				dp, _ := r.Get("dp_rank").Int()
				wr, _ := r.Get("worker_rank").Int()
				ids[[2]int64{dp, wr}] = append(ids[[2]int64{dp, wr}], i)
			}
		}
		out[i].issues = issues
	}
	for _, idx := range ids {
		if len(idx) > 1 {
			for _, i := range idx {
				out[i].issues = append(out[i].issues, "duplicate (dp_rank, worker_rank)")
			}
		}
	}
	return out
}

func allHaveIssues(rs []probeReply) bool {
	for _, r := range rs {
		if len(r.issues) == 0 {
			return false
		}
	}
	return true
}

// probeResult evaluates the replies against the workers of one artefact: expected lists its DP ranks.
func probeResult(pc probeContext, all []probeReply, expected []int, failure string) schemas.BenchNode {
	scoped := make([]probeReply, len(all))
	for i, r := range all {
		scoped[i] = probeReply{index: r.index, node: r.node, issues: slices.Clone(r.issues)}
	}
	var wpd *int64
	topo := pc.TPSize != nil && pc.PPSize != nil && pc.PCPSize != nil
	if topo {
		v := *pc.TPSize * *pc.PPSize * *pc.PCPSize
		wpd = &v
	}
	var workers []int
	slots := map[[4]int64][]int{}
	var slotOrder [][4]int64
	for i := range scoped {
		e := &scoped[i]
		if len(e.issues) > 0 {
			continue
		}
		dp, _ := e.node.Get("dp_rank").Int()
		if expected != nil && !slices.Contains(expected, int(dp)) {
			continue
		}
		if topo {
			tp, pcp, pp := *pc.TPSize, *pc.PCPSize, *pc.PPSize
			wr, _ := e.node.Get("worker_rank").Int()
			eTP, ePCP, ePP := wr%tp, (wr/tp)%pcp, (wr/(tp*pcp))%pp
			gTP, _ := e.node.Get("tp_rank").Int()
			gPP, okPP := e.node.Get("pp_rank").Int()
			gPCP, okPCP := e.node.Get("pcp_rank").Int()
			if gTP != eTP || !okPP || gPP != ePP || !okPCP || gPCP != ePCP {
				e.issues = append(e.issues, "worker ranks disagree with TP/PCP/PP topology")
				continue
			}
			slot := [4]int64{dp, eTP, ePCP, ePP}
			if _, seen := slots[slot]; !seen {
				slotOrder = append(slotOrder, slot)
			}
			slots[slot] = append(slots[slot], i)
		}
		workers = append(workers, i)
	}
	for _, slot := range slotOrder {
		if idx := slots[slot]; len(idx) > 1 {
			for _, i := range idx {
				scoped[i].issues = append(scoped[i].issues, "duplicate (dp_rank, tp_rank, pcp_rank, pp_rank)")
			}
		}
	}
	var observed []*schemas.BenchNode
	for _, i := range workers {
		if len(scoped[i].issues) == 0 {
			observed = append(observed, scoped[i].node)
		}
	}
	observedRanks := map[int64]bool{}
	for _, o := range observed {
		dp, _ := o.Get("dp_rank").Int()
		observedRanks[dp] = true
	}
	complete := expected != nil && wpd != nil && int64(len(observed)) == int64(len(expected))**wpd
	for _, e := range scoped {
		if len(e.issues) > 0 {
			complete = false
		}
	}
	for _, o := range observed {
		if truthy(o.Get("capture_errors")) {
			complete = false
		}
	}

	var disagreements []string
	layers := map[string]map[string]bool{}
	for _, o := range observed {
		ab := o.Get("attention_backends")
		for j, layer := range ab.Keys {
			name, _ := ab.Kids[j].Text()
			if layers[layer] == nil {
				layers[layer] = map[string]bool{}
			}
			layers[layer][name] = true
		}
	}
	for _, names := range layers {
		if len(names) > 1 {
			disagreements = append(disagreements, "attention_backends")
			break
		}
	}
	for _, f := range []string{"mla_prefill_backend", "cudagraph_mode_resolved", "cudagraph_capture_sizes_resolved"} {
		var first *schemas.BenchNode
		for _, o := range observed {
			v := o.Get(f)
			if v.IsNull() {
				continue
			}
			if first == nil {
				first = v
			} else if !schemas.BenchEqual(first, v) {
				disagreements = append(disagreements, f)
				break
			}
		}
	}
	var resolution string
	switch {
	case failure != "":
		resolution = failure
	case len(observed) == 0:
		resolution = schemas.ResolutionUnobserved
	case len(disagreements) > 0:
		resolution = schemas.ResolutionMixed
	case complete:
		resolution = schemas.ResolutionProbe
	default:
		resolution = schemas.ResolutionPartial
	}

	res := schemas.NewBenchObject()
	if len(observed) > 0 {
		res.Set("resolved", *observed[0])
		res.Set("resolved_scope", schemas.NewBenchString(schemas.ResolvedScopeRepresentative))
	} else {
		res.Set("resolved", schemas.NewBenchNull())
		res.Set("resolved_scope", schemas.NewBenchNull())
	}
	res.Set("resolution", schemas.NewBenchString(resolution))

	wp := schemas.NewBenchObject()
	wp.Set("schema_version", schemas.NewBenchInt(1))
	wp.Set("scope", schemas.NewBenchString(schemas.WorkerProbeScope))
	resp := schemas.NewBenchArray()
	for _, e := range scoped {
		o := schemas.NewBenchObject()
		o.Set("rpc_index", schemas.NewBenchInt(int64(e.index)))
		o.Set("response", *e.node)
		iss := schemas.NewBenchArray()
		for _, s := range e.issues {
			iss.Append(schemas.NewBenchString(s))
		}
		o.Set("issues", iss)
		resp.Append(o)
	}
	wp.Set("responses", resp)
	cov := schemas.NewBenchObject()
	cov.Set("scope", schemas.NewBenchString(schemas.WorkerProbeCoverageScope))
	if expected != nil {
		cov.Set("expected_dp_ranks", intArray(expected))
	} else {
		cov.Set("expected_dp_ranks", schemas.NewBenchNull())
	}
	if wpd != nil {
		cov.Set("expected_workers_per_dp", schemas.NewBenchInt(*wpd))
	} else {
		cov.Set("expected_workers_per_dp", schemas.NewBenchNull())
	}
	ow := schemas.NewBenchArray()
	for _, o := range observed {
		w := schemas.NewBenchObject()
		for _, k := range []string{"dp_rank", "worker_rank", "tp_rank", "pp_rank", "pcp_rank"} {
			if v := o.Get(k); v != nil {
				w.Set(k, *v)
			} else {
				w.Set(k, schemas.NewBenchNull())
			}
		}
		ow.Append(w)
	}
	cov.Set("observed_workers", ow)
	if expected != nil {
		var missing []int
		for _, r := range expected {
			if !observedRanks[int64(r)] && !slices.Contains(missing, r) {
				missing = append(missing, r)
			}
		}
		sort.Ints(missing)
		cov.Set("missing_dp_ranks", intArray(missing))
	} else {
		cov.Set("missing_dp_ranks", schemas.NewBenchNull())
	}
	cov.Set("complete", schemas.NewBenchBool(complete))
	wp.Set("coverage", cov)
	dis := schemas.NewBenchArray()
	for _, d := range disagreements {
		dis.Append(schemas.NewBenchString(d))
	}
	wp.Set("disagreements", dis)
	if failure != "" {
		wp.Set("error", schemas.NewBenchString(failure))
	} else {
		wp.Set("error", schemas.NewBenchNull())
	}
	res.Set("worker_probe", wp)

	if pc.HasAttention {
		names := map[string]bool{}
		prefill := map[string]*schemas.BenchNode{}
		for _, o := range observed {
			ab := o.Get("attention_backends")
			for j := range ab.Kids {
				s, _ := ab.Kids[j].Text()
				names[s] = true
			}
			v := nullIfNil(o.Get("mla_prefill_backend"))
			prefill[string(schemas.AppendBenchCompact(nil, v))] = v
		}
		att := schemas.NewBenchObject()
		if len(names) == 1 {
			for n := range names {
				att.Set("backend_resolved", schemas.NewBenchString(n))
			}
		} else {
			att.Set("backend_resolved", schemas.NewBenchNull())
		}
		if len(prefill) == 1 {
			for _, v := range prefill {
				att.Set("mla_prefill_backend_resolved", *v)
			}
		} else {
			att.Set("mla_prefill_backend_resolved", schemas.NewBenchNull())
		}
		if len(names) > 1 {
			att.Set("resolution", schemas.NewBenchString(schemas.ResolutionMixed))
		} else {
			att.Set("resolution", schemas.NewBenchString(resolution))
		}
		res.Set("attention", att)
	}
	return res
}

// truthy is Python's truth value of a JSON value.
func truthy(n *schemas.BenchNode) bool {
	if n == nil {
		return false
	}
	switch n.Kind {
	case schemas.BenchNull:
		return false
	case schemas.BenchBool:
		return n.Str == "true"
	case schemas.BenchNumber:
		f, _ := n.Float()
		return f != 0
	case schemas.BenchString:
		return n.Str != ""
	}
	return n.Len() > 0 || n.Raw()
}
