package seal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

// errNotSealable: a merged artefact cannot become a cell (not merged, no engine block, ...).
var errNotSealable = errors.New("seal: merged artefact cannot be sealed")

// identityNeutral are the engine members the merger's identity comparison drops (they record how the
// engine resolved settings on one rank, not a setting); they stay out of the settings digest too.
var identityNeutral = []string{"resolved", "resolution", "resolved_scope", "worker_probe", "capture_errors"}

// FromMerged turns a merged benchmark artefact into a one-cell dataset. artefactDigest is the hex
// sha256 of the artefact's bytes (the Fpm-Bench-Sha256 header); profile is the run's collection
// profile. Each iteration group becomes a row: its point's phase, the FPM coordinates the slowest rank
// scheduled, and latency = the maximum positive rank wall time, in milliseconds. Nothing else from the
// artefact (worker ids, paths, host names) reaches the cell.
func FromMerged(doc []byte, artefactDigest string, profile *schemas.CollectionProfile) (*schemas.Dataset, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", errNotSealable, err)
	}
	if m["artifact_type"] != "merged" {
		return nil, fmt.Errorf("%w: artifact_type %v, want merged", errNotSealable, m["artifact_type"])
	}
	runID, _ := m["run_id"].(string)
	grid, _ := m["grid_digest"].(string)
	engine, ok := m["engine"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: run %q has no engine block: its identity is unknown", errNotSealable, runID)
	}
	id, err := identityOf(engine, m["benchmark_config"], profile)
	if err != nil {
		return nil, fmt.Errorf("%w: run %q: %v", errNotSealable, runID, err)
	}
	cell := schemas.Cell{Identity: id, Provenance: schemas.Provenance{RunID: runID, GridDigest: grid, ArtefactDigest: artefactDigest}}
	groups, _ := m["iteration_groups"].([]any)
	for gi, g := range groups {
		row, err := rowOf(g)
		if err != nil {
			return nil, fmt.Errorf("%w: run %q iteration group %d: %v", errNotSealable, runID, gi, err)
		}
		cell.Rows = append(cell.Rows, row)
	}
	schemas.SortRows(cell.Rows)
	cell.Finish()
	return &schemas.Dataset{SchemaVersion: schemas.DatasetSchemaVersion, Kind: schemas.DatasetKind, RunID: runID, Cells: []schemas.Cell{cell}}, nil
}

