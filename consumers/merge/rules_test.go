package merge

import (
	"errors"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// ruleBase is the run every rule fixture breaks: 2 ranks, 3 points, 3 raw samples, protocol, execution
// evidence, warmup ledgers and engine blocks, valid as generated.
var ruleBase = runSpec{runID: "rules-run", grid: "grid-rules", size: 2, points: 3, raw: 3, protocol: true, exec: true, engine: true}

// group returns rank doc's iteration group i.
func group(doc *schemas.BenchNode, i int) *schemas.BenchNode {
	return &doc.Get("iteration_groups").Kids[i]
}

// member returns the FPM of rank r in rank doc's iteration group i.
func member(doc *schemas.BenchNode, i, r int) *schemas.BenchNode {
	return &group(doc, i).Get("rank_results").Kids[r].Get("fpms").Kids[0]
}

func meas(doc *schemas.BenchNode, i, r int) *schemas.BenchNode {
	return member(doc, i, r).Get("benchmark_measurement")
}

func rawSample(doc *schemas.BenchNode, i, r, j int) *schemas.BenchNode {
	return &meas(doc, i, r).Get("raw_fpms").Kids[j]
}

func setPath(n *schemas.BenchNode, val schemas.BenchNode, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		n = n.Get(k)
	}
	n.Set(keys[len(keys)-1], val)
}

// setGroupID renumbers iteration group i of doc to id everywhere the id appears.
func setGroupID(doc *schemas.BenchNode, i int, id int) {
	g := group(doc, i)
	g.Set("benchmark_id", v(id))
	g.Get("point").Set("benchmark_id", v(id))
	rr := g.Get("rank_results")
	for r := range rr.Kids {
		f := &rr.Kids[r].Get("fpms").Kids[0]
		f.Set("counter_id", v(id))
		raws := f.Get("benchmark_measurement").Get("raw_fpms")
		for j := range raws.Kids {
			raws.Kids[j].Set("counter_id", v(id))
		}
	}
}

func makePartial(doc *schemas.BenchNode, expected int) {
	doc.Set("status", v("partial"))
	doc.Set("valid", v(false))
	doc.Set("stop_reason", v("timeout"))
	doc.Get("coverage").Set("expected_points", v(expected))
}

type ruleCase struct {
	rule   rule
	rank   *int   // expected RejectError.Rank (nil: not checked)
	point  string // expected RejectError.Point ("" : not checked)
	mutate func(docs []schemas.BenchNode)
	// files overrides how the docs become RankFiles (default: one per rank, Rank set).
	files func(docs []schemas.BenchNode) []RankFile
}

func rank(r int) *int { return &r }

