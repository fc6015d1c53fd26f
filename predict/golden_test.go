package predict

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"sort"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func prefillStep(n, tok, kv int64) Step {
	return Step{Phase: PhasePrefill, NumPrefillRequests: n, SumPrefillTokens: tok, SumPrefillKVTokens: kv}
}

func decodeStep(n, kv int64) Step {
	return Step{Phase: PhaseDecode, NumDecodeRequests: n, SumDecodeKVTokens: kv}
}

func mixedStep(pn, ptok, pkv, dn, dkv int64) Step {
	return Step{Phase: phaseMixed, NumPrefillRequests: pn, SumPrefillTokens: ptok, SumPrefillKVTokens: pkv, NumDecodeRequests: dn, SumDecodeKVTokens: dkv}
}

// answered fails unless a carries a number and the provenance every answer must show.
func answered(t *testing.T, s *Snapshot, a Answer, status string) float64 {
	t.Helper()
	if a.Refused() || a.LatencyMS == nil {
		t.Fatalf("refused: %+v", a.Refusal)
	}
	if a.Status != status {
		t.Fatalf("status %q, want %q", a.Status, status)
	}
	c := s.Cell(a.Cell.Key)
	if a.Source != Source || a.Bucket != streams.BucketDatasets || c == nil || a.Cell.Revision != c.Revision ||
		a.Cell.DatasetDigest != c.Value.Provenance.DatasetDigest || a.Cell.RunID != c.Value.Provenance.RunID ||
		a.Cell.Identity == nil || a.Cell.Identity.Key() != a.Cell.Key {
		t.Fatalf("provenance %+v / %+v", a, a.Cell)
	}
	return *a.LatencyMS
}

// refused fails unless a is a refusal for reason, without a number.
func refused(t *testing.T, a Answer, reason Reason) *refusal {
	t.Helper()
	if !a.Refused() || a.Refusal == nil || a.Refusal.Reason != reason {
		t.Fatalf("want a %s refusal, got status %q refusal %+v", reason, a.Status, a.Refusal)
	}
	if a.LatencyMS != nil || a.Parts != nil || a.Composition != nil || a.Refusal.Detail == "" {
		t.Fatalf("a refusal carries a number, parts or no detail: %+v", a)
	}
	return a.Refusal
}

// Every measured row of every valid fixture cell is answered exactly: its own latency, measured, with
// the row as its only point.
func TestMeasuredAtEveryRow(t *testing.T) {
	s := fixture(t)
	n := 0
	for _, c := range s.Cells() {
		if !c.Valid() {
			continue
		}
		for _, r := range c.Value.Rows {
			st := stepRow2Step(r)
			a := s.Predict(Query{Key: c.Key, Step: st}, Options{})
			if got := answered(t, s, a, StatusMeasured); got != r.LatencyMS {
				t.Fatalf("%s %+v: %v, measured %v", c.Key, r, got, r.LatencyMS)
			}
			if len(a.Parts) != 1 || len(a.Parts[0].Points) != 1 || a.Parts[0].Points[0].Row != r || a.Parts[0].Points[0].Weight != 1 {
				t.Fatalf("points %+v", a.Parts)
			}
			// Asked by identity instead of key: the same answer.
			id := c.Value.Identity
			b := s.Predict(Query{Identity: &id, Step: st}, Options{})
			if answered(t, s, b, StatusMeasured) != r.LatencyMS {
				t.Fatalf("by identity: %+v", b)
			}
			n++
		}
	}
	if n != len(prefillA)+len(decodeA)+2+3 {
		t.Fatalf("checked %d rows", n)
	}
}

func stepRow2Step(r schemas.Row) Step {
	if r.Phase == PhasePrefill {
		return prefillStep(r.NumPrefillRequests, r.SumPrefillTokens, r.SumPrefillKVTokens)
	}
	return decodeStep(r.NumDecodeRequests, r.SumDecodeKVTokens)
}

