package predict

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

// Property tests over random grids (fixed seeds, so a failure reproduces): tensor grids and grids
// whose batch sizes cover different token ranges, each sealed, loaded and queried through the public
// path (loadCell, Snapshot.Predict).

const propertySeeds = 40

// randomCell is a random valid sealed cell. With probability ½ per surface the token values are
// shared by every batch size (a tensor grid in per-request coordinates), else drawn per batch size.
func randomCell(t *testing.T, seed uint64) (*Snapshot, string, []schemas.Row) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(from []int64, lo, hi int) []int64 {
		n := lo + rng.IntN(hi-lo+1)
		perm := rng.Perm(len(from))
		out := make([]int64, n)
		for i := range out {
			out[i] = from[perm[i]]
		}
		return out
	}
	lat := func() float64 { return math.Round((1+rng.Float64()*99)*1000) / 1000 }
	batches := []int64{1, 2, 3, 4, 6, 8, 12, 16, 32, 64}
	var rows []schemas.Row
	// Prefill: requests × tokens per request × cached KV per request.
	tensor := rng.IntN(2) == 0
	toks, kvs := pick([]int64{16, 64, 128, 256, 512, 1024, 2048}, 1, 3), pick([]int64{0, 128, 512, 1024, 4096}, 1, 3)
	for _, b := range pick(batches, 1, 4) {
		if !tensor {
			toks = pick([]int64{16, 64, 128, 256, 512, 1024, 2048}, 1, 3)
		}
		for _, tk := range toks {
			if !tensor {
				kvs = pick([]int64{0, 128, 512, 1024, 4096}, 1, 3)
			}
			for _, kv := range kvs {
				rows = append(rows, prefillRow(b, tk, kv, lat()))
			}
		}
	}
	// Decode: requests × KV per request.
	tensor = rng.IntN(2) == 0
	ctxs := pick([]int64{64, 256, 1024, 4096, 16384}, 1, 3)
	for _, b := range pick(batches, 1, 4) {
		if !tensor {
			ctxs = pick([]int64{64, 256, 1024, 4096, 16384}, 1, 3)
		}
		for _, c := range ctxs {
			rows = append(rows, decodeRow(b, c, lat()))
		}
	}
	sc := sealed(fixtureIdentity(fmt.Sprintf("random/seed-%d", seed), 1), fmt.Sprintf("run-%d", seed), "", rows)
	b, err := json.Marshal(sc)
	if err != nil {
		t.Fatal(err)
	}
	s := (*Snapshot)(nil).Apply(Update{Key: sc.Key, Revision: seed, Value: b})
	if c := s.Cell(sc.Key); !c.Valid() {
		t.Fatalf("seed %d: random cell invalid: %v", seed, c.Problems)
	}
	return s, sc.Key, sc.Rows
}

// box is the bounding box of one surface's rows in grid coordinates.
type box struct{ lo, hi []float64 }

func boundingBox(phase string, rows []schemas.Row) (box, bool) {
	n := 3
	if phase == PhaseDecode {
		n = 2
	}
	b := box{make([]float64, n), make([]float64, n)}
	for i := range n {
		b.lo[i], b.hi[i] = math.Inf(1), math.Inf(-1)
	}
	found := false
	for _, r := range rows {
		if r.Phase != phase {
			continue
		}
		found = true
		for i, v := range gridCoords(n, rawCoords(phase, r)) {
			b.lo[i], b.hi[i] = min(b.lo[i], v), max(b.hi[i], v)
		}
	}
	return b, found
}

// Every measured row is answered with its own latency, measured.
func TestPropertyExactAtGridPoints(t *testing.T) {
	for seed := uint64(1); seed <= propertySeeds; seed++ {
		s, key, rows := randomCell(t, seed)
		for _, r := range rows {
			a := s.Predict(Query{Key: key, Step: stepRow2Step(r)}, Options{})
			if a.Status != StatusMeasured || *a.LatencyMS != r.LatencyMS {
				t.Fatalf("seed %d row %+v: %s %v", seed, r, a.Status, a.LatencyMS)
			}
		}
	}
}

