package merge

import (
	"fmt"
	"slices"

	"github.com/fpmbus/fpmbus/schemas"
)

// Execution evidence (the measurement protocol's per-sample timing, graph dispatch and
// warmup-completion evidence).
// Timestamps are process-local, so nothing here compares one rank's samples with another's: every check
// is within one rank-point, or within one rank's sequence of forward indices and its own warmup ledger.

var timingBases = []string{"schedule_to_output", "inter_output"}

// checkExecution validates one retained FPM's raw samples and reduction against its declared point and
// rank. prev is the rank's last forward_index so far (-1 before its first sample); it returns the new
// last forward_index, or the rule broken and why.
func checkExecution(fpm, meas *schemas.BenchNode, id int64, rank int, prev int64) (int64, rule, string) {
	raw := meas.Get("raw_fpms")
	expected, okExp := meas.Get("expected_internal_samples").Int()
	switch {
	case !raw.IsArray() || raw.Len() == 0:
		return prev, ruleRawSamples, "benchmark_measurement.raw_fpms is " + describe(raw) + ", want a non-empty list"
	case !okExp:
		return prev, ruleRawSamples, "expected_internal_samples is " + describe(meas.Get("expected_internal_samples")) + ", want an integer"
	case expected < int64(raw.Len()):
		return prev, ruleRawSamples, fmt.Sprintf("raw_fpms has %d samples, more than expected_internal_samples %d", raw.Len(), expected)
	case fpm.Has("benchmark_sample"):
		return prev, ruleRawSamples, "the retained FPM carries a benchmark_sample; only raw samples do"
	}
	worker := fpm.Get("worker_id")
	for i := range raw.Kids {
		s := &raw.Kids[i]
		if !s.IsObject() {
			return prev, ruleRawSamples, fmt.Sprintf("raw sample %d is %s, want an object", i, describe(s))
		}
		if c, ok := s.Get("counter_id").Int(); !ok || c != id {
			return prev, ruleRawSamples, fmt.Sprintf("raw sample %d has counter_id %s, want the point's %d", i, describe(s.Get("counter_id")), id)
		}
		if r, ok := s.Get("dp_rank").Int(); !ok || r != int64(rank) {
			return prev, ruleRawSamples, fmt.Sprintf("raw sample %d has dp_rank %s, want %d", i, describe(s.Get("dp_rank")), rank)
		}
		if !schemas.BenchEqual(nullIfNil(s.Get("worker_id")), nullIfNil(worker)) {
			return prev, ruleRawSamples, fmt.Sprintf("raw sample %d has worker_id %s, the retained FPM %s", i, describe(s.Get("worker_id")), describe(worker))
		}
		bs := s.Get("benchmark_sample")
		if !bs.IsObject() {
			return prev, ruleRawSamples, fmt.Sprintf("raw sample %d has no benchmark_sample object", i)
		}
		if si, ok := bs.Get("sample_index").Int(); !ok || si != int64(i) {
			return prev, ruleSampleIndex, fmt.Sprintf("raw sample %d has sample_index %s, want its position %d", i, describe(bs.Get("sample_index")), i)
		}
		fi, ok := bs.Get("forward_index").Int()
		if !ok {
			return prev, ruleForwardIndexOrder, fmt.Sprintf("raw sample %d has forward_index %s, want an integer", i, describe(bs.Get("forward_index")))
		}
		if fi <= prev {
			return prev, ruleForwardIndexOrder, fmt.Sprintf("raw sample %d has forward_index %d, not after the rank's previous forward_index %d", i, fi, prev)
		}
		prev = fi
		if detail := checkSampleTiming(s, bs.Get("timing")); detail != "" {
			return prev, ruleTimingMismatch, fmt.Sprintf("raw sample %d: %s", i, detail)
		}
		if detail := checkCudagraph(bs.Get("cudagraph")); detail != "" {
			return prev, ruleCudagraphPadding, fmt.Sprintf("raw sample %d: %s", i, detail)
		}
	}
	if detail := checkEstimate(fpm, meas.Get("estimate"), raw); detail != "" {
		return prev, ruleEstimate, detail
	}
	return prev, "", ""
}