// Interpolated answers equal values computed by hand from the fixture table, lie within the measured
// values of the points they use, and name those points with weights that sum to 1.
func TestInterpolatedHandComputed(t *testing.T) {
	s := fixture(t)
	type pt struct {
		row schemas.Row
		w   float64
	}
	cases := map[string]struct {
		step   Step
		want   float64
		points []pt
	}{
		// 2 requests, 320 tokens per request (halfway between 128 and 512), no cached KV:
		// 12 + 0.5·(34 − 12) = 23.
		"prefill, linear in tokens at a measured batch": {prefillStep(2, 640, 0), 23,
			[]pt{{prefillRow(2, 128, 0, 12), 0.5}, {prefillRow(2, 512, 0, 34), 0.5}}},
		// 3 requests (halfway between 2 and 4), 128 tokens per request: 0.5·12 + 0.5·16 = 14.
		"prefill, linear in requests": {prefillStep(3, 384, 0), 14,
			[]pt{{prefillRow(2, 128, 0, 12), 0.5}, {prefillRow(4, 128, 0, 16), 0.5}}},
		// 3 requests, 320 tokens and 512 cached per request: the centre of the 2×2×2 box:
		// at 2 requests (12+34+20+50)/4 = 29, at 4 (16+58+30+90)/4 = 48.5, blended 38.75.
		"prefill, trilinear at the centre of a grid box": {prefillStep(3, 960, 1536), 38.75,
			[]pt{{prefillRow(2, 128, 0, 12), 0.125}, {prefillRow(2, 128, 1024, 20), 0.125}, {prefillRow(2, 512, 0, 34), 0.125},
				{prefillRow(2, 512, 1024, 50), 0.125}, {prefillRow(4, 128, 0, 16), 0.125}, {prefillRow(4, 128, 1024, 30), 0.125},
				{prefillRow(4, 512, 0, 58), 0.125}, {prefillRow(4, 512, 1024, 90), 0.125}}},
		// 1 request, 224 tokens (a quarter of 128..512), 256 cached (a quarter of 0..1024):
		// 10·(3/4)(3/4) + 22·(1/4)(3/4) + 14·(3/4)(1/4) + 30·(1/4)(1/4) = 5.625 + 4.125 + 2.625 + 1.875 = 14.25.
		"prefill, bilinear off-centre": {prefillStep(1, 224, 256), 14.25,
			[]pt{{prefillRow(1, 128, 0, 10), 0.5625}, {prefillRow(1, 128, 1024, 14), 0.1875}, {prefillRow(1, 512, 0, 22), 0.1875},
				{prefillRow(1, 512, 1024, 30), 0.0625}}},
		// 8 requests, 2560 KV per request (halfway between 1024 and 4096): (7 + 12)/2 = 9.5.
		"decode, linear in KV": {decodeStep(8, 20480), 9.5,
			[]pt{{decodeRow(8, 1024, 7), 0.5}, {decodeRow(8, 4096, 12), 0.5}}},
		// 20 requests (halfway between 8 and 32), 1024 KV per request: (7 + 10)/2 = 8.5.
		"decode, linear in requests": {decodeStep(20, 20480), 8.5,
			[]pt{{decodeRow(8, 1024, 7), 0.5}, {decodeRow(32, 1024, 10), 0.5}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := s.Predict(Query{Key: keyA, Step: tc.step}, Options{})
			got := answered(t, s, a, StatusInterpolated)
			if math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("latency %v, hand-computed %v", got, tc.want)
			}
			p := a.Parts[0]
			if p.Status != StatusInterpolated || p.LatencyMS != got || len(p.Points) != len(tc.points) {
				t.Fatalf("part %+v", p)
			}
			lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
			for _, q := range p.Points {
				lo, hi, sum = min(lo, q.LatencyMS), max(hi, q.LatencyMS), sum+q.Weight
			}
			if got < lo || got > hi || math.Abs(sum-1) > 1e-12 {
				t.Fatalf("latency %v outside the enclosing measured values [%v, %v], weights sum %v", got, lo, hi, sum)
			}
			want := map[schemas.Row]float64{}
			for _, q := range tc.points {
				want[q.row] = q.w
			}
			for _, q := range p.Points {
				if w, ok := want[q.Row]; !ok || math.Abs(w-q.Weight) > 1e-12 {
					t.Fatalf("point %+v (weight %v) not among the expected %+v", q.Row, q.Weight, tc.points)
				}
			}
		})
	}
}

