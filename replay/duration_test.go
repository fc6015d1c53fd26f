package replay

import (
	"errors"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
)

// Due times are the recorded offsets divided by the speed exactly (the speed as the decimal it prints
// as), rounded up to the nanosecond, so that no record is ever due before its time; a schedule beyond
// the longest time.Duration is refused, never wrapped around to a negative due time (sent at once).
// The records are fiveRecords': 0, 10, 10, 40 and 100 ms after the first.
func TestPlanDueTimesAreExactOrRefused(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		cfg    PlanConfig
		dues   []int64 // ns
		period time.Duration
		err    string
	}{
		"a third of the offsets, rounded up": {cfg: PlanConfig{Speed: 3},
			dues: []int64{0, 3_333_334, 3_333_334, 13_333_334, 33_333_334}, period: 41_666_667},
		"a millionth of the speed": {cfg: PlanConfig{Speed: 1e-6},
			dues: []int64{0, 1e13, 1e13, 4e13, 1e14}, period: 125e12},
		"1e-10, still within the span": {cfg: PlanConfig{Speed: 1e-10},
			dues: []int64{0, 1e17, 1e17, 4e17, 1e18}, period: 125e16},
		"1e-12: beyond the span":     {cfg: PlanConfig{Speed: 1e-12}, err: "speed 1e-12: the record observed 0.010s after the window's start (p/1) would be due 317 years"},
		"1e-300: beyond the span":    {cfg: PlanConfig{Speed: 1e-300}, err: "speed 1e-300: the record observed 0.010s"},
		"1e300: due a nanosecond on": {cfg: PlanConfig{Speed: 1e300}, dues: []int64{0, 1, 1, 1, 1}, period: 2},
		"a third of a record per second, rounded up": {cfg: PlanConfig{MaxRate: 3},
			dues: []int64{0, 333_333_334, 666_666_668, 1_000_000_002, 1_333_333_336}, period: 1_666_666_670},
		"a cap of one record in 31,700 years": {cfg: PlanConfig{MaxRate: 1e-12}, err: "max rate 1e-12: one record every 3.17e+04 years"},
		"the cap pushes the last record beyond the span": {cfg: PlanConfig{MaxRate: 4e-10},
			err: "max rate 4e-10: record 5 of the window (p/0) would be due beyond"},
		"one pass of a window longer than the span": {cfg: PlanConfig{Speed: 1e-10, Duration: time.Hour},
			dues: []int64{0, 1e17, 1e17, 4e17, 1e18}, period: maxSpan},
		"passes that end beyond the span": {cfg: PlanConfig{Speed: 1e-10, Loops: 8},
			err: "loops 8: passes of 39.6 years each would end beyond"},
		"passes that end within it": {cfg: PlanConfig{Speed: 1e-10, Loops: 7},
			dues: []int64{0, 1e17, 1e17, 4e17, 1e18}, period: 125e16},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := NewPlan(fiveRecords(t, schemas.CaptureFull), c.cfg)
			if c.err != "" {
				if !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, want ErrInvalidPlan saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, d := range dues(p) {
				got = append(got, int64(d))
			}
			if !slices.Equal(got, c.dues) || p.Period != c.period {
				t.Fatalf("dues %v period %d, want %v period %d", got, p.Period, c.dues, c.period)
			}
		})
	}
}

// Observed times at both ends of their range in one recording: --info gives the exact span (never a
// negative one), and replaying it at the recorded pace is refused: its last record is due 292 million
// years after the first.
func TestRecordingSpanningTheWholeRange(t *testing.T) {
	t.Parallel()
	rec := recordingOf(t,
		line{producer: "p", observed: 0, fpm: fpmJSON(t, "w", 0, 1)},
		line{producer: "p", observed: 1, fpm: fpmJSON(t, "w", 0, 2)},
		line{producer: "p", observed: math.MaxInt64, fpm: fpmJSON(t, "w", 0, 3)},
	)
	s := describeRecording(rec)
	if s.DurationMs != math.MaxInt64 || !(s.DurationS > 9.2e15) || s.Ranks[0].InterArrivalP50Ms != 1 || !(s.Ranks[0].InterArrivalP99Ms > 9.2e18) {
		t.Fatalf("shape %+v", s)
	}
	var text strings.Builder
	if err := s.WriteText(&text, "recorded"); err != nil {
		t.Fatal(err)
	}
	if want := "recorded: 3 records over 9223372036854775.807s"; !strings.HasPrefix(text.String(), want) {
		t.Fatalf("text %q, want it to start %q", text.String(), want)
	}
	if _, err := NewPlan(rec, PlanConfig{}); !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), "9223372036854775.807s") {
		t.Fatalf("plan: %v", err)
	}
	// Cut to its first two records, it replays.
	p, err := NewPlan(rec, PlanConfig{Duration: time.Second})
	if err != nil || len(p.Steps) != 2 || p.Steps[1].Due != time.Millisecond || p.Skipped[skipOutsideWindow] != 1 {
		t.Fatalf("plan %+v: %v", p, err)
	}
	// A window starting before 1970 and lasting past the end of the range admits every offset it can.
	p, err = NewPlan(rec, PlanConfig{StartTime: time.UnixMilli(-5), Duration: maxSpan})
	if err != nil || len(p.Steps) != 2 || p.Steps[0].Due != 5*time.Millisecond {
		t.Fatalf("plan from -5 ms: %+v: %v", p, err)
	}
}