var ruleCases = map[string]ruleCase{
	"rank 1 over the maximum artefact size is never read": {rule: RuleArtefactSize, rank: rank(1), files: func(docs []schemas.BenchNode) []RankFile {
		f := defaultFiles(docs)
		f[1] = RankFile{Rank: 1, Path: f[1].Path, Size: streams.DefaultBenchMaxArtefact + 1,
			Load: func() ([]byte, error) { return nil, errors.New("the artefact was read") }}
		return f
	}},
	"a 300-byte run_id": {rule: RuleRunID, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("run_id", v(strings.Repeat("r", 300))) }},
	"truncated rank file": {rule: RuleMalformedJSON, rank: rank(1), files: func(docs []schemas.BenchNode) []RankFile {
		f := defaultFiles(docs)
		f[1].Data = f[1].Data[:len(f[1].Data)/2]
		return f
	}},
	"schema_version 3":                  {rule: ruleSchemaVersion, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("schema_version", v(3)) }},
	"a merged artefact given as a rank": {rule: ruleArtifactType, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("artifact_type", v("merged")) }},
	"empty run_id":                      {rule: ruleMissingRunID, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("run_id", v("")) }},
	"no grid_digest":                    {rule: ruleMissingGridDigest, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Delete("grid_digest") }},
	"dp.size 0":                         {rule: ruleDPSize, rank: rank(1), mutate: func(d []schemas.BenchNode) { setPath(&d[1], v(0), "dp", "size") }},
	"rank 1's file says dp.rank 0":      {rule: ruleRankMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) { setPath(&d[1], v(0), "dp", "rank") }},
	"rank 1 supplied twice": {rule: ruleDuplicateRank, rank: rank(1), files: func(docs []schemas.BenchNode) []RankFile {
		f := defaultFiles(docs)
		return append(f, RankFile{Rank: 1, Path: "/tmp/copy_of_dp1.json", Data: f[1].Data})
	}},
	"complete status with a stop_reason": {rule: ruleStatus, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("stop_reason", v("timeout")) }},
	"completed count disagrees with results": {rule: ruleCoverageArithmetic, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v(2), "coverage", "completed_points")
	}},
	"started_at is a number": {rule: ruleTimingInvalid, rank: rank(1), mutate: func(d []schemas.BenchNode) { setPath(&d[1], v(12), "timing", "started_at") }},
	"protocol schema_version 2": {rule: ruleProtocolInvalid, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v(2), "measurement_protocol", "schema_version")
	}},
	"execution contract names another sample field": {rule: ruleExecutionContract, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v("sample"), "measurement_protocol", "execution_evidence", "sample_field")
	}},
	"warmup record count contradicts its range": {rule: ruleWarmupEvidence, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		d[1].Get("warmup_evidence").Get("records").Kids[0].Set("observed_forward_count", v(3))
	}},
	"rank 1 never arrived": {rule: ruleMissingRanks, files: func(docs []schemas.BenchNode) []RankFile { return defaultFiles(docs)[:1] }},
	"rank 1 is a legacy artefact": {rule: ruleLegacyProtocolMix, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		d[1].Delete("measurement_protocol")
		d[1].Delete("warmup_evidence")
	}},
	"different content seed": {rule: ruleProtocolMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v("1"), "measurement_protocol", "content_seed")
	}},
	"another run's rank":   {rule: ruleRunMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("run_id", v("another-run")) }},
	"another grid":         {rule: ruleGridMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) { d[1].Set("grid_digest", v("grid-other")) }},
	"rank 1 stopped early": {rule: ruleStatusMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) { makePartial(&d[1], 4) }},
	"ranks expected different point counts": {rule: ruleCoverageMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		makePartial(&d[0], 4)
		makePartial(&d[1], 5)
	}},
	"rank 1 believes in three ranks": {rule: ruleDPSizeMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) { setPath(&d[1], v(3), "dp", "size") }},
	"rank 1 asked for another attention backend": {rule: ruleEngineMismatch, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v("FLASHINFER"), "engine", "attention", "backend_requested")
	}},
	"rank 1's copy of a group differs": {rule: ruleIterationGroupsMismatch, rank: rank(1), point: "3", mutate: func(d []schemas.BenchNode) {
		meas(&d[1], 2, 0).Get("prompts").Set("sha256", v("0000"))
	}},
	"no iteration groups": {rule: ruleMissingIterationGroups, rank: rank(0), mutate: func(d []schemas.BenchNode) {
		for r := range d {
			setPath(&d[r], v(0), "coverage", "expected_points")
			setPath(&d[r], v(0), "coverage", "completed_points")
			d[r].Set("results", v([]any{}))
			d[r].Set("iteration_groups", v([]any{}))
		}
	}},
	"benchmark_id 0":       {rule: ruleBenchmarkID, rank: rank(0), mutate: func(d []schemas.BenchNode) { group(&d[0], 1).Set("benchmark_id", v(0)) }},
	"benchmark_id 1 twice": {rule: ruleDuplicateBenchmarkID, rank: rank(0), point: "1", mutate: func(d []schemas.BenchNode) { setGroupID(&d[0], 1, 1) }},
	"ids 1, 2, 4":          {rule: ruleNonContiguousBenchmarkIDs, rank: rank(0), mutate: func(d []schemas.BenchNode) { setGroupID(&d[0], 2, 4) }},
	"group expects rank 0 only": {rule: ruleGroupRanks, rank: rank(0), point: "1", mutate: func(d []schemas.BenchNode) {
		group(&d[0], 0).Set("expected_dp_ranks", v([]int{0}))
	}},
	"rank 1's FPM names another point": {rule: ruleRankPointFPM, rank: rank(1), point: "1", mutate: func(d []schemas.BenchNode) {
		member(&d[0], 0, 1).Set("counter_id", v(9))
	}},
	"group wall_time is not the slowest rank's": {rule: ruleGroupWallTime, rank: rank(0), point: "2", mutate: func(d []schemas.BenchNode) {
		group(&d[0], 1).Set("wall_time", v(0.5))
	}},
	"evidence without a protocol": {rule: ruleMeasurementWithoutProtocol, rank: rank(0), point: "1", mutate: func(d []schemas.BenchNode) {
		for r := range d {
			d[r].Delete("measurement_protocol")
			d[r].Delete("warmup_evidence")
		}
	}},
	"rank 1 has no evidence for point 1": {rule: ruleMissingGroupEvidence, rank: rank(1), point: "1", mutate: func(d []schemas.BenchNode) {
		member(&d[0], 0, 1).Delete("benchmark_measurement")
	}},
	"rank 1's evidence describes another coordinate": {rule: ruleMeasurementIdentity, rank: rank(1), point: "1", mutate: func(d []schemas.BenchNode) {
		meas(&d[0], 0, 1).Set("point_key", v("decode:batch=64:kv=1"))
	}},
	"a raw sample of another point": {rule: ruleRawSamples, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		rawSample(&d[0], 1, 1, 1).Set("counter_id", v(9))
	}},
	"sample_index is not the position": {rule: ruleSampleIndex, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		rawSample(&d[0], 1, 1, 1).Get("benchmark_sample").Set("sample_index", v(0))
	}},
	"forward_index goes back": {rule: ruleForwardIndexOrder, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		rawSample(&d[0], 1, 1, 1).Get("benchmark_sample").Set("forward_index", v(7))
	}},
	"interval contradicts wall_time": {rule: ruleTimingMismatch, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		t := rawSample(&d[0], 1, 1, 1).Get("benchmark_sample").Get("timing")
		end, _ := t.Get("end_monotonic").Float()
		t.Set("end_monotonic", v(end+0.25))
	}},
	"paddings do not add up": {rule: ruleCudagraphPadding, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		rawSample(&d[0], 1, 1, 1).Get("benchmark_sample").Get("cudagraph").Set("num_paddings", v(7))
	}},
	"median over the admission sample": {rule: ruleEstimate, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		meas(&d[0], 1, 1).Get("estimate").Set("raw_sample_indices", v([]int{0, 1, 2}))
	}},
	"more warmups counted than recorded": {rule: ruleWarmupReference, rank: rank(0), point: "1", mutate: func(d []schemas.BenchNode) {
		meas(&d[0], 0, 0).Get("preparation").Set("warmup_records_before", v(5))
	}},
	"measured seconds are not the group sum": {rule: ruleMeasuredTime, rank: rank(1), mutate: func(d []schemas.BenchNode) {
		setPath(&d[1], v(0.5), "timing", "measured_iteration_seconds")
	}},
	"benchmark_id 1 twice in results": {rule: ruleResultIDSet, rank: rank(1), point: "1", mutate: func(d []schemas.BenchNode) {
		setPath(&d[1].Get("results").Kids[2], v(1), "point", "benchmark_id")
	}},
	"result point differs from its group's": {rule: rulePointMismatch, rank: rank(1), point: "1", mutate: func(d []schemas.BenchNode) {
		setPath(&d[1].Get("results").Kids[0], v(64), "point", "batch_size")
	}},
	"rank 1's own FPM differs from the group copy": {rule: ruleLocalResultMismatch, rank: rank(1), point: "2", mutate: func(d []schemas.BenchNode) {
		d[1].Get("results").Kids[1].Get("fpms").Kids[0].Set("wall_time", v(0.001))
	}},
}