// A mixed step is the prefill part plus the decode marginal: decode at the step's decode coordinates
// minus the decode baseline at the same request count and the smallest KV read covered there.
func TestMixedComposition(t *testing.T) {
	s := fixture(t)
	cases := map[string]struct {
		step                             Step
		prefill, decode, baseline, total float64
		prefillSt, decodeSt, baselineSt  string
		baselineAt                       map[string]float64
		baselinePoints                   int
	}{
		// prefill (1, 128, 0) = 10 measured; decode (8, 8·4096) = 12 measured; baseline (8, 8·1024) = 7
		// measured: 10 + (12 − 7) = 15.
		"measured parts": {mixedStep(1, 128, 0, 8, 32768), 10, 12, 7, 15, StatusMeasured, StatusMeasured, StatusMeasured,
			map[string]float64{"num_decode_requests": 8, "sum_decode_kv_tokens": 8192}, 1},
		// prefill (3, 384, 0) = 14 interpolated; decode (20, 20·4096) = (12 + 26)/2 = 19; baseline at 20
		// requests × max(1024, 1024) per request = (7 + 10)/2 = 8.5: 14 + (19 − 8.5) = 24.5.
		"interpolated parts": {mixedStep(3, 384, 0, 20, 81920), 14, 19, 8.5, 24.5, StatusInterpolated, StatusInterpolated, StatusInterpolated,
			map[string]float64{"num_decode_requests": 20, "sum_decode_kv_tokens": 20480}, 2},
		// decode at the baseline itself: the marginal is 0 and the step costs its prefill.
		"decode at its baseline": {mixedStep(2, 1024, 0, 1, 1024), 34, 6, 6, 34, StatusMeasured, StatusMeasured, StatusMeasured,
			map[string]float64{"num_decode_requests": 1, "sum_decode_kv_tokens": 1024}, 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := s.Predict(Query{Key: keyA, Step: tc.step}, Options{})
			got := answered(t, s, a, StatusComposed)
			c := a.Composition
			if c == nil || c.Formula != formulaMixed || c.PrefillMS != tc.prefill || c.DecodeMS != tc.decode || c.DecodeBaselineMS != tc.baseline ||
				c.DecodeMarginalMS != tc.decode-tc.baseline || c.Clamped {
				t.Fatalf("composition %+v", c)
			}
			if got != tc.total || got != c.PrefillMS+c.DecodeMarginalMS {
				t.Fatalf("total %v, want %v = %v + %v", got, tc.total, c.PrefillMS, c.DecodeMarginalMS)
			}
			if len(a.Parts) != 3 {
				t.Fatalf("parts %+v", a.Parts)
			}
			for i, want := range []struct {
				role, status string
				ms           float64
			}{{rolePrefill, tc.prefillSt, tc.prefill}, {roleDecode, tc.decodeSt, tc.decode}, {roleDecodeBaseline, tc.baselineSt, tc.baseline}} {
				p := a.Parts[i]
				if p.Role != want.role || p.Status != want.status || p.LatencyMS != want.ms {
					t.Fatalf("part %d: %+v, want %+v", i, p, want)
				}
			}
			b := a.Parts[2]
			if len(b.Points) != tc.baselinePoints || b.At["num_decode_requests"] != tc.baselineAt["num_decode_requests"] ||
				math.Abs(b.At["sum_decode_kv_tokens"]-tc.baselineAt["sum_decode_kv_tokens"]) > 1e-9 {
				t.Fatalf("baseline part %+v", b)
			}
		})
	}
}

