package replay

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/schemas"
)

// The schedule. A Plan fixes, before anything is sent, which records go out, on which socket, and when:
// each record's due time is its observed_at_unix_ms offset from the window's start, divided by the
// speed, then pushed later where --max-rate demands it. Records are never reordered: due times are
// non-decreasing in record order, and the pacer sends in that order.

// ErrInvalidPlan is wrapped by every error NewPlan returns for a bad PlanConfig.
var ErrInvalidPlan = errors.New("replay: invalid plan")

// counterMode says what counter_id a replayed FPM carries.
type counterMode string

const (
	// counterKeep sends the recorded counter_id (the default: the same FPMs as recorded).
	counterKeep counterMode = "keep"
	// CounterRenumber stamps counter_id with the socket's sequence number, as Dynamo's publisher does.
	CounterRenumber counterMode = "renumber"
)

// heartbeatMode says whether the replay sends Dynamo's idle heartbeats of its own.
type heartbeatMode string

const (
	// heartbeatsAuto sends them on the sockets of sampled records only: a full trace (or the FPM
	// stream) already holds every heartbeat the worker sent, and they are replayed as recorded.
	heartbeatsAuto heartbeatMode = "auto"
	heartbeatsOn   heartbeatMode = "on"
	heartbeatsOff  heartbeatMode = "off"
)

// defaultHeartbeatInterval is Dynamo's: a heartbeat after 1 s without a publish.
const defaultHeartbeatInterval = time.Second

// Reasons a record is skipped (not sent), as reported.
const (
	skipOutsideWindow = "outside_window" // before --start-at or after --start-at + --duration
	skipNotCanonical  = "not_canonical"  // its fpm JSON does not round-trip (errNotCanonical)
	skipUnencodable   = "unencodable"    // its fpm holds an integer beyond 64 bits (errUnencodable)
	skipInvalid       = "invalid"        // a line breaking a dynamo.fpm.trace.v1 rule (never a record)
)

// PlanConfig shapes the schedule. The zero value replays everything once at the recorded pace, with
// the recorded counter ids and automatic heartbeats.
type PlanConfig struct {
	// Speed scales the pace: 2 plays twice as fast, 0.5 at half speed. 0 means 1. Due times are the
	// recorded offsets divided by it exactly, rounded up to the nanosecond (duration.go); a speed that
	// puts a record beyond the longest schedule (about 292 years) is refused by NewPlan.
	Speed float64
	// MaxRate caps the rate over all sockets, in records per second: a record is due at least
	// 1/MaxRate after the one before it. 0: no cap.
	MaxRate float64
	// Loops is how many times the schedule plays (0 or 1: once); negative: until stopped.
	Loops int
	// StartAt cuts the window's start at this offset after the first record; StartTime at this observed
	// time instead (not both).
	StartAt   time.Duration
	StartTime time.Time
	// Duration cuts the window's length, in recorded time (0: to the end).
	Duration time.Duration
	// CounterIDs: counterKeep (default) or CounterRenumber.
	CounterIDs counterMode
	// MapWorker maps recorded worker ids to the ones sent; every key must occur in the recording.
	MapWorker map[string]string
	// Heartbeats: heartbeatsAuto (default), heartbeatsOn or heartbeatsOff; HeartbeatInterval defaults
	// to defaultHeartbeatInterval.
	Heartbeats        heartbeatMode
	HeartbeatInterval time.Duration
}

func (c PlanConfig) withDefaults() PlanConfig {
	c.Speed = cmp.Or(c.Speed, 1)
	c.Loops = cmp.Or(c.Loops, 1)
	if c.CounterIDs == "" {
		c.CounterIDs = counterKeep
	}
	if c.Heartbeats == "" {
		c.Heartbeats = heartbeatsAuto
	}
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, defaultHeartbeatInterval)
	return c
}