// Random queries, inside and well outside the grid: an answer is a convex combination of measured
// rows that enclose the query on every coordinate and lies within their latencies; a query outside
// the bounding box of the measured rows is always refused, with no number.
func TestPropertyNeverANumberOutsideTheDomain(t *testing.T) {
	answeredN, refusedN := 0, 0
	for seed := uint64(1); seed <= propertySeeds; seed++ {
		s, key, rows := randomCell(t, seed)
		rng := rand.New(rand.NewPCG(seed, 0xd0))
		for _, phase := range []string{PhasePrefill, PhaseDecode} {
			bb, _ := boundingBox(phase, rows)
			for range 400 {
				// Coordinates from 0.5× the smallest to 1.5× the largest measured value.
				x := make([]float64, len(bb.lo))
				for i := range x {
					x[i] = bb.lo[i]*0.5 + rng.Float64()*(bb.hi[i]*1.5-bb.lo[i]*0.5)
				}
				n := max(1, int64(math.Round(x[0])))
				var st Step
				if phase == PhasePrefill {
					tok := max(n, int64(math.Round(x[1]*float64(n))))
					st = prefillStep(n, tok, int64(math.Round(x[2]*float64(n))))
				} else {
					st = decodeStep(n, max(n, int64(math.Round(x[1]*float64(n)))))
				}
				a := s.Predict(Query{Key: key, Step: st}, Options{})
				g := gridCoords(len(bb.lo), rawCoords(phase, stepRow(st)))
				outside := false
				for i := range g {
					outside = outside || g[i] < bb.lo[i] || g[i] > bb.hi[i]
				}
				if a.Refused() {
					if a.LatencyMS != nil || a.Refusal.Reason != ReasonOutOfDomain || a.Refusal.Domain == nil {
						t.Fatalf("seed %d %+v: refusal %+v with latency %v", seed, st, a.Refusal, a.LatencyMS)
					}
					refusedN++
					continue
				}
				if outside {
					t.Fatalf("seed %d: %+v outside the measured box %+v answered %v", seed, st, bb, *a.LatencyMS)
				}
				answeredN++
				p := a.Parts[0]
				lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
				hullLo, hullHi := make([]float64, len(g)), make([]float64, len(g))
				for i := range g {
					hullLo[i], hullHi[i] = math.Inf(1), math.Inf(-1)
				}
				for _, pt := range p.Points {
					if pt.Weight < 0 || pt.Weight > 1 {
						t.Fatalf("seed %d: weight %v", seed, pt.Weight)
					}
					lo, hi, sum = min(lo, pt.LatencyMS), max(hi, pt.LatencyMS), sum+pt.Weight
					for i, v := range gridCoords(len(g), rawCoords(phase, pt.Row)) {
						hullLo[i], hullHi[i] = min(hullLo[i], v), max(hullHi[i], v)
					}
				}
				const eps = 1e-9
				if math.Abs(sum-1) > eps || *a.LatencyMS < lo-eps || *a.LatencyMS > hi+eps || len(p.Points) > 1<<len(g) {
					t.Fatalf("seed %d %+v: %v from points %+v (weights sum %v)", seed, st, *a.LatencyMS, p.Points, sum)
				}
				for i := range g {
					if g[i] < hullLo[i]-eps || g[i] > hullHi[i]+eps {
						t.Fatalf("seed %d %+v: coordinate %d = %v not enclosed by the points used [%v, %v]", seed, st, i, g[i], hullLo[i], hullHi[i])
					}
				}
			}
		}
	}
	// The properties are not vacuous: both outcomes occur often.
	if answeredN < 1000 || refusedN < 1000 {
		t.Fatalf("answered %d, refused %d", answeredN, refusedN)
	}
}