// A decode latency below its baseline (noise on a flat stretch) adds nothing, never a negative cost.
func TestMixedClampsNegativeMarginal(t *testing.T) {
	s := fixture(t)
	a := s.Predict(Query{Key: keyClamp, Step: mixedStep(1, 128, 0, 4, 8192)}, Options{})
	got := answered(t, s, a, StatusComposed)
	if c := a.Composition; got != 10 || !c.Clamped || c.DecodeMS != 8 || c.DecodeBaselineMS != 9 || c.DecodeMarginalMS != 0 {
		t.Fatalf("latency %v, composition %+v", got, c)
	}
}

func TestRefusesOutOfDomain(t *testing.T) {
	s := fixture(t)
	cases := map[string]struct {
		key                string
		step               Step
		role, coord, bound string
		value, limit       float64
		perRequestLimit    float64
	}{
		"more prefill requests than measured":    {keyA, prefillStep(5, 640, 0), rolePrefill, "num_prefill_requests", boundUpper, 5, 4, 0},
		"more tokens per request than measured":  {keyA, prefillStep(2, 1100, 0), rolePrefill, "sum_prefill_tokens", boundUpper, 1100, 1024, 512},
		"fewer tokens per request than measured": {keyA, prefillStep(4, 400, 0), rolePrefill, "sum_prefill_tokens", boundLower, 400, 512, 128},
		"more cached KV than measured":           {keyA, prefillStep(1, 128, 2048), rolePrefill, "sum_prefill_kv_tokens", boundUpper, 2048, 1024, 1024},
		"more decode requests than measured":     {keyA, decodeStep(64, 65536), roleDecode, "num_decode_requests", boundUpper, 64, 32, 0},
		"less decode context than measured":      {keyA, decodeStep(8, 4096), roleDecode, "sum_decode_kv_tokens", boundLower, 4096, 8192, 1024},
		"mixed with its decode part outside":     {keyA, mixedStep(1, 128, 0, 8, 40960), roleDecode, "sum_decode_kv_tokens", boundUpper, 40960, 32768, 4096},
		"mixed with its prefill part outside":    {keyA, mixedStep(8, 1024, 0, 8, 8192), rolePrefill, "num_prefill_requests", boundUpper, 8, 4, 0},
		"a decode step on a prefill-only cell":   {keyB, decodeStep(1, 1024), roleDecode, "phase", boundAbsent, 0, 0, 0},
		"a mixed step on a prefill-only cell":    {keyB, mixedStep(1, 128, 0, 1, 1024), roleDecode, "phase", boundAbsent, 0, 0, 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := s.Predict(Query{Key: tc.key, Step: tc.step}, Options{})
			r := refused(t, a, ReasonOutOfDomain)
			d := r.Domain
			if d == nil || d.Role != tc.role || d.Coordinate != tc.coord || d.Bound != tc.bound || d.Value != tc.value || d.Limit != tc.limit {
				t.Fatalf("domain %+v", d)
			}
			if (tc.perRequestLimit != 0) != (d.PerRequest != nil) || d.PerRequest != nil && d.PerRequest.Limit != tc.perRequestLimit {
				t.Fatalf("per request %+v, want limit %v", d.PerRequest, tc.perRequestLimit)
			}
			if a.Cell == nil || a.Cell.Key != tc.key || a.Cell.Revision == 0 {
				t.Fatalf("a domain refusal names its cell: %+v", a.Cell)
			}
		})
	}
	// Between 2 and 4 requests the domain is what both batch sizes cover; the slice is named.
	a := s.Predict(Query{Key: keyA, Step: prefillStep(3, 3*600, 0)}, Options{})
	if d := refused(t, a, ReasonOutOfDomain).Domain; d.Slice["num_prefill_requests"] != 2 || d.PerRequest.Value != 600 || d.Limit != 3*512 {
		t.Fatalf("domain %+v", d)
	}
}