func checkSampleTiming(sample, t *schemas.BenchNode) string {
	if !t.IsObject() {
		return "timing is " + describe(t) + ", want an object"
	}
	basis, _ := t.Get("basis").Text()
	if !slices.Contains(timingBases, basis) {
		return "timing.basis is " + describe(t.Get("basis")) + ", want schedule_to_output or inter_output"
	}
	end, ok := t.Get("end_monotonic").FiniteFloat()
	if !ok {
		return "timing.end_monotonic is " + describe(t.Get("end_monotonic")) + ", want a finite number"
	}
	wall, ok := sample.Get("wall_time").FiniteFloat()
	if !ok || wall < 0 {
		return "wall_time is " + describe(sample.Get("wall_time")) + ", want a finite number >= 0"
	}
	st := t.Get("start_monotonic")
	if st.IsNull() {
		return "" // an unavailable start timestamp is null
	}
	start, ok := st.FiniteFloat()
	switch {
	case !ok:
		return "timing.start_monotonic is " + describe(st) + ", want a finite number or null"
	case start > end:
		return fmt.Sprintf("timing.start_monotonic %s is after end_monotonic %s", fmtFloat(start), fmtFloat(end))
	case !isClose(end-start, wall, 1e-9, 1e-9):
		return fmt.Sprintf("timing interval %s s (end - start) contradicts wall_time %s s", fmtFloat(end-start), fmtFloat(wall))
	}
	return ""
}

func checkCudagraph(g *schemas.BenchNode) string {
	if !g.IsObject() {
		return "cudagraph is " + describe(g) + ", want an object with a status"
	}
	mode, unpadded, padded, paddings := g.Get("runtime_mode"), g.Get("num_unpadded_tokens"), g.Get("num_padded_tokens"), g.Get("num_paddings")
	status, _ := g.Get("status").Text()
	switch status {
	case "observed":
		m, ok := mode.Text()
		if !ok || m == "" {
			return "observed cudagraph runtime_mode is " + describe(mode) + ", want a non-empty string"
		}
		u, ok1 := unpadded.Int()
		p, ok2 := padded.Int()
		n, ok3 := paddings.Int()
		switch {
		case !ok1 || !ok2 || !ok3:
			return "observed cudagraph token counts must be integers"
		case u < 0:
			return fmt.Sprintf("num_unpadded_tokens %d is negative", u)
		case p < u:
			return fmt.Sprintf("num_padded_tokens %d is below num_unpadded_tokens %d", p, u)
		case n != p-u:
			return fmt.Sprintf("num_paddings %d is not num_padded_tokens - num_unpadded_tokens = %d", n, p-u)
		}
		return ""
	case "unavailable":
		for _, f := range []string{"runtime_mode", "num_unpadded_tokens", "num_padded_tokens", "num_paddings"} {
			if !g.Get(f).IsNull() {
				return "unavailable cudagraph has " + f + " " + describe(g.Get(f)) + "; missing evidence must stay null"
			}
		}
		return ""
	}
	return "cudagraph status is " + describe(g.Get("status")) + ", want observed or unavailable"
}

func checkEstimate(fpm, est, raw *schemas.BenchNode) string {
	if !est.IsObject() {
		return "estimate is " + describe(est) + ", want an object"
	}
	idxNode := est.Get("raw_sample_indices")
	if !idxNode.IsArray() || idxNode.Len() == 0 {
		return "estimate.raw_sample_indices is " + describe(idxNode) + ", want a non-empty list"
	}
	n := raw.Len()
	idx := make([]int, idxNode.Len())
	for i := range idxNode.Kids {
		v, ok := idxNode.Kids[i].Int()
		if !ok || v < 0 || v >= int64(n) {
			return fmt.Sprintf("estimate.raw_sample_indices[%d] is %s, want an index into the %d raw samples", i, describe(&idxNode.Kids[i]), n)
		}
		idx[i] = int(v)
		if i > 0 && idx[i] <= idx[i-1] {
			return "estimate.raw_sample_indices " + describe(idxNode) + " is not strictly increasing"
		}
	}
	method, _ := est.Get("method").Text()
	var want []int
	switch method {
	case "single_step":
		if n != 1 {
			return fmt.Sprintf("estimate.method single_step needs exactly one raw sample, got %d", n)
		}
		want = []int{0}
	case "last_step":
		want = []int{n - 1}
	case "adjacent_upper_median":
		for i := 1; i < n; i++ {
			want = append(want, i)
		}
	default:
		return "estimate.method is " + describe(est.Get("method")) + ", want single_step, last_step or adjacent_upper_median"
	}
	if !slices.Equal(idx, want) {
		return fmt.Sprintf("estimate.raw_sample_indices %v contradict method %s (want %v)", idx, method, want)
	}
	walls := make([]float64, len(idx))
	for i, j := range idx {
		walls[i], _ = raw.Kids[j].Get("wall_time").FiniteFloat()
	}
	slices.Sort(walls)
	median := walls[len(walls)/2]
	retained, _ := fpm.Get("wall_time").FiniteFloat()
	if !isClose(retained, median, 1e-9, 1e-12) {
		return fmt.Sprintf("retained wall_time %s contradicts the %s of the selected raw samples, %s", fmtFloat(retained), method, fmtFloat(median))
	}
	return ""
}

var (
	warmupStatuses     = []string{"running", "completed", "failed"}
	validationStatuses = []string{"passed", "failed", "not_performed"}
)