// The surface is continuous across the boundaries of grid boxes: at a measured value of one
// coordinate (the other coordinates anywhere in the domain), stepping ε to either side changes the
// latency by at most the steepest slope on the surface times ε. A jump (a wrong box, a stale weight)
// would be of the order of the latency differences between rows.
func TestPropertyContinuousAcrossBoxBoundaries(t *testing.T) {
	checks := 0
	for seed := uint64(1); seed <= propertySeeds; seed++ {
		s, key, _ := randomCell(t, seed)
		c := s.Cell(key)
		rng := rand.New(rand.NewPCG(seed, 0xc0))
		for _, sf := range []*surface{c.prefill, c.decode} {
			d := len(sf.axes)
			// The steepest slope along any coordinate: the largest latency range over the smallest gap.
			minGap, latLo, latHi := math.Inf(1), math.Inf(1), math.Inf(-1)
			var gaps func(l *level)
			gaps = func(l *level) {
				for i := 1; i < len(l.values); i++ {
					minGap = min(minGap, l.values[i]-l.values[i-1])
				}
				for _, n := range l.next {
					gaps(n)
				}
			}
			gaps(sf.root)
			for _, r := range sf.rows {
				latLo, latHi = min(latLo, r.LatencyMS), max(latHi, r.LatencyMS)
			}
			eps := 1e-7 * minGap
			tol := (latHi-latLo)/minGap*eps*1.0001 + 1e-9
			bb, _ := boundingBox(sf.phase, sf.rows)
			for range 300 {
				// A measured row's coordinate on one axis; the others random within the box.
				r := sf.rows[rng.IntN(len(sf.rows))]
				on := gridCoords(d, rawCoords(sf.phase, r))
				axis := rng.IntN(d)
				x := make([]float64, d)
				for i := range x {
					x[i] = bb.lo[i] + rng.Float64()*(bb.hi[i]-bb.lo[i])
				}
				x[axis] = on[axis]
				at, v0 := sf.eval(x)
				if v0 != nil {
					continue
				}
				f0 := sf.value(at)
				for _, dir := range []float64{-1, 1} {
					y := append([]float64(nil), x...)
					y[axis] += dir * eps
					cs, v := sf.eval(y)
					if v != nil {
						continue // the domain's edge
					}
					if f := sf.value(cs); math.Abs(f-f0) > tol {
						t.Fatalf("seed %d %s: f(%v) = %v but f(%v) = %v (tolerance %v)", seed, sf.phase, x, f0, y, f, tol)
					}
					checks++
				}
			}
		}
	}
	if checks < 2000 {
		t.Fatalf("only %d continuity checks ran", checks)
	}
}

// A mixed step's answer is its stated composition on every random grid.
func TestPropertyMixedIsItsComposition(t *testing.T) {
	n := 0
	for seed := uint64(1); seed <= propertySeeds; seed++ {
		s, key, rows := randomCell(t, seed)
		rng := rand.New(rand.NewPCG(seed, 0x31))
		var pre, dec []schemas.Row
		for _, r := range rows {
			if r.Phase == PhasePrefill {
				pre = append(pre, r)
			} else {
				dec = append(dec, r)
			}
		}
		for range 50 {
			p, d := pre[rng.IntN(len(pre))], dec[rng.IntN(len(dec))]
			st := mixedStep(p.NumPrefillRequests, p.SumPrefillTokens, p.SumPrefillKVTokens, d.NumDecodeRequests, d.SumDecodeKVTokens)
			a := s.Predict(Query{Key: key, Step: st}, Options{})
			if a.Refused() {
				t.Fatalf("seed %d: measured parts refused: %+v", seed, a.Refusal)
			}
			c := a.Composition
			if *a.LatencyMS != c.PrefillMS+c.DecodeMarginalMS || c.PrefillMS != p.LatencyMS || c.DecodeMS != d.LatencyMS ||
				c.DecodeMarginalMS != max(0, c.DecodeMS-c.DecodeBaselineMS) || c.Clamped != (c.DecodeMS < c.DecodeBaselineMS) ||
				a.Parts[2].Status != StatusMeasured {
				t.Fatalf("seed %d: %v from %+v", seed, *a.LatencyMS, c)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no mixed step checked")
	}
}