func identityOf(engine map[string]any, benchCfg any, p *schemas.CollectionProfile) (schemas.CellIdentity, error) {
	str := func(v any) string {
		switch x := v.(type) {
		case string:
			return x
		case bool:
			return strconv.FormatBool(x)
		case json.Number:
			return x.String()
		}
		return ""
	}
	num := func(v any, def int) int {
		if n, ok := v.(json.Number); ok {
			if i, err := n.Int64(); err == nil {
				return int(i)
			}
		}
		return def
	}
	obj := func(v any) map[string]any { o, _ := v.(map[string]any); return o }
	model, par, att := obj(engine["model"]), obj(engine["parallel"]), obj(engine["attention"])
	versions, quant, kvc, graph := obj(engine["versions"]), obj(engine["quantization"]), obj(engine["kv_cache"]), obj(engine["graph"])
	id := schemas.CellIdentity{SchemaVersion: schemas.DatasetSchemaVersion, Model: str(model["model"]), Hardware: p.Hardware,
		ProfileName: p.Name, ProfileVersion: p.Version, Quantization: "none", KVCacheDType: str(kvc["cache_dtype"])}
	for _, b := range []string{"vllm", "sglang", "trtllm"} {
		if v := str(versions[b]); v != "" {
			id.Backend, id.BackendVersion = b, v
			break
		}
	}
	if id.Backend == "" {
		return id, errors.New("engine.versions names no backend version")
	}
	if q := str(quant["method"]); q != "" {
		id.Quantization = q
	}
	tp, dp := num(par["tensor_parallel_size"], 1), num(par["data_parallel_size"], 1)
	id.Parallelism = schemas.Parallelism{TP: tp, PP: num(par["pipeline_parallel_size"], 1), DP: dp, MoETP: tp, MoEEP: 1,
		CP: num(par["prefill_context_parallel_size"], 1)}
	if par["enable_expert_parallel"] == true {
		id.Parallelism.MoETP, id.Parallelism.MoEEP = 1, tp*dp
	}
	sel := map[string]string{
		"attention_backend":   orAuto(str(att["backend_requested"])),
		"mla_prefill_backend": orAuto(str(att["mla_prefill_backend_requested"])),
		"all2all_backend":     orAuto(str(par["all2all_backend"])),
		"enable_eplb":         str(par["enable_eplb"]),
		"cudagraph_mode":      orAuto(str(graph["cudagraph_mode"])),
	}
	for k, v := range obj(att["backend_per_kind"]) {
		sel["attention_backend."+k] = str(v)
	}
	id.BackendSelections = sel
	// Settings digest: the engine block without identity-neutral members, the benchmark config and the
	// whole collection profile.
	clean := map[string]any{}
	for k, v := range engine {
		clean[k] = v
	}
	for _, k := range identityNeutral {
		delete(clean, k)
	}
	if a := obj(clean["attention"]); a != nil {
		a2 := map[string]any{}
		for k, v := range a {
			if k != "backend_resolved" && k != "mla_prefill_backend_resolved" && k != "resolution" {
				a2[k] = v
			}
		}
		clean["attention"] = a2
	}
	if pp := obj(clean["parallel"]); pp != nil {
		p2 := map[string]any{}
		for k, v := range pp {
			if k != "data_parallel_rank" {
				p2[k] = v
			}
		}
		clean["parallel"] = p2
	}
	b, err := schemas.CanonicalJSON(map[string]any{"engine": clean, "benchmark_config": benchCfg, "profile": p})
	if err != nil {
		return id, err
	}
	id.SettingsDigest = schemas.SHA256Hex(b)
	if id.Model == "" {
		return id, errors.New("engine.model.model is empty")
	}
	return id, nil
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

// rowOf builds the row of one iteration group.
func rowOf(g any) (schemas.Row, error) {
	grp, _ := g.(map[string]any)
	point, _ := grp["point"].(map[string]any)
	phase, _ := point["point_type"].(string)
	var best map[string]any
	bestWall := math.Inf(-1)
	ranks, _ := grp["rank_results"].([]any)
	for _, rr := range ranks {
		r, _ := rr.(map[string]any)
		fpms, _ := r["fpms"].([]any)
		for _, f := range fpms {
			fm, _ := f.(map[string]any)
			n, _ := fm["wall_time"].(json.Number)
			w, err := n.Float64()
			if err != nil || !(w > 0) {
				continue
			}
			if w > bestWall {
				best, bestWall = fm, w
			}
		}
	}
	row := schemas.Row{Phase: phase}
	if best == nil {
		return row, nil // no positive wall time: validation rejects the row as latency_invalid
	}
	row.LatencyMS = bestWall * 1000
	sr, _ := best["scheduled_requests"].(map[string]any)
	get := func(k string) int64 {
		n, _ := sr[k].(json.Number)
		i, _ := n.Int64()
		return i
	}
	// All five coordinates are carried whatever the phase: a prefill point whose FPM scheduled decode
	// work is phase-invalid, and validation says so.
	row.NumPrefillRequests, row.SumPrefillTokens, row.SumPrefillKVTokens = get("num_prefill_requests"), get("sum_prefill_tokens"), get("sum_prefill_kv_tokens")
	row.NumDecodeRequests, row.SumDecodeKVTokens = get("num_decode_requests"), get("sum_decode_kv_tokens")
	if phase != schemas.PhasePrefill && phase != schemas.PhaseDecode {
		return row, fmt.Errorf("point_type %q: want prefill or decode", phase)
	}
	if len(ranks) == 0 {
		return row, errors.New("no rank results")
	}
	return row, nil
}
