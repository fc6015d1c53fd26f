package predict

import (
	"fmt"
	"sort"

	"github.com/fpmbus/fpmbus/schemas"
)

// A surface is one phase's measured rows of a cell, arranged for interpolation.
//
// # Coordinates
//
// The grid is spanned by the number of requests and the token coordinates per request: a prefill row
// sits at (num_prefill_requests, sum_prefill_tokens/n, sum_prefill_kv_tokens/n), a decode row at
// (num_decode_requests, sum_decode_kv_tokens/n). Collection grids are planned per request (batch size ×
// input length × prefix length, batch size × context length), so in these coordinates a planned grid is
// a tensor product; in raw sums every batch size would have its own token range and the ranges of two
// neighbouring batch sizes would barely overlap.
//
// # Nested linear interpolation
//
// The rows form a tree: by request count, then (within one count) by the first token coordinate, then
// by the second. Evaluating x = (x0, x1, …) at a level whose measured values are v0 < v1 < … :
//
//   - x0 equal to a measured vi: descend into vi's subtree alone (its weight is 1);
//   - vi < x0 < vi+1: evaluate both subtrees at the remaining coordinates and blend them linearly,
//     f = (1−t)·f(vi) + t·f(vi+1), t = (x0 − vi)/(vi+1 − vi);
//   - x0 below v0 or above the last value: out of domain at that level, never extrapolated.
//
// On a full tensor grid this is exactly multilinear interpolation (piecewise linear in each
// coordinate between the enclosing grid points), whatever the order of the coordinates. When batch
// sizes were measured over different token ranges (a grid that is not a tensor product), it still
// uses only measured rows that enclose the query, and the domain between two batch sizes is the
// intersection of their ranges. The result is a convex combination of at most 2^d measured rows
// (d = 3 for prefill, 2 for decode), exact at every row, continuous inside the domain, and linear
// along each coordinate between grid lines. Why not a smoother or fitted model: a fit would change
// measured values and extrapolate silently; the proposal asks for exact values at measured keys and
// refusal outside, and piecewise-linear is the simplest interpolant that has both.
type surface struct {
	phase string
	axes  []string // FPM field of each coordinate; axes[1:] are per request
	rows  []schemas.Row
	exact map[[3]int64]int // raw coordinates -> row index
	root  *level           // nil: no rows of this phase
}

// level is one coordinate of the tree: its measured values, ascending, and below each either the
// next level or (at the last coordinate) the row.
type level struct {
	values []float64
	next   []*level
	row    []int
}

var (
	prefillAxes = []string{"num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens"}
	decodeAxes  = []string{"num_decode_requests", "sum_decode_kv_tokens"}
)

// rawCoords are a row's (or step part's) FPM coordinates of the phase, in axes order.
func rawCoords(phase string, r schemas.Row) [3]int64 {
	if phase == PhasePrefill {
		return [3]int64{r.NumPrefillRequests, r.SumPrefillTokens, r.SumPrefillKVTokens}
	}
	return [3]int64{r.NumDecodeRequests, r.SumDecodeKVTokens, 0}
}

// gridCoords maps raw coordinates to the grid's: the request count, then each token sum per request.
func gridCoords(n int, raw [3]int64) []float64 {
	x := make([]float64, n)
	x[0] = float64(raw[0])
	for i := 1; i < n; i++ {
		x[i] = float64(raw[i]) / float64(raw[0])
	}
	return x
}

// newSurface arranges the rows of phase (other rows are ignored). The rows passed validation: their
// coordinates are unique and phase-valid, so every request count is at least 1.
func newSurface(phase string, all []schemas.Row) *surface {
	s := &surface{phase: phase, axes: prefillAxes, exact: map[[3]int64]int{}}
	if phase == PhaseDecode {
		s.axes = decodeAxes
	}
	type pt struct {
		x   []float64
		row int
	}
	var pts []pt
	for _, r := range all {
		if r.Phase != phase {
			continue
		}
		raw := rawCoords(phase, r)
		s.exact[raw] = len(s.rows)
		pts = append(pts, pt{gridCoords(len(s.axes), raw), len(s.rows)})
		s.rows = append(s.rows, r)
	}
	var build func(ps []pt, depth int) *level
	build = func(ps []pt, depth int) *level {
		sort.SliceStable(ps, func(i, j int) bool { return ps[i].x[depth] < ps[j].x[depth] })
		l := &level{}
		for i := 0; i < len(ps); {
			j := i
			for j < len(ps) && ps[j].x[depth] == ps[i].x[depth] {
				j++
			}
			l.values = append(l.values, ps[i].x[depth])
			if depth == len(s.axes)-1 {
				l.row = append(l.row, ps[i].row) // unique coordinates: j == i+1
			} else {
				l.next = append(l.next, build(ps[i:j], depth+1))
			}
			i = j
		}
		return l
	}
	if len(pts) > 0 {
		s.root = build(pts, 0)
	}
	return s
}

// contribution is one measured row's weight in an evaluation.
type contribution struct {
	row    int
	weight float64
}

// violation is where an evaluation left the grid: the coordinate, the bound, the measured limit (in
// grid coordinates) and the grid values of the outer coordinates of the slice it happened in.
type violation struct {
	axis  int
	bound string
	limit float64
	slice []float64
}

