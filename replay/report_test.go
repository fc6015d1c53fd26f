package replay

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Percentiles are exact while the samples are kept; once spilled into the histogram they stay within
// its bucket precision (under 0.4%); merging sockets gives the percentiles of all their sends.
func TestLatencyPercentiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var a, b, all latencyHist
	var exact []time.Duration
	for i := range 20000 {
		d := time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		if i%100 == 0 {
			d = time.Duration(rng.IntN(200)) // exact small values too
		}
		exact = append(exact, d)
		all.add(d)
		if i%3 == 0 {
			a.add(d)
		} else {
			b.add(d)
		}
	}
	slices.Sort(exact)
	var merged latencyHist
	merged.merge(&a)
	merged.merge(&b)
	spilled := all
	spilled.samples = slices.Clone(all.samples)
	spilled.spill()
	for _, q := range []float64{0.5, 0.9, 0.99, 1} {
		want := nearestRank(exact, q)
		if got := all.quantile(q); got != want {
			t.Errorf("q%.2f: exact %v, want %v", q, got, want)
		}
		if got := merged.quantile(q); got != want {
			t.Errorf("q%.2f merged: %v, want %v", q, got, want)
		}
		got := spilled.quantile(q)
		if d := got - want; d > want/256+1 || -d > want/256+1 {
			t.Errorf("q%.2f from the histogram: %v, want %v within 0.4%%", q, got, want)
		}
	}
	if merged.n != all.n || merged.max != exact[len(exact)-1] {
		t.Fatalf("merged n %d max %v", merged.n, merged.max)
	}
	// A histogram merged into exact samples spills them.
	var mixed latencyHist
	mixed.merge(&a)
	mixed.merge(&spilled)
	if mixed.counts == nil || mixed.n != a.n+spilled.n {
		t.Fatalf("mixed merge: n %d, histogram %v", mixed.n, mixed.counts != nil)
	}
}

// A CSV field holding a separator, a quote or a newline is quoted as RFC 4180 says.
func TestCSVFieldQuoting(t *testing.T) {
	for in, want := range map[string]string{
		"plain":          "plain",
		"a,b":            `"a,b"`,
		`say "hi"`:       `"say ""hi"""`,
		"two\nlines":     "\"two\nlines\"",
		"failed: x, y z": `"failed: x, y z"`,
	} {
		if got := string(appendCSVField(nil, in)); got != want {
			t.Errorf("%q: got %s, want %s", in, got, want)
		}
	}
}