// FuzzPlanSchedule: whatever the speed, rate cap, loops and observed times, NewPlan either refuses the
// plan (ErrInvalidPlan) or every due time is at or after the record's exact offset divided by the
// speed (and within a nanosecond of it without a cap), at least the cap's spacing after the one
// before, and every pass fits the longest span. Nothing panics.
func FuzzPlanSchedule(f *testing.F) {
	f.Add(1.0, 0.0, 1, int64(t0), int64(t0+10), int64(t0+100))
	f.Add(1e-12, 0.0, 1, int64(t0), int64(t0+10), int64(t0+100))
	f.Add(1e-10, 3.0, 7, int64(0), int64(1), int64(math.MaxInt64))
	f.Add(3.0, 1e-9, 2, int64(0), int64(0), int64(0))
	f.Add(1e300, 1e300, 1000, int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64))
	fpms := [][]byte{fpmJSON(f, "w", 0, 1), fpmJSON(f, "w", 1, 2), fpmJSON(f, "w", 0, 3)}
	f.Fuzz(func(t *testing.T, speed, maxRate float64, loops int, a, b, c int64) {
		obs := []int64{max(a, 0), max(b, 0), max(c, 0)} // observed_at_unix_ms is never negative
		rec := &Recording{}
		for i, o := range obs {
			rec.Records = append(rec.Records, record{Namespace: "n", Component: "c", Producer: "p", CaptureMode: schemas.CaptureFull,
				ObservedMs: o, Order: int64(i), WorkerID: "w", DPRank: int64(i % 2), CounterID: int64(i + 1), FPM: fpms[i]})
		}
		sortRecords(rec.Records)
		p, err := NewPlan(rec, PlanConfig{Speed: speed, MaxRate: maxRate, Loops: loops % 1000})
		if err != nil {
			if !errors.Is(err, ErrInvalidPlan) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		sp := decimalRat(p.Config.Speed)
		var spacing *big.Rat
		if maxRate > 0 {
			spacing = new(big.Rat).Quo(big.NewRat(int64(time.Second), 1), decimalRat(maxRate))
		}
		for i, st := range p.Steps {
			r := &rec.Records[st.Record]
			exact := new(big.Rat).Quo(new(big.Rat).SetInt(new(big.Int).Mul(new(big.Int).SetUint64(offsetMs(r.ObservedMs, p.WindowStartMs)), big.NewInt(int64(time.Millisecond)))), sp)
			due := new(big.Rat).SetInt64(int64(st.Due))
			if due.Cmp(exact) < 0 {
				t.Fatalf("step %d due %d ns before its exact time %s", i, st.Due, exact.FloatString(3))
			}
			if spacing == nil && new(big.Rat).Sub(due, exact).Cmp(big.NewRat(1, 1)) >= 0 {
				t.Fatalf("step %d due %d ns, a nanosecond or more after its exact time %s", i, st.Due, exact.FloatString(3))
			}
			if i > 0 {
				gap := new(big.Rat).SetInt64(int64(st.Due - p.Steps[i-1].Due))
				if st.Due < p.Steps[i-1].Due || spacing != nil && gap.Cmp(spacing) < 0 {
					t.Fatalf("step %d due %d, after %d: closer than the cap's spacing or reordered", i, st.Due, p.Steps[i-1].Due)
				}
			}
		}
		if n := len(p.Steps); n > 0 {
			if p.Period <= 0 || p.Period < p.Steps[n-1].Due {
				t.Fatalf("period %d, last due %d", p.Period, p.Steps[n-1].Due)
			}
			if l := p.Config.Loops; l > 1 && new(big.Int).Add(new(big.Int).Mul(big.NewInt(int64(l-1)), big.NewInt(int64(p.Period))), big.NewInt(int64(p.Steps[n-1].Due))).Cmp(big.NewInt(math.MaxInt64)) > 0 {
				t.Fatalf("%d passes of %d end beyond the span", l, p.Period)
			}
		}
	})
}