func TestRefusesUnknownIdentityWithClosest(t *testing.T) {
	s := fixture(t)
	id := fixtureIdentity("fixture/model-a", 2) // sealed at tp4 and tp8, not tp2
	a := s.Predict(Query{Identity: &id, Step: prefillStep(1, 128, 0)}, Options{})
	r := refused(t, a, ReasonUnknownIdentity)
	if a.Cell == nil || a.Cell.Key != id.Key() || len(r.Closest) != maxClosest {
		t.Fatalf("cell %+v closest %+v", a.Cell, r.Closest)
	}
	// tp4 and tp8 differ in tp and moe_tp only; model-d in those and the model (the corrupt cell is
	// not a candidate).
	var firstTwo []string
	for _, m := range r.Closest[:2] {
		if len(m.Differs) != 2 || m.Differs[0].Field != "parallelism.moe_tp" || m.Differs[1].Field != "parallelism.tp" || m.Differs[1].Query != "2" {
			t.Fatalf("closest %+v", m)
		}
		firstTwo = append(firstTwo, m.Key)
	}
	sort.Strings(firstTwo)
	want := []string{keyA, keyB}
	sort.Strings(want)
	if firstTwo[0] != want[0] || firstTwo[1] != want[1] || r.Closest[2].Key != keyClamp || len(r.Closest[2].Differs) != 3 {
		t.Fatalf("closest %+v", r.Closest)
	}
	// A key alone that nothing is sealed under: unknown, no identity to compare.
	b := s.Predict(Query{Key: "cell." + id.SettingsDigest, Step: prefillStep(1, 128, 0)}, Options{})
	if r := refused(t, b, ReasonUnknownIdentity); r.Closest != nil {
		t.Fatalf("closest %+v", r.Closest)
	}
}

func TestRefusesWrongIdentity(t *testing.T) {
	s := fixture(t)
	good := fixtureIdentity("fixture/model-a", 4)
	cases := map[string]Query{
		"empty model": {Identity: func() *schemas.CellIdentity { id := good; id.Model = ""; return &id }()},
		"parallelism below one": {Identity: func() *schemas.CellIdentity {
			id := good
			id.Parallelism.TP = 0
			return &id
		}()},
		"unsupported schema version": {Identity: func() *schemas.CellIdentity { id := good; id.SchemaVersion = 2; return &id }()},
		"a host name as hardware":    {Identity: func() *schemas.CellIdentity { id := good; id.Hardware = "gpu1.local"; return &id }()},
		"key and identity disagree":  {Identity: &good, Key: keyB},
		"not a cell key":             {Key: "campaign.camp-complete"},
	}
	for name, q := range cases {
		t.Run(name, func(t *testing.T) {
			q.Step = prefillStep(1, 128, 0)
			refused(t, s.Predict(q, Options{}), reasonWrongIdentity)
		})
	}
}

func TestRefusesUnsupportedFeature(t *testing.T) {
	s := fixture(t)
	cases := map[string]struct {
		q    Query
		want []string
	}{
		"speculative decoding": {Query{Key: keyA, Step: decodeStep(8, 8192), Features: []string{"speculative_decoding"}}, []string{"speculative_decoding"}},
		"two features":         {Query{Key: keyA, Step: prefillStep(1, 128, 0), Features: []string{"lora", "multimodal_encoder"}}, []string{"lora", "multimodal_encoder"}},
		"an unmodelled phase":  {Query{Key: keyA, Step: Step{Phase: "verify", NumDecodeRequests: 1, SumDecodeKVTokens: 10}}, []string{"phase:verify"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := s.Predict(tc.q, Options{})
			r := refused(t, a, reasonUnsupportedFeature)
			if a.Cell == nil || a.Cell.Key != keyA || a.Cell.DatasetDigest == "" {
				t.Fatalf("the refusal does not name the cell asked for: %+v", a.Cell)
			}
			if len(r.Features) != len(tc.want) {
				t.Fatalf("features %v", r.Features)
			}
			for i := range tc.want {
				if r.Features[i] != tc.want[i] {
					t.Fatalf("features %v", r.Features)
				}
			}
		})
	}
}

