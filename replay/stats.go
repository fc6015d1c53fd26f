package replay

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The shape of a schedule, for `fpmbus trace replay --info` (the recording as it was) and --dry-run
// (the plan at the chosen speed): how long it lasts, and per rank its rate and inter-arrival times.
// `fpmbus trace info` can print the same figures from DescribeRecording.

// Shape describes the timing of a recording or of one pass of a plan.
type Shape struct {
	Records int `json:"records"`
	// DurationS spans the first to the last record, in seconds; DurationMs is the same span in whole
	// milliseconds, exact (a recording's observed times are integer milliseconds of any range).
	DurationS  float64 `json:"duration_s"`
	DurationMs uint64  `json:"duration_ms"`
	// RatePerS is Records over the duration (0 when it is 0).
	RatePerS float64     `json:"rate_per_s"`
	Ranks    []rankShape `json:"ranks"`
	// span is the duration in ticks of unit (exact), for the text.
	span uint64
	unit time.Duration
}

// rankShape describes one (producer, dp_rank).
type rankShape struct {
	Producer string `json:"producer"`
	DPRank   int64  `json:"dp_rank"`
	Records  int    `json:"records"`
	// Heartbeats counts the records that are idle heartbeats.
	Heartbeats int `json:"heartbeats"`
	// RatePerS is the rank's records over the whole schedule's duration (so ranks' rates add up).
	RatePerS float64 `json:"rate_per_s"`
	// InterArrival p50 and p99 (nearest rank) between the rank's consecutive records, in ms.
	InterArrivalP50Ms float64 `json:"inter_arrival_p50_ms"`
	InterArrivalP99Ms float64 `json:"inter_arrival_p99_ms"`
}

// describeRecording returns the shape of rec as recorded (observed_at_unix_ms). Offsets are exact
// integer milliseconds whatever the observed times (0 and 2^63-1 in one recording included).
func describeRecording(rec *Recording) Shape {
	var ranks []rankTimes
	index := map[string]int{}
	var first, last int64
	for i := range rec.Records {
		r := &rec.Records[i]
		if i == 0 {
			first = r.ObservedMs
		}
		last = r.ObservedMs
		key := r.Producer + "\x00" + fmt.Sprint(r.DPRank)
		j, ok := index[key]
		if !ok {
			j = len(ranks)
			index[key] = j
			ranks = append(ranks, rankTimes{producer: r.Producer, rank: r.DPRank})
		}
		ranks[j].at = append(ranks[j].at, offsetMs(r.ObservedMs, first)) // records are in observed order
		if r.Heartbeat {
			ranks[j].heartbeats++
		}
	}
	var span uint64
	if len(rec.Records) > 0 {
		span = offsetMs(last, first)
	}
	return shape(ranks, span, time.Millisecond, len(rec.Records))
}

// Shape returns the shape of one pass of p (due times, at the plan's speed and rate cap).
func (p *Plan) Shape() Shape {
	ranks := make([]rankTimes, len(p.Sockets))
	for i := range p.Sockets {
		ranks[i] = rankTimes{producer: p.Sockets[i].Producer, rank: p.Sockets[i].DPRank}
	}
	var last time.Duration
	for _, st := range p.Steps {
		ranks[st.Socket].at = append(ranks[st.Socket].at, uint64(st.Due))
		if p.Recording.Records[st.Record].Heartbeat {
			ranks[st.Socket].heartbeats++
		}
		last = st.Due
	}
	var used []rankTimes
	for _, r := range ranks {
		if len(r.at) > 0 {
			used = append(used, r)
		}
	}
	var d time.Duration
	if len(p.Steps) > 0 {
		d = last - p.Steps[0].Due
	}
	return shape(used, uint64(d), time.Nanosecond, len(p.Steps))
}

// rankTimes are one rank's times, in ticks of the shape's unit, non-decreasing.
type rankTimes struct {
	producer   string
	rank       int64
	at         []uint64
	heartbeats int
}

// shape describes ranks over a span of span ticks of unit (a millisecond or a nanosecond).
func shape(ranks []rankTimes, span uint64, unit time.Duration, n int) Shape {
	seconds := float64(span) / float64(time.Second/unit) // one correctly rounded division
	s := Shape{Records: n, DurationS: seconds, DurationMs: span / uint64(time.Millisecond/unit), Ranks: []rankShape{}, span: span, unit: unit}
	if span > 0 {
		s.RatePerS = float64(n) / seconds
	}
	slices.SortFunc(ranks, func(a, b rankTimes) int {
		if c := strings.Compare(a.producer, b.producer); c != 0 {
			return c
		}
		return int(min(max(a.rank-b.rank, -1), 1))
	})
	toMs := float64(unit) / float64(time.Millisecond)
	for _, r := range ranks {
		rs := rankShape{Producer: r.producer, DPRank: r.rank, Records: len(r.at), Heartbeats: r.heartbeats}
		if span > 0 {
			rs.RatePerS = float64(len(r.at)) / seconds
		}
		if len(r.at) > 1 {
			gaps := make([]uint64, len(r.at)-1)
			for i := 1; i < len(r.at); i++ {
				gaps[i-1] = r.at[i] - r.at[i-1]
			}
			slices.Sort(gaps)
			rs.InterArrivalP50Ms = float64(nearestRank(gaps, 0.50)) * toMs
			rs.InterArrivalP99Ms = float64(nearestRank(gaps, 0.99)) * toMs
		}
		s.Ranks = append(s.Ranks, rs)
	}
	return s
}

// nearestRank returns the q-quantile of sorted (nearest-rank method), 0 for none.
func nearestRank[T time.Duration | uint64](sorted []T, q float64) T {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteText writes s as a table headed by title.
func (s Shape) WriteText(w io.Writer, title string) error {
	over := fmtSeconds(s.DurationS)
	if s.unit == time.Millisecond {
		over = fmtMsExact(s.span)
	}
	fmt.Fprintf(w, "%s: %d records over %s (%.1f/s)\n", title, s.Records, over, s.RatePerS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "producer/rank\trecords\theartbeats\trate/s\tinter-arrival p50\tp99\t")
	for _, r := range s.Ranks {
		fmt.Fprintf(tw, "%s/%d\t%d\t%d\t%.1f\t%s\t%s\t\n", r.Producer, r.DPRank, r.Records, r.Heartbeats, r.RatePerS,
			fmtMs(r.InterArrivalP50Ms), fmtMs(r.InterArrivalP99Ms))
	}
	return tw.Flush()
}

func fmtSeconds(s float64) string { return fmt.Sprintf("%.3fs", s) }

func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.3fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.3fms", v)
}
