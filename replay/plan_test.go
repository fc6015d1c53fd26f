package replay

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
)

// fiveRecords are two ranks of producer "p" observed at 0, 10, 10, 40 and 100 ms after t0.
const t0 = 1_782_777_600_000

func fiveRecords(t *testing.T, mode string) *Recording {
	t.Helper()
	at := []struct {
		rank int
		off  int64
	}{{0, 0}, {1, 10}, {0, 10}, {1, 40}, {0, 100}}
	var ls []line
	for i, a := range at {
		ls = append(ls, line{producer: "p", mode: mode, observed: t0 + a.off, fpm: fpmJSON(t, "w", a.rank, int64(i))})
	}
	return recordingOf(t, ls...)
}

func dues(p *Plan) []time.Duration {
	var out []time.Duration
	for _, s := range p.Steps {
		out = append(out, s.Due)
	}
	return out
}

// Due times are the recorded offsets from the window's start, scaled by the speed, pushed later by the
// rate cap; the order never changes.
func TestPlanSchedulesRecordedOffsets(t *testing.T) {
	ms := time.Millisecond
	cases := map[string]struct {
		cfg    PlanConfig
		dues   []time.Duration
		period time.Duration
		skip   int
	}{
		"the recorded pace": {PlanConfig{}, []time.Duration{0, 10 * ms, 10 * ms, 40 * ms, 100 * ms}, 125 * ms, 0},
		"twice as fast":     {PlanConfig{Speed: 2}, []time.Duration{0, 5 * ms, 5 * ms, 20 * ms, 50 * ms}, 62500 * time.Microsecond, 0},
		"at half speed":     {PlanConfig{Speed: 0.5}, []time.Duration{0, 20 * ms, 20 * ms, 80 * ms, 200 * ms}, 250 * ms, 0},
		"capped at 50/s":    {PlanConfig{MaxRate: 50}, []time.Duration{0, 20 * ms, 40 * ms, 60 * ms, 100 * ms}, 125 * ms, 0},
		"a window cut by offset and length": {PlanConfig{StartAt: 10 * ms, Duration: 31 * ms},
			[]time.Duration{0, 0, 30 * ms}, 31 * ms, 2},
		"a window cut by observed time": {PlanConfig{StartTime: time.UnixMilli(t0 + 40)}, []time.Duration{0, 60 * ms}, 120 * ms, 3},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := NewPlan(fiveRecords(t, schemas.CaptureFull), c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := dues(p); !slices.Equal(got, c.dues) {
				t.Fatalf("dues %v, want %v", got, c.dues)
			}
			if p.Period != c.period {
				t.Fatalf("period %v, want %v", p.Period, c.period)
			}
			if p.Skipped[skipOutsideWindow] != c.skip {
				t.Fatalf("skipped %v, want %d outside the window", p.Skipped, c.skip)
			}
			for i := 1; i < len(p.Steps); i++ {
				if p.Steps[i].Record <= p.Steps[i-1].Record {
					t.Fatalf("steps reordered: %+v", p.Steps)
				}
			}
		})
	}
}

// Sockets are every (producer, rank) of the recording, sorted; every record is sent or skipped with
// its reason; heartbeats are the replay's own only where the recording cannot hold Dynamo's.
func TestPlanSocketsSkipsAndHeartbeats(t *testing.T) {
	bigInt := strings.Replace(string(fpmJSON(t, "w", 0, 1)), `"version":1`, `"huge":123456789012345678901234567890,"version":1`, 1)
	upper := strings.Replace(string(fpmJSON(t, "w", 0, 2)), `"version":1`, `"e":1E5,"version":1`, 1)
	rec := recordingOf(t,
		line{producer: "z", mode: schemas.CaptureSampled, observed: t0, fpm: fpmJSON(t, "w", 1, 0)},
		line{producer: "a", observed: t0 + 1, fpm: []byte(bigInt)},
		line{producer: "a", observed: t0 + 2, fpm: []byte(upper)},
		line{producer: "a", observed: t0 + 3, fpm: fpmJSON(t, "w", 0, 3)},
		line{producer: "a", observed: t0 + 4, fpm: fpmJSON(t, "w", 2, 4)},
	)
	rec.Invalid, rec.InvalidExamples = 1, []string{"f:9: bad"}
	cases := map[string]struct {
		mode heartbeatMode
		hb   []bool
	}{
		"auto: sampled sockets only": {heartbeatsAuto, []bool{false, false, true}},
		"on":                         {heartbeatsOn, []bool{true, true, true}},
		"off":                        {heartbeatsOff, []bool{false, false, false}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := NewPlan(rec, PlanConfig{Heartbeats: c.mode})
			if err != nil {
				t.Fatal(err)
			}
			var labels []string
			var hb []bool
			for _, s := range p.Sockets {
				labels = append(labels, s.Label()+"="+strconv.Itoa(s.Records))
				hb = append(hb, s.Heartbeats)
			}
			if want := []string{"a/0=1", "a/2=1", "z/1=1"}; !slices.Equal(labels, want) {
				t.Fatalf("sockets %v, want %v", labels, want)
			}
			if !slices.Equal(hb, c.hb) {
				t.Fatalf("heartbeats %v, want %v", hb, c.hb)
			}
			if p.Skipped[skipUnencodable] != 1 || p.Skipped[skipNotCanonical] != 1 || p.Skipped[skipInvalid] != 1 ||
				p.Sockets[0].Skipped[skipUnencodable] != 1 || len(p.Steps) != 3 {
				t.Fatalf("skipped %v (socket a/0 %v), %d steps", p.Skipped, p.Sockets[0].Skipped, len(p.Steps))
			}
			if len(p.Examples) != 3 || p.Examples[0] != "f:9: bad" || !strings.Contains(p.Examples[1], "beyond 64 bits") {
				t.Fatalf("examples %q", p.Examples)
			}
		})
	}
}