func TestRefusesCorruptCell(t *testing.T) {
	s := fixture(t)
	// The altered fixture: its stored digest is not the digest of its identity and rows.
	a := s.Predict(Query{Key: keyCorrupt, Step: prefillStep(1, 128, 0)}, Options{})
	r := refused(t, a, reasonCorruptCell)
	if len(r.Rules) != 1 || r.Rules[0] != string(schemas.RuleDigest) || a.Cell.Key != keyCorrupt || a.Cell.Revision != 3 {
		t.Fatalf("rules %v cell %+v", r.Rules, a.Cell)
	}
	// Other corruptions, each the first revision of cell A's key (a later one would be ignored).
	var v schemas.SealedCell
	if err := json.Unmarshal(readFixture(t, fixturePath)[0].Value, &v); err != nil {
		t.Fatal(err)
	}
	enc := func(f func(*schemas.SealedCell)) []byte {
		c := v
		c.Rows = append([]schemas.Row(nil), v.Rows...)
		f(&c)
		b, _ := json.Marshal(c)
		return b
	}
	cases := map[string]struct {
		value []byte
		rule  schemas.Rule
	}{
		"not JSON":                 {[]byte(`{"schema_version":1,`), schemas.RuleSchema},
		"an unknown field":         {[]byte(`{"extra":1,` + string(enc(func(*schemas.SealedCell) {})[1:])), schemas.RuleSchema},
		"stored under another key": {enc(func(c *schemas.SealedCell) { c.Key = keyB }), schemas.RuleIdentity},
		"a row removed":            {enc(func(c *schemas.SealedCell) { c.Rows = c.Rows[1:] }), schemas.RuleRowCount},
		"a latency changed":        {enc(func(c *schemas.SealedCell) { c.Rows[0].LatencyMS++ }), schemas.RuleDigest},
		"the identity changed":     {enc(func(c *schemas.SealedCell) { c.Identity.BackendVersion = "0.30.0" }), schemas.RuleIdentity},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s2 := (*Snapshot)(nil).Apply(Update{Key: keyA, Revision: 99, Value: tc.value})
			a := s2.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{})
			r := refused(t, a, reasonCorruptCell)
			found := false
			for _, rule := range r.Rules {
				found = found || rule == string(tc.rule)
			}
			if !found || a.Cell.Revision != 99 {
				t.Fatalf("rules %v (want %s), revision %d", r.Rules, tc.rule, a.Cell.Revision)
			}
		})
	}
}

func TestRefusesIncompleteCampaign(t *testing.T) {
	s := fixture(t)
	q := Query{Key: keyB, Step: prefillStep(1, 128, 0)}
	// Without the requirement, the partial campaign's sealed cell answers.
	answered(t, s, s.Predict(q, Options{}), StatusMeasured)
	for name, ask := range map[string]func() Answer{
		"required by the caller": func() Answer { return s.Predict(q, Options{RequireComplete: true}) },
		"required by the query":  func() Answer { q := q; q.RequireComplete = true; return s.Predict(q, Options{}) },
	} {
		t.Run(name, func(t *testing.T) {
			r := refused(t, ask(), ReasonIncompleteCampaign)
			if r.Campaign == nil || r.Campaign.ID != "camp-partial" || r.Campaign.State != schemas.CampaignPartial || len(r.Campaign.Missing) != 1 || r.Campaign.Revision != 8 {
				t.Fatalf("campaign %+v", r.Campaign)
			}
		})
	}
	// A complete campaign passes.
	answered(t, s, s.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{RequireComplete: true}), StatusMeasured)
	// A campaign without a record, or whose record starts unreadable, is not complete; a delete
	// marker or an unreadable value after a complete record is tampering and changes nothing.
	var without []Update
	for _, u := range readFixture(t, fixturePath) {
		if u.Key != "campaign.camp-complete" {
			without = append(without, u)
		}
	}
	gone := (*Snapshot)(nil).Apply(without...)
	if r := refused(t, gone.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{RequireComplete: true}), ReasonIncompleteCampaign); r.Campaign.State != "absent" {
		t.Fatalf("campaign %+v", r.Campaign)
	}
	bad := gone.Apply(Update{Key: "campaign.camp-complete", Revision: 8, Value: []byte(`{`)})
	if r := refused(t, bad.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{RequireComplete: true}), ReasonIncompleteCampaign); r.Campaign.State != "unreadable" {
		t.Fatalf("campaign %+v", r.Campaign)
	}
	tampered := s.Apply(Update{Key: "campaign.camp-complete", Revision: 7, Deleted: true}, Update{Key: "campaign.camp-complete", Revision: 8, Value: []byte(`{`)})
	answered(t, tampered, tampered.Predict(Query{Key: keyA, Step: prefillStep(1, 128, 0)}, Options{RequireComplete: true}), StatusMeasured)
	if n := len(tampered.Ignored()); n != 2 {
		t.Fatalf("%d updates ignored, want the delete marker and the unreadable value", n)
	}
}