// Validate reports whether c, with its defaults, is usable; errors wrap ErrInvalidPlan.
func (c PlanConfig) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(ErrInvalidPlan)
	switch {
	case !(c.Speed > 0) || math.IsInf(c.Speed, 0):
		return bad("speed %v: want a positive number", c.Speed)
	case c.MaxRate < 0 || math.IsNaN(c.MaxRate) || math.IsInf(c.MaxRate, 0):
		return bad("max rate %v: want a positive rate, or 0 for none", c.MaxRate)
	case c.StartAt < 0:
		return bad("start at %v: want an offset >= 0", c.StartAt)
	case c.StartAt != 0 && !c.StartTime.IsZero():
		return bad("start at: an offset and a time both given")
	case c.Duration < 0:
		return bad("duration %v: want >= 0 (0: to the end)", c.Duration)
	case c.CounterIDs != counterKeep && c.CounterIDs != CounterRenumber:
		return bad("counter ids %q: want keep or renumber", c.CounterIDs)
	case c.Heartbeats != heartbeatsAuto && c.Heartbeats != heartbeatsOn && c.Heartbeats != heartbeatsOff:
		return bad("heartbeats %q: want auto, on or off", c.Heartbeats)
	case c.HeartbeatInterval < 0:
		return bad("heartbeat interval %v: want > 0", c.HeartbeatInterval)
	}
	return nil
}

// socket is one (producer, dp_rank) of the recording: one PUB socket of the replay (one publisher
// sequence on the stream target). Sockets are sorted by producer, then rank.
type socket struct {
	Namespace, Component, Producer string
	DPRank                         int64
	// WorkerID is the (mapped) worker_id of the socket's first replayed record: its heartbeats carry it.
	WorkerID string
	// Heartbeats: the replay sends idle heartbeats on this socket.
	Heartbeats bool
	// Records is how many records one pass sends on it; Skipped counts the others by reason.
	Records int
	Skipped map[string]int
}

// Label names the socket in reports: producer/rank.
func (s *socket) Label() string { return s.Producer + "/" + strconv.FormatInt(s.DPRank, 10) }

// Active reports whether the socket sends anything (a socket whose records are all skipped is not
// bound).
func (s *socket) Active() bool { return s.Records > 0 }

// step is one send of a pass.
type step struct {
	// Due is the send time as an offset from the pass's start.
	Due time.Duration
	// Socket indexes Plan.Sockets; Record indexes Recording.Records.
	Socket int32
	Record int32
	// counter is the recorded counter_id (kept here so the send loop touches nothing but its steps).
	counter int64
	payload payload
}

// Plan is the schedule of one replay.
type Plan struct {
	Recording *Recording
	Config    PlanConfig // defaults applied
	Sockets   []socket
	// Steps are one pass, in send order (Due non-decreasing).
	Steps []step
	// Period is a pass's length: pass k starts at k*Period.
	Period time.Duration
	// WindowStartMs is the observed time the window starts at (Due 0 of a pass).
	WindowStartMs int64
	// Skipped counts the records (and invalid lines) not sent, by reason; Examples names a few
	// ("producer/rank observed_at: reason").
	Skipped  map[string]int
	Examples []string
}

