package observe

import (
	"math"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// sample is one gathering of the registry: every metric family by name, at t.
type sample struct {
	t    time.Time
	fams map[string]*dto.MetricFamily
}

func newSample(t time.Time, mfs []*dto.MetricFamily) *sample {
	s := &sample{t: t, fams: make(map[string]*dto.MetricFamily, len(mfs))}
	for _, mf := range mfs {
		s.fams[mf.GetName()] = mf
	}
	return s
}

// labels is a metric's label match: every pair must be present (nil: every metric of the family).
type labels map[string]string

func (l labels) match(m *dto.Metric) bool {
	if len(l) == 0 {
		return true
	}
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := l[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(l)
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// has reports whether the family name was gathered.
func (s *sample) has(name string) bool {
	if s == nil {
		return false
	}
	_, ok := s.fams[name]
	return ok
}

// sum adds the values of name's metrics that match l.
func (s *sample) sum(name string, l labels) float64 {
	if s == nil {
		return 0
	}
	mf := s.fams[name]
	if mf == nil {
		return 0
	}
	total := 0.0
	for _, m := range mf.GetMetric() {
		if l.match(m) {
			total += value(m)
		}
	}
	return total
}

// by adds name's metrics that match l by the value of label.
func (s *sample) by(name, label string, l labels) map[string]float64 {
	out := map[string]float64{}
	if s == nil || s.fams[name] == nil {
		return out
	}
	for _, m := range s.fams[name].GetMetric() {
		if l.match(m) {
			out[labelOf(m, label)] += value(m)
		}
	}
	return out
}

// bucket is a cumulative histogram bucket.
type bucket struct {
	upper float64
	count float64
}

// histogram adds the buckets of name's histograms that match l (same bounds: one collector's children).
func (s *sample) histogram(name string, l labels) []bucket {
	if s == nil || s.fams[name] == nil {
		return nil
	}
	by := map[float64]float64{}
	total := 0.0
	for _, m := range s.fams[name].GetMetric() {
		h := m.GetHistogram()
		if h == nil || !l.match(m) {
			continue
		}
		for _, b := range h.GetBucket() {
			by[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
		total += float64(h.GetSampleCount())
	}
	out := make([]bucket, 0, len(by)+1)
	for u, c := range by {
		out = append(out, bucket{u, c})
	}
	out = append(out, bucket{math.Inf(1), total})
	sort.Slice(out, func(i, j int) bool { return out[i].upper < out[j].upper })
	return out
}

// minus is now's buckets less old's (old's bounds are now's: the same collector), or now's when the
// collector was reset between them (a restarted component) or old is nil.
func minus(now, old []bucket) []bucket {
	if len(old) != len(now) {
		return now
	}
	out := make([]bucket, len(now))
	for i := range now {
		if now[i].upper != old[i].upper || now[i].count < old[i].count {
			return now
		}
		out[i] = bucket{now[i].upper, now[i].count - old[i].count}
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q (the largest finite bound when it is
// beyond them), 0 without observations.
func quantile(bs []bucket, q float64) float64 {
	if len(bs) == 0 {
		return 0
	}
	total := bs[len(bs)-1].count
	if total == 0 {
		return 0
	}
	rank := q * total
	for i, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.upper, 1) {
				if i > 0 {
					return bs[i-1].upper
				}
				return 0
			}
			return b.upper
		}
	}
	return 0
}

func quantiles(bs []bucket) latencyQuantiles {
	q := latencyQuantiles{P50: quantile(bs, .5), P90: quantile(bs, .9), P99: quantile(bs, .99)}
	if len(bs) > 0 {
		q.Count = uint64(bs[len(bs)-1].count)
	}
	return q
}

// increase is now's value less old's, or now's when the counter was reset between them (a restarted
// component counts from zero) or there is no old sample.
func increase(now, old float64, haveOld bool) float64 {
	if !haveOld || now < old {
		return now
	}
	return now - old
}

// window is the sampler's history: the samples of the last Window, oldest first.
type window struct {
	samples []*sample
}

// minSpacing is the closest two samples of the window are kept: a newer one replaces the newest
// (requests gather too, and may come often).
const minSpacing = 250 * time.Millisecond

func (w *window) add(s *sample, keep time.Duration) {
	if n := len(w.samples); n > 1 && s.t.Sub(w.samples[n-1].t) < minSpacing {
		w.samples[n-1] = s
	} else {
		w.samples = append(w.samples, s)
	}
	cut := 0
	for cut < len(w.samples)-1 && s.t.Sub(w.samples[cut].t) > keep {
		cut++
	}
	w.samples = w.samples[cut:]
}

// span returns the newest and the oldest sample (nil, nil before the first).
func (w *window) span() (now, old *sample) {
	if len(w.samples) == 0 {
		return nil, nil
	}
	return w.samples[len(w.samples)-1], w.samples[0]
}

// within returns the newest sample and the base of a span of d before it: the newest sample at least d
// older, else the oldest (nil, nil before the first).
func (w *window) within(d time.Duration) (now, old *sample) {
	if len(w.samples) == 0 {
		return nil, nil
	}
	now, old = w.samples[len(w.samples)-1], w.samples[0]
	for _, s := range w.samples {
		if now.t.Sub(s.t) < d {
			break
		}
		old = s
	}
	return now, old
}

// rater computes rates and increases between the newest sample and the oldest of the window.
type rater struct {
	now, old *sample
}

func (r rater) seconds() float64 {
	if r.now == nil || r.old == nil || r.now == r.old {
		return 0
	}
	return r.now.t.Sub(r.old.t).Seconds()
}

// increase of name{l} over the window (the whole value without a window yet).
func (r rater) increase(name string, l labels) float64 {
	if r.old == nil || r.old == r.now {
		return r.now.sum(name, l)
	}
	return increase(r.now.sum(name, l), r.old.sum(name, l), r.old.has(name))
}

// rate of name{l} per second over the window (0 without one).
func (r rater) rate(name string, l labels) float64 {
	sec := r.seconds()
	if sec <= 0 {
		return 0
	}
	return increase(r.now.sum(name, l), r.old.sum(name, l), r.old.has(name)) / sec
}

// latency is the quantiles of histogram name{l} over the window, or since the start when nothing was
// observed in the window.
func (r rater) latency(name string, l labels) latencyQuantiles {
	now := r.now.histogram(name, l)
	if r.old != nil && r.old != r.now {
		if d := minus(now, r.old.histogram(name, l)); len(d) > 0 && d[len(d)-1].count > 0 {
			return quantiles(d)
		}
	}
	return quantiles(now)
}