func TestRefusesInvalidQuery(t *testing.T) {
	s := fixture(t)
	cases := map[string]Query{
		"no deployment":                {Step: prefillStep(1, 128, 0)},
		"no coordinates":               {Key: keyA},
		"zero prefill requests":        {Key: keyA, Step: Step{Phase: PhasePrefill, SumPrefillTokens: 128}},
		"fewer tokens than requests":   {Key: keyA, Step: prefillStep(4, 2, 0)},
		"negative cached KV":           {Key: keyA, Step: prefillStep(1, 128, -1)},
		"a prefill step with decode":   {Key: keyA, Step: Step{Phase: PhasePrefill, NumPrefillRequests: 1, SumPrefillTokens: 128, NumDecodeRequests: 1, SumDecodeKVTokens: 1}},
		"a decode step with prefill":   {Key: keyA, Step: Step{Phase: PhaseDecode, NumDecodeRequests: 1, SumDecodeKVTokens: 8, SumPrefillTokens: 1}},
		"less decode KV than requests": {Key: keyA, Step: decodeStep(8, 4)},
		"a mixed step without decode":  {Key: keyA, Step: Step{Phase: phaseMixed, NumPrefillRequests: 1, SumPrefillTokens: 128}},
	}
	for name, q := range cases {
		t.Run(name, func(t *testing.T) { refused(t, s.Predict(q, Options{}), ReasonInvalidQuery) })
	}
	if _, err := DecodeQuery([]byte(`{"key":"x","step":{},"bogus":1}`)); err == nil {
		t.Fatal("an unknown field decodes")
	}
}

// The phase is inferred from the coordinates when the query leaves it out, and echoed.
func TestPhaseInferred(t *testing.T) {
	s := fixture(t)
	for want, st := range map[string]Step{
		PhasePrefill: {NumPrefillRequests: 1, SumPrefillTokens: 128},
		PhaseDecode:  {NumDecodeRequests: 8, SumDecodeKVTokens: 8192},
		phaseMixed:   {NumPrefillRequests: 1, SumPrefillTokens: 128, NumDecodeRequests: 8, SumDecodeKVTokens: 8192},
	} {
		a := s.Predict(Query{Key: keyA, Step: st}, Options{})
		if a.Refused() || a.Query.Step.Phase != want {
			t.Fatalf("%s: %+v", want, a)
		}
	}
}

// testdata/queries.jsonl answered from the fixture bucket is testdata/answers.golden.jsonl, byte for
// byte: the JSON shape of every status and refusal reason. -update rewrites the golden file.
func TestGoldenAnswers(t *testing.T) {
	s := fixture(t)
	f, err := os.Open("testdata/queries.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got bytes.Buffer
	sc := bufio.NewScanner(f)
	reasons := map[Reason]bool{}
	statuses := map[string]bool{}
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		q, err := DecodeQuery(line)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		a := s.Predict(q, Options{})
		statuses[a.Status] = true
		if a.Refusal != nil {
			reasons[a.Refusal.Reason] = true
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(b)
		got.WriteByte('\n')
	}
	if len(statuses) != 4 || len(reasons) != 7 {
		t.Fatalf("the golden queries cover statuses %v and reasons %v: want all four statuses and all seven reasons", statuses, reasons)
	}
	if *update {
		if err := os.WriteFile("testdata/answers.golden.jsonl", got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/answers.golden.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("answers differ from testdata/answers.golden.jsonl (rerun with -update after checking):\n%s", got.String())
	}
}
