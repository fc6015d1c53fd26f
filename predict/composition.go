package predict

// A mixed step (prefill and decode requests in one forward pass) is never measured: collecting the
// 5-D surface is impractical, so cells hold pure-prefill and pure-decode surfaces and a mixed step is
// composed from them:
//
//	mixed(P, Bd, KVd) = prefill(P) + max(0, decode(Bd, KVd) − decode(Bd, floor(Bd)))
//
// prefill(P) is the prefill surface at the step's three prefill coordinates. The second term is the
// decode surface's marginal cost: the decode latency at the step's decode coordinates minus the decode
// baseline, the same surface at the same number of decode requests Bd and the smallest KV read it
// covers there, floor(Bd):
//
//   - Bd a measured request count: the smallest measured sum_decode_kv_tokens among the rows with Bd
//     requests (the baseline is that row, measured);
//   - Bd between measured counts b0 < Bd < b1: Bd × the larger of the smallest KV reads per request
//     measured at b0 and at b1, the lowest context at which the surface is defined at Bd (the
//     baseline is interpolated between b0 and b1).
//
// The baseline stands for what a decode pass costs besides reading context: the weights read,
// launches and scheduling a mixed step already pays in its prefill part. What remains is the cost of
// the decode requests' context, added once. Noise can put a decode latency below its baseline on a
// flat stretch of the surface; the marginal is then 0 (composition.Clamped), never negative. The
// composition ignores the decode tokens' own share of the linear layers: the proposal's accepted
// mixed-step bias, to be tracked by separate mixed-step residuals.

// composeMixed answers a mixed step. Any part out of domain refuses the whole step.
func (c *cell) composeMixed(a Answer, st Step) Answer {
	raw := stepRow(st)
	pre, d := c.evaluate(rolePrefill, PhasePrefill, rawCoords(PhasePrefill, raw))
	if d != nil {
		return a.refuse(&refusal{Reason: ReasonOutOfDomain, Domain: d, Detail: d.String()})
	}
	dec, d := c.evaluate(roleDecode, PhaseDecode, rawCoords(PhaseDecode, raw))
	if d != nil {
		return a.refuse(&refusal{Reason: ReasonOutOfDomain, Domain: d, Detail: d.String()})
	}
	n := float64(st.NumDecodeRequests)
	floor, v := c.decode.lowerEdge(n)
	var base *part
	if v == nil {
		base, d = c.decode.evaluateGrid(roleDecodeBaseline, []float64{n, floor}, nil)
	} else {
		d = c.decode.domain(roleDecodeBaseline, v, []float64{n, 0}, nil)
	}
	if d != nil {
		return a.refuse(&refusal{Reason: ReasonOutOfDomain, Domain: d, Detail: d.String()})
	}
	comp := &composition{Formula: formulaMixed, PrefillMS: pre.LatencyMS, DecodeMS: dec.LatencyMS, DecodeBaselineMS: base.LatencyMS}
	comp.DecodeMarginalMS = dec.LatencyMS - base.LatencyMS
	if comp.DecodeMarginalMS < 0 {
		comp.DecodeMarginalMS, comp.Clamped = 0, true
	}
	total := pre.LatencyMS + comp.DecodeMarginalMS
	a.Status, a.LatencyMS, a.Composition = StatusComposed, &total, comp
	a.Parts = []part{*pre, *dec, *base}
	return a
}