// eval evaluates the surface at grid coordinates x: the measured rows used with their weights, or
// where x leaves the domain. The value is value(contributions).
func (s *surface) eval(x []float64) ([]contribution, *violation) {
	if s.root == nil {
		return nil, &violation{axis: -1, bound: boundAbsent}
	}
	var out []contribution
	if v := s.root.eval(x, 0, 1, nil, &out); v != nil {
		return nil, v
	}
	return out, nil
}

// eval descends from this level (coordinate depth) with weight w; slice holds the grid values chosen
// at the outer levels. A coordinate equal to a measured value descends into that value alone, so an
// exact grid point never depends on its neighbours (which need not cover it).
func (l *level) eval(x []float64, depth int, w float64, slice []float64, out *[]contribution) *violation {
	xv := x[depth]
	n := len(l.values)
	descend := func(i int, wi float64) *violation {
		if l.next == nil {
			*out = append(*out, contribution{row: l.row[i], weight: wi})
			return nil
		}
		return l.next[i].eval(x, depth+1, wi, append(slice[:len(slice):len(slice)], l.values[i]), out)
	}
	switch {
	case xv < l.values[0]:
		return &violation{axis: depth, bound: boundLower, limit: l.values[0], slice: slice}
	case xv > l.values[n-1]:
		return &violation{axis: depth, bound: boundUpper, limit: l.values[n-1], slice: slice}
	}
	i := sort.SearchFloat64s(l.values, xv) // the first value >= xv
	if l.values[i] == xv {
		return descend(i, w)
	}
	lo, hi := l.values[i-1], l.values[i]
	t := (xv - lo) / (hi - lo)
	if v := descend(i-1, w*(1-t)); v != nil {
		return v
	}
	return descend(i, w*t)
}

// value sums the weighted latencies of an evaluation's rows. The weights are products of the blend
// factors along the tree, so this equals the nested blend (1−t)·f(lo) + t·f(hi) at every level.
func (s *surface) value(cs []contribution) float64 {
	var v float64
	for _, c := range cs {
		v += c.weight * s.rows[c.row].LatencyMS
	}
	return v
}

// lowerEdge is the smallest per-request value of the last coordinate the surface covers at request
// count n: the smallest measured value when n is a measured count, else the larger of the smallest
// values of the two enclosing counts (below it one of them has no row). Only the decode surface (two
// coordinates) uses it: it is the decode baseline's KV read per request.
func (s *surface) lowerEdge(n float64) (float64, *violation) {
	if s.root == nil {
		return 0, &violation{axis: -1, bound: boundAbsent}
	}
	l := s.root
	switch last := len(l.values) - 1; {
	case n < l.values[0]:
		return 0, &violation{axis: 0, bound: boundLower, limit: l.values[0]}
	case n > l.values[last]:
		return 0, &violation{axis: 0, bound: boundUpper, limit: l.values[last]}
	}
	i := sort.SearchFloat64s(l.values, n)
	if l.values[i] == n {
		return l.next[i].values[0], nil
	}
	return max(l.next[i-1].values[0], l.next[i].values[0]), nil
}

// domain turns a violation into the query's terms: token coordinates are sums at the query's request
// count n (the grid holds them per request); raw, when known, are the query's own coordinates.
func (s *surface) domain(role string, v *violation, x []float64, raw *[3]int64) *domainViolation {
	d := &domainViolation{Role: role, Surface: s.phase, Bound: v.bound}
	if v.axis < 0 {
		d.Coordinate = "phase"
		return d
	}
	n := x[0]
	d.Coordinate = s.axes[v.axis]
	d.Value, d.Limit = x[v.axis], v.limit
	if v.axis > 0 {
		d.PerRequest = &perRequest{Value: x[v.axis], Limit: v.limit}
		d.Value, d.Limit = x[v.axis]*n, v.limit*n
	}
	if raw != nil {
		d.Value = float64(raw[v.axis])
	}
	if len(v.slice) > 0 {
		d.Slice = map[string]float64{}
		for i, g := range v.slice {
			if i == 0 {
				d.Slice[s.axes[0]] = g
			} else {
				d.Slice[s.axes[i]] = g * v.slice[0] // the slice's sum at its own request count
			}
		}
	}
	return d
}

func (d *domainViolation) String() string {
	if d.Bound == boundAbsent {
		return fmt.Sprintf("the cell has no %s rows: a %s part cannot be estimated", d.Surface, d.Role)
	}
	if d.PerRequest == nil {
		side := map[string]string{boundLower: "below the smallest", boundUpper: "above the largest"}[d.Bound]
		return fmt.Sprintf("%s %s %g is %s measured value %g: the estimator does not extrapolate", d.Role, d.Coordinate, d.Value, side, d.Limit)
	}
	side := map[string]string{boundLower: "below", boundUpper: "above"}[d.Bound]
	most := map[string]string{boundLower: "at least", boundUpper: "at most"}[d.Bound]
	slice := ""
	for _, a := range []string{"num_prefill_requests", "num_decode_requests", "sum_prefill_tokens"} {
		if v, ok := d.Slice[a]; ok {
			slice += fmt.Sprintf(" %s=%g", a, v)
		}
	}
	return fmt.Sprintf("%s %s %g is %s the covered bound %g (%g per request; the grid slice%s measures %s %g per request): the estimator does not extrapolate",
		d.Role, d.Coordinate, d.Value, side, d.Limit, d.PerRequest.Value, slice, most, d.PerRequest.Limit)
}