func defaultFiles(docs []schemas.BenchNode) []RankFile {
	out := make([]RankFile, len(docs))
	for r := range docs {
		out[r] = RankFile{Rank: r, Path: ruleBase.path(r), Data: schemas.AppendBenchJSON(nil, &docs[r])}
	}
	return out
}

func TestBenchRuleBaseMerges(t *testing.T) {
	t.Parallel()
	if _, err := Merge(defaultFiles(ruleBase.build()), nil, Options{RequireAllRanks: true}); err != nil {
		t.Fatalf("the unbroken rule base must merge: %v", err)
	}
}

func TestBenchRejectionRules(t *testing.T) {
	t.Parallel()
	covered := map[rule]bool{}
	for name, c := range ruleCases {
		covered[c.rule] = true
		t.Run(name, func(t *testing.T) {
			docs := ruleBase.build()
			if c.mutate != nil {
				c.mutate(docs)
			}
			files := defaultFiles(docs)
			if c.files != nil {
				files = c.files(docs)
			}
			res, err := Merge(files, nil, Options{RequireAllRanks: true})
			if err == nil {
				t.Fatalf("merged (%d points) but rule %s is broken", res.Points, c.rule)
			}
			var rej *RejectError
			if !errors.As(err, &rej) || !errors.Is(err, errRejected) {
				t.Fatalf("error %v is not a *RejectError", err)
			}
			if rej.Rule != c.rule {
				t.Fatalf("rule %s, want %s (%v)", rej.Rule, c.rule, err)
			}
			if c.rank != nil && (rej.Rank == nil || *rej.Rank != *c.rank) {
				t.Fatalf("rank %v, want %d (%v)", rej.Rank, *c.rank, err)
			}
			if c.point != "" && rej.Point != c.point {
				t.Fatalf("point %q, want %q (%v)", rej.Point, c.point, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "rule "+string(c.rule)) || rej.Detail == "" {
				t.Fatalf("message %q does not name the rule with a detail", msg)
			}
			if rej.RunID != "" && !strings.Contains(msg, rej.RunID) {
				t.Fatalf("message %q does not name the run", msg)
			}
		})
	}
	for _, r := range rules {
		if !covered[r] {
			t.Errorf("rule %s has no fixture", r)
		}
	}
	if len(covered) != len(rules) {
		t.Errorf("%d rules covered, %d declared", len(covered), len(rules))
	}
}