// A worker map naming a worker the recording does not hold is refused (a typo would map nothing).
func TestPlanRefusesAWorkerMapThatMapsNothing(t *testing.T) {
	rec := fiveRecords(t, schemas.CaptureFull)
	_, err := NewPlan(rec, PlanConfig{MapWorker: map[string]string{"w": "x", "nobody": "y"}})
	if !errors.Is(err, ErrUnknownWorker) || !strings.Contains(err.Error(), `"nobody"`) {
		t.Fatalf("got %v", err)
	}
	p, err := NewPlan(rec, PlanConfig{MapWorker: map[string]string{"w": "x"}})
	if err != nil || p.Sockets[0].WorkerID != "x" {
		t.Fatalf("%v, sockets %+v", err, p.Sockets)
	}
	for name, cfg := range map[string]PlanConfig{
		"negative speed":    {Speed: -1},
		"negative rate":     {MaxRate: -5},
		"offset and time":   {StartAt: time.Second, StartTime: time.Now()},
		"unknown counters":  {CounterIDs: "shuffle"},
		"unknown heartbeat": {Heartbeats: "sometimes"},
	} {
		if _, err := NewPlan(rec, cfg); !errors.Is(err, ErrInvalidPlan) {
			t.Errorf("%s: got %v, want ErrInvalidPlan", name, err)
		}
	}
}

// The ZMQ layout is Dynamo's for one producer (base + rank); several producers take consecutive blocks
// in name order; --port-map moves a producer or one rank; a clash is refused naming both.
func TestZMQPortLayout(t *testing.T) {
	rec := recordingOf(t,
		line{producer: "b", observed: t0, fpm: fpmJSON(t, "b", 0, 0)},
		line{producer: "b", observed: t0, fpm: fpmJSON(t, "b", 2, 0)},
		line{producer: "a", observed: t0, fpm: fpmJSON(t, "a", 0, 0)},
		line{producer: "a", observed: t0, fpm: fpmJSON(t, "a", 1, 0)},
	)
	p, err := NewPlan(rec, PlanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		cfg  ZMQConfig
		want []int
		err  string
	}{
		"consecutive blocks":       {cfg: ZMQConfig{BasePort: 20380}, want: []int{20380, 20381, 20382, 20384}},
		"a producer moved":         {cfg: ZMQConfig{BasePort: 20380, PortMap: map[string]int{"a": 30000}}, want: []int{30000, 30001, 20380, 20382}},
		"one rank moved":           {cfg: ZMQConfig{BasePort: 20380, PortMap: map[string]int{"b/2": 40000}}, want: []int{20380, 20381, 20382, 40000}},
		"a clash":                  {cfg: ZMQConfig{BasePort: 20380, PortMap: map[string]int{"b/2": 20381}}, err: "a/1 and b/2 would both bind port 20381"},
		"beyond the last port":     {cfg: ZMQConfig{BasePort: 65534}, err: "b/0 would bind port 65536"},
		"a map naming no producer": {cfg: ZMQConfig{BasePort: 20380, PortMap: map[string]int{"c": 1000}}, err: `names "c"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := c.cfg.Ports(p)
			if c.err != "" {
				if !errors.Is(err, errInvalidConfig) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, want an error saying %q", err, c.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("ports %v (%v), want %v", got, err, c.want)
			}
		})
	}
}

// The shape reports duration, per-rank rate and inter-arrival percentiles, recorded and planned.
func TestShapeOfRecordingAndPlan(t *testing.T) {
	rec := fiveRecords(t, schemas.CaptureFull)
	s := describeRecording(rec)
	if s.Records != 5 || s.DurationS != 0.1 || s.RatePerS != 50 || len(s.Ranks) != 2 {
		t.Fatalf("shape %+v", s)
	}
	r0, r1 := s.Ranks[0], s.Ranks[1]
	if r0.Records != 3 || r0.InterArrivalP50Ms != 10 || r0.InterArrivalP99Ms != 90 || r0.RatePerS != 30 {
		t.Fatalf("rank 0 %+v", r0)
	}
	if r1.Records != 2 || r1.InterArrivalP50Ms != 30 || r1.InterArrivalP99Ms != 30 {
		t.Fatalf("rank 1 %+v", r1)
	}
	p, err := NewPlan(rec, PlanConfig{Speed: 10})
	if err != nil {
		t.Fatal(err)
	}
	ps := p.Shape()
	if ps.DurationS != 0.01 || ps.Ranks[0].InterArrivalP99Ms != 9 || ps.RatePerS != 500 {
		t.Fatalf("plan shape %+v", ps)
	}
}