// NewPlan builds the schedule of rec under cfg: the records in the window, each with its msgpack
// payload built and checked (see encodePayload), the others counted as skipped.
func NewPlan(rec *Recording, cfg PlanConfig) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Plan{Recording: rec, Config: cfg, Skipped: map[string]int{}}
	if rec.Invalid > 0 {
		p.Skipped[skipInvalid] = rec.Invalid
		p.Examples = append(p.Examples, rec.InvalidExamples...)
	}
	if err := checkWorkerMap(rec, cfg.MapWorker); err != nil {
		return nil, err
	}

	// Sockets: every (producer, rank) of the recording, so the port layout does not depend on the window.
	type sockKey struct {
		producer string
		rank     int64
	}
	index := map[sockKey]int{}
	for i := range rec.Records {
		r := &rec.Records[i]
		k := sockKey{r.Producer, r.DPRank}
		if _, ok := index[k]; !ok {
			index[k] = len(p.Sockets)
			p.Sockets = append(p.Sockets, socket{Namespace: r.Namespace, Component: r.Component, Producer: r.Producer, DPRank: r.DPRank, Skipped: map[string]int{}})
		}
	}
	order := make([]int, len(p.Sockets))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		sa, sb := &p.Sockets[a], &p.Sockets[b]
		if c := strings.Compare(sa.Producer, sb.Producer); c != 0 {
			return c
		}
		return cmp.Compare(sa.DPRank, sb.DPRank)
	})
	sorted := make([]socket, len(order))
	newIndex := make([]int, len(order))
	for to, from := range order {
		sorted[to] = p.Sockets[from]
		newIndex[from] = to
	}
	p.Sockets = sorted
	for k, v := range index {
		index[k] = newIndex[v]
	}

	// The window, on the observed clock (saturated: a bound beyond the int64 range admits everything).
	if len(rec.Records) > 0 {
		p.WindowStartMs, _ = addMs(rec.Records[0].ObservedMs, cfg.StartAt.Milliseconds())
		if !cfg.StartTime.IsZero() {
			p.WindowStartMs = cfg.StartTime.UnixMilli()
		}
	}
	endMs, bounded := int64(0), false // the window ends before endMs when bounded
	if cfg.Duration > 0 {
		endMs, bounded = addMs(p.WindowStartMs, cfg.Duration.Milliseconds())
	}

	var (
		dec     schemas.Decoder
		scratch []byte
		arena   []byte
		spacing time.Duration
		prevDue time.Duration
		bad     = invalid.Reporter(ErrInvalidPlan)
	)
	// Exact durations (duration.go): recorded milliseconds and nanoseconds at the speed, the cap's spacing.
	perMs, perNs := perFactor(time.Millisecond, cfg.Speed), perFactor(1, cfg.Speed)
	if cfg.MaxRate > 0 {
		var ok bool
		if spacing, ok = perFactor(time.Second, cfg.MaxRate).ceilMul(1); !ok {
			return nil, bad("max rate %v: one record every %s, beyond the %s a schedule can span", cfg.MaxRate,
				years(float64(time.Second)/cfg.MaxRate), years(float64(maxSpan)))
		}
	}
	skip := func(s *socket, r *record, reason string, err error) {
		p.Skipped[reason]++
		s.Skipped[reason]++
		if err != nil && len(p.Examples) < maxExamples {
			p.Examples = append(p.Examples, s.Label()+" observed "+strconv.FormatInt(r.ObservedMs, 10)+": "+err.Error())
		}
	}
	for i := range rec.Records {
		r := &rec.Records[i]
		si := index[sockKey{r.Producer, r.DPRank}]
		s := &p.Sockets[si]
		if r.ObservedMs < p.WindowStartMs || bounded && r.ObservedMs >= endMs {
			skip(s, r, skipOutsideWindow, nil)
			continue
		}
		pl, err := encodePayload(scratch, r.FPM, cfg.MapWorker[r.WorkerID], &dec)
		switch {
		case errors.Is(err, errUnencodable):
			skip(s, r, skipUnencodable, err)
			continue
		case err != nil:
			skip(s, r, skipNotCanonical, err)
			continue
		}
		scratch = pl.bytes
		// Payloads live in shared chunks: one allocation per chunk, not per record.
		if cap(arena)-len(arena) < len(pl.bytes) {
			arena = make([]byte, 0, max(1<<20, len(pl.bytes)))
		}
		at := len(arena)
		arena = append(arena, pl.bytes...)
		pl.bytes = arena[at:len(arena):len(arena)]

		off := offsetMs(r.ObservedMs, p.WindowStartMs)
		due, ok := perMs.ceilMul(off)
		if !ok {
			return nil, bad("speed %v: the record observed %s after the window's start (%s) would be due %s into the replay, "+
				"beyond the %s a schedule can span: raise the speed or narrow the window", cfg.Speed, fmtMsExact(off), s.Label(),
				years(float64(off)*float64(time.Millisecond)/cfg.Speed), years(float64(maxSpan)))
		}
		if len(p.Steps) > 0 {
			capped, ok := addSpan(prevDue, spacing)
			if !ok {
				return nil, bad("max rate %v: record %d of the window (%s) would be due beyond the %s a schedule can span",
					cfg.MaxRate, len(p.Steps)+1, s.Label(), years(float64(maxSpan)))
			}
			due = max(due, capped)
		}
		prevDue = due
		if s.Records == 0 {
			s.WorkerID = r.WorkerID
			if nw, ok := cfg.MapWorker[r.WorkerID]; ok {
				s.WorkerID = nw
			}
		}
		s.Records++
		if cfg.Heartbeats == heartbeatsOn || cfg.Heartbeats == heartbeatsAuto && r.CaptureMode == schemas.CaptureSampled {
			s.Heartbeats = true
		}
		p.Steps = append(p.Steps, step{Due: due, Socket: int32(si), Record: int32(i), counter: r.CounterID, payload: pl})
	}
	p.Period = p.period(spacing, perNs)
	if n := len(p.Steps); n > 0 && cfg.Loops > 1 {
		// The last pass's last record must be due within the span too.
		last := p.Steps[n-1].Due
		if p.Period > (maxSpan-last)/time.Duration(cfg.Loops-1) {
			return nil, bad("loops %d: passes of %s each would end beyond the %s a schedule can span",
				cfg.Loops, years(float64(p.Period)), years(float64(maxSpan)))
		}
	}
	return p, nil
}