// checkLedger validates a rank's warmup_evidence ledger; "" when valid.
func checkLedger(l *schemas.BenchNode) string {
	if !l.IsObject() {
		return "warmup_evidence is " + describe(l) + ", want an object with status and records"
	}
	status, _ := l.Get("status").Text()
	recs := l.Get("records")
	switch {
	case status != "recorded" && status != "unavailable":
		return "warmup_evidence.status is " + describe(l.Get("status")) + ", want recorded or unavailable"
	case !recs.IsArray():
		return "warmup_evidence.records is " + describe(recs) + ", want a list"
	case status == "unavailable" && recs.Len() > 0:
		return fmt.Sprintf("unavailable warmup_evidence lists %d records; an unavailable history must stay unknown", recs.Len())
	}
	for i := range recs.Kids {
		r := &recs.Kids[i]
		if !r.IsObject() {
			return fmt.Sprintf("warmup record %d is %s, want an object", i, describe(r))
		}
		st, _ := r.Get("status").Text()
		if !slices.Contains(warmupStatuses, st) {
			return fmt.Sprintf("warmup record %d has status %s, want running, completed or failed", i, describe(r.Get("status")))
		}
		v := r.Get("validation")
		vs, _ := v.Get("status").Text()
		switch {
		case !v.IsObject() || !slices.Contains(validationStatuses, vs):
			return fmt.Sprintf("warmup record %d has validation %s, want an object with status passed, failed or not_performed", i, describe(v))
		case vs == "passed" && st != "completed":
			return fmt.Sprintf("warmup record %d passed validation but has status %s", i, st)
		case vs == "failed" && st != "failed":
			return fmt.Sprintf("warmup record %d failed validation but has status %s", i, st)
		}
		start, end := r.Get("forward_index_start"), r.Get("forward_index_end")
		s, sok := start.Int()
		e, eok := end.Int()
		switch {
		case !start.IsNull() && (!sok || s < 0):
			return fmt.Sprintf("warmup record %d has forward_index_start %s, want an integer >= 0 or null", i, describe(start))
		case !end.IsNull() && (!eok || e < 0):
			return fmt.Sprintf("warmup record %d has forward_index_end %s, want an integer >= 0 or null", i, describe(end))
		case sok && eok && e < s:
			return fmt.Sprintf("warmup record %d has forward range [%d, %d) ending before it starts", i, s, e)
		case st == "completed" && end.IsNull():
			return fmt.Sprintf("warmup record %d is completed but has no forward_index_end", i)
		}
		cnt := r.Get("observed_forward_count")
		if !cnt.IsNull() {
			c, ok := cnt.Int()
			switch {
			case !ok || c < 0:
				return fmt.Sprintf("warmup record %d has observed_forward_count %s, want an integer >= 0 or null", i, describe(cnt))
			case sok && eok && c != e-s:
				return fmt.Sprintf("warmup record %d has observed_forward_count %d but its forward range [%d, %d) holds %d", i, c, s, e, e-s)
			}
		}
	}
	return ""
}

// checkWarmupReference checks a rank-point's warmup_records_before against the rank's ledger (nil when
// the rank's artefact was not loaded): every counted warmup must have finished before the point's first
// raw sample.
func checkWarmupReference(meas, ledger *schemas.BenchNode) string {
	wbNode := meas.Get("preparation").Get("warmup_records_before")
	wb, wbOK := wbNode.Int()
	if !wbNode.IsNull() && (!wbOK || wb < 0) {
		return "preparation.warmup_records_before is " + describe(wbNode) + ", want an integer >= 0 or null"
	}
	if ledger == nil {
		return ""
	}
	status, _ := ledger.Get("status").Text()
	recs := ledger.Get("records")
	if status == "unavailable" {
		if !wbNode.IsNull() {
			return "preparation.warmup_records_before is " + describe(wbNode) + " but the rank's warmup evidence is unavailable"
		}
		return ""
	}
	if wbNode.IsNull() || wb > int64(recs.Len()) {
		return fmt.Sprintf("preparation.warmup_records_before is %s but the rank's ledger records %d warmups", describe(wbNode), recs.Len())
	}
	first, _ := meas.Get("raw_fpms").Kids[0].Get("benchmark_sample").Get("forward_index").Int()
	for i := range int(wb) {
		r := &recs.Kids[i]
		st, _ := r.Get("status").Text()
		if st == "running" {
			return fmt.Sprintf("warmup record %d counted before this point is still running", i)
		}
		if e, ok := r.Get("forward_index_end").Int(); ok && e > first {
			return fmt.Sprintf("warmup record %d counted before this point ends at forward_index %d, after the point's first raw sample at %d", i, e, first)
		}
	}
	return ""
}