// period is a pass's length: the window's length at the plan's speed when --duration cut it, else the
// last due time plus one mean gap, so the seam between passes looks like any other gap. A period beyond
// the longest span is maxSpan: a second pass that far off never starts (see pacer.run), and a single
// pass does not need it.
func (p *Plan) period(spacing time.Duration, perNs *ratio) time.Duration {
	n := len(p.Steps)
	if n == 0 {
		return 0
	}
	last := p.Steps[n-1].Due
	sat := func(d time.Duration, ok bool) time.Duration {
		if !ok {
			return maxSpan
		}
		return d
	}
	if d := p.Config.Duration; d > 0 {
		return max(sat(perNs.ceilMul(uint64(d))), sat(addSpan(last, max(spacing, 1))))
	}
	gap := sat(perNs.ceilMul(uint64(time.Second)))
	if n > 1 {
		gap = last / time.Duration(n-1)
	}
	return sat(addSpan(last, max(gap, spacing, 1)))
}

// ErrUnknownWorker is returned by NewPlan for a worker map naming a worker id no record has (a typo
// would otherwise map nothing, silently).
var ErrUnknownWorker = errors.New("replay: worker map names a worker_id the recording does not hold")

func checkWorkerMap(rec *Recording, m map[string]string) error {
	if len(m) == 0 {
		return nil
	}
	seen := map[string]bool{}
	for i := range rec.Records {
		seen[rec.Records[i].WorkerID] = true
	}
	var missing []string
	for old := range m {
		if !seen[old] {
			missing = append(missing, strconv.Quote(old))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("%w: %s", ErrUnknownWorker, strings.Join(missing, ", "))
	}
	return nil
}

// Renumber reports whether counter ids are stamped with sequence numbers.
func (p *Plan) Renumber() bool { return p.Config.CounterIDs == CounterRenumber }

// Passes is how many passes the plan plays (negative: until stopped).
func (p *Plan) Passes() int { return p.Config.Loops }

// LoopPlan is the plan of a recording replayed as a live load (`fpmbus up --demo-trace`): the trace
// segments of paths looped until stopped, counter ids renumbered so that a pipeline sees a live
// publisher's sequence, and width, the ports it spans from basePort. A recording with nothing to
// replay, or whose ranks do not fit ports from basePort, is an invalid.FlagError naming --demo-trace.
func LoopPlan(paths []string, basePort int) (plan *Plan, width int, err error) {
	rec, err := readTrace(paths)
	if err != nil {
		return nil, 0, fmt.Errorf("--demo-trace: %w", err)
	}
	plan, err = NewPlan(rec, PlanConfig{Loops: -1, CounterIDs: CounterRenumber})
	if err != nil {
		return nil, 0, fmt.Errorf("--demo-trace: %w", err)
	}
	if len(plan.Steps) == 0 {
		return nil, 0, invalid.Flagf("--demo-trace %s: no record to replay", strings.Join(paths, ","))
	}
	ports, err := ZMQConfig{BasePort: basePort}.Ports(plan)
	if err != nil {
		return nil, 0, invalid.Flagf("--demo-trace: %v", err)
	}
	return plan, slices.Max(ports) - basePort + 1, nil
}
