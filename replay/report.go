package replay

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// The faithfulness report: per socket (producer/rank) and overall, what was replayed, undelivered
// (sent on a ZMQ socket that had no subscriber: libzmq dropped it), skipped and failed, how late each
// send was against its schedule, and the achieved against the scheduled rate.
// Lateness is measured on the replay's monotonic clock: the time the send was handed to the target
// (libzmq, or the NATS client) minus its due time. It is never negative: nothing is sent early.

// event is one record's send, as the pacer made it and the target settled it.
type event struct {
	socket int32
	pass   int32
	step   int32
	seq    uint64
	// counter is the counter_id sent.
	counter int64
	// due and sent are offsets from the replay's start.
	due, sent time.Duration
	err       error
	// undelivered: the target took it, but no subscriber was there to receive it (ZMQ).
	undelivered bool
}

// lagWarnAfter is the lateness at which the replay says, once, that it is behind its schedule.
const lagWarnAfter = 100 * time.Millisecond

// reporter collects events. It has one writer at a time, so it needs no lock: the pacer's goroutine
// (the ZMQ target reports each send as it makes it) or the stream target's ack collector (which
// reports each send when its ack settles it; the pacer never reports then). Run reads the report only
// after the target has closed (the collector has returned). It owns the CSV and progress writers.
type reporter struct {
	plan     *Plan
	describe func(s int) string

	sockets     []sockStats
	csv         *bufio.Writer
	csvErr      error
	progress    io.Writer
	every       int
	total       int // records planned over every pass; -1: until stopped
	n           int
	warned      bool
	lateMax     time.Duration // over every socket, for progress lines
	failed      int
	passes      int
	interrupted bool
	wall        time.Time
}

// sockStats accumulates one socket's (or every socket's) events.
type sockStats struct {
	replayed, failed, undelivered        int
	heartbeats, heartbeatFails, hbUnsent int
	failures                             map[string]int
	lateness                             latencyHist
	lateSum                              time.Duration
	lateMax                              time.Duration
	firstDue, lastDue                    time.Duration
	firstSent, lastSent                  time.Duration
	sends                                int
}

func newReporter(p *Plan, describe func(int) string, progress io.Writer, every int, csvOut io.Writer) *reporter {
	r := &reporter{plan: p, describe: describe, sockets: make([]sockStats, len(p.Sockets)), progress: progress, every: every}
	r.total = len(p.Steps) * p.Config.Loops
	if p.Config.Loops < 0 {
		r.total = -1
	}
	// The lateness samples are allocated up front: growing them while sending would make the garbage
	// collector compete with the send loop.
	for i := range r.sockets {
		n := p.Sockets[i].Records * max(p.Config.Loops, 1)
		r.sockets[i].lateness.samples = make([]time.Duration, 0, min(n, maxExactSamples))
	}
	if csvOut != nil {
		r.csv = bufio.NewWriterSize(csvOut, 64<<10)
		_, r.csvErr = r.csv.WriteString("producer,dp_rank,pass,index,seq,counter_id,scheduled_offset_ms,actual_offset_ms,lateness_ms,outcome\n")
	}
	return r
}

// start marks the replay's start (offset 0) on the wall clock, for the report.
func (r *reporter) start(wall time.Time) {
	r.wall = wall
}

func (s *sockStats) add(ev *event, late time.Duration) {
	if s.sends == 0 {
		s.firstDue, s.firstSent = ev.due, ev.sent
	}
	s.sends++
	s.lastDue, s.lastSent = ev.due, ev.sent
	s.lateness.add(late)
	s.lateSum += late
	s.lateMax = max(s.lateMax, late)
	switch {
	case ev.err != nil:
		s.failed++
		if s.failures == nil {
			s.failures = map[string]int{}
		}
		s.failures[ev.err.Error()]++
	case ev.undelivered:
		s.undelivered++
	default:
		s.replayed++
	}
}

// merge adds o's sends to s (the overall figures are the sockets' merged when the report is made).
func (s *sockStats) merge(o *sockStats) {
	if o.sends > 0 {
		if s.sends == 0 || o.firstDue < s.firstDue {
			s.firstDue = o.firstDue
		}
		if s.sends == 0 || o.firstSent < s.firstSent {
			s.firstSent = o.firstSent
		}
		s.lastDue, s.lastSent = max(s.lastDue, o.lastDue), max(s.lastSent, o.lastSent)
	}
	s.sends += o.sends
	s.replayed += o.replayed
	s.failed += o.failed
	s.undelivered += o.undelivered
	s.heartbeats += o.heartbeats
	s.heartbeatFails += o.heartbeatFails
	s.hbUnsent += o.hbUnsent
	for k, v := range o.failures {
		if s.failures == nil {
			s.failures = map[string]int{}
		}
		s.failures[k] += v
	}
	s.lateSum += o.lateSum
	s.lateMax = max(s.lateMax, o.lateMax)
	s.lateness.merge(&o.lateness)
}

// record takes one settled send.
func (r *reporter) record(ev *event) {
	late := max(ev.sent-ev.due, 0)
	r.sockets[ev.socket].add(ev, late)
	r.n++
	if r.csv != nil && r.csvErr == nil {
		r.writeCSV(ev, late)
	}
	if late > r.lateMax {
		r.lateMax = late
	}
	if ev.err != nil || ev.undelivered {
		r.failed++
	}
	if !r.warned && late >= lagWarnAfter && r.progress != nil {
		r.warned = true
		fmt.Fprintf(r.progress, "replay: behind schedule by %s at record %d (%s): this host cannot keep the pace; records go out as soon as they can, none is dropped or reordered, and the report gives the lateness\n",
			late.Round(time.Microsecond), r.n, r.plan.Sockets[ev.socket].Label())
	}
	if r.progress != nil && r.every > 0 && r.n%r.every == 0 {
		r.progressLine(ev.due, late)
	}
}

func (r *reporter) writeCSV(ev *event, late time.Duration) {
	s := &r.plan.Sockets[ev.socket]
	b := make([]byte, 0, 128)
	b = appendCSVField(b, s.Producer)
	b = append(b, ',')
	b = strconv.AppendInt(b, s.DPRank, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(ev.pass), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(ev.step), 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, ev.seq, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, ev.counter, 10)
	b = append(b, ',')
	b = strconv.AppendFloat(b, ms(ev.due), 'f', 3, 64)
	b = append(b, ',')
	b = strconv.AppendFloat(b, ms(ev.sent), 'f', 3, 64)
	b = append(b, ',')
	b = strconv.AppendFloat(b, ms(late), 'f', 3, 64)
	b = append(b, ',')
	switch {
	case ev.err != nil:
		b = appendCSVField(b, "failed: "+ev.err.Error())
	case ev.undelivered:
		b = append(b, "undelivered: no subscriber"...)
	default:
		b = append(b, "sent"...)
	}
	b = append(b, '\n')
	_, r.csvErr = r.csv.Write(b)
}

// appendCSVField appends s quoted when it needs to be (RFC 4180).
func appendCSVField(b []byte, s string) []byte {
	if !strings.ContainsAny(s, ",\"\r\n") {
		return append(b, s...)
	}
	b = append(b, '"')
	b = append(b, strings.ReplaceAll(s, `"`, `""`)...)
	return append(b, '"')
}

func (r *reporter) progressLine(due, late time.Duration) {
	of := ""
	if r.total > 0 {
		of = fmt.Sprintf("/%d (%.0f%%)", r.total, 100*float64(r.n)/float64(r.total))
	}
	fmt.Fprintf(r.progress, "replay: %d%s records, schedule +%s, lateness now %s (max %s), not delivered %d\n",
		r.n, of, due.Round(time.Millisecond), late.Round(time.Microsecond), r.lateMax.Round(time.Microsecond), r.failed)
}

// heartbeat takes one heartbeat send on socket s.
func (r *reporter) heartbeat(s int, undelivered bool, err error) {
	switch {
	case err != nil:
		r.sockets[s].heartbeatFails++
	case undelivered:
		r.sockets[s].hbUnsent++
	default:
		r.sockets[s].heartbeats++
	}
}

// finish closes the run: passes completed, whether it was interrupted; it flushes the CSV.
func (r *reporter) finish(passes int, interrupted bool) error {
	r.passes, r.interrupted = passes, interrupted
	if r.csv != nil && r.csvErr == nil {
		r.csvErr = r.csv.Flush()
	}
	if r.csvErr != nil {
		return fmt.Errorf("replay: records CSV: %w", r.csvErr)
	}
	return nil
}

// Report is the faithfulness report of one replay.
type Report struct {
	Target string `json:"target"`
	// StartedAt is the wall time of offset 0 (the first record's due time).
	StartedAt   time.Time `json:"started_at"`
	Speed       float64   `json:"speed"`
	MaxRate     float64   `json:"max_rate,omitempty"`
	CounterIDs  string    `json:"counter_ids"`
	Passes      int       `json:"passes"`
	Interrupted bool      `json:"interrupted"`
	// Overall sums every socket.
	Overall rankReport   `json:"overall"`
	Ranks   []rankReport `json:"ranks"`
	// Skipped counts records not sent by reason (invalid lines included); SkippedExamples names a few.
	Skipped         map[string]int `json:"skipped"`
	SkippedExamples []string       `json:"skipped_examples,omitempty"`
	// Damaged lists the segments read only up to a torn or corrupt tail.
	Damaged []Damage `json:"damaged,omitempty"`
}

// rankReport is one socket's (or the overall) figures.
type rankReport struct {
	// Rank is "producer/dp_rank", or "all".
	Rank     string `json:"rank"`
	Producer string `json:"producer,omitempty"`
	DPRank   int64  `json:"dp_rank"`
	// Endpoint is where it was sent (the bound ZMQ endpoint, or the stream subject's publisher).
	Endpoint string `json:"endpoint,omitempty"`
	// Replayed counts records delivered: taken by the target with a subscriber there (ZMQ) or acked
	// (stream).
	Replayed int `json:"replayed"`
	// Undelivered counts records sent while the ZMQ socket had no subscriber: libzmq dropped them.
	// A rank with Undelivered > 0 is a socket that had no subscriber.
	Undelivered int `json:"undelivered"`
	// Failed counts sends the target refused (with the reasons in Failures).
	Failed   int            `json:"failed"`
	Failures map[string]int `json:"failures,omitempty"`
	// Skipped counts this rank's records not sent, by reason.
	Skipped               map[string]int `json:"skipped"`
	Heartbeats            int            `json:"heartbeats"`
	HeartbeatsUndelivered int            `json:"heartbeats_undelivered"`
	HeartbeatsFailed      int            `json:"heartbeats_failed"`
	Lateness              lateness       `json:"lateness"`
	// Scheduled and actual span (first to last send) and the rates over them.
	ScheduledDurationS float64 `json:"scheduled_duration_s"`
	ActualDurationS    float64 `json:"actual_duration_s"`
	ScheduledRatePerS  float64 `json:"scheduled_rate_per_s"`
	AchievedRatePerS   float64 `json:"achieved_rate_per_s"`
}

// lateness summarizes how late sends were against their due times, in milliseconds: mean, max and the
// percentiles (nearest rank) are exact up to maxExactSamples sends; beyond (a replay looping for
// long) the percentiles come from a log-linear histogram, within 0.4%.
type lateness struct {
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// report builds the Report from what was collected.
func (r *reporter) report(target string) *Report {
	p := r.plan
	rep := &Report{Target: target, StartedAt: r.wall, Speed: p.Config.Speed, MaxRate: p.Config.MaxRate,
		CounterIDs: string(p.Config.CounterIDs), Passes: r.passes, Interrupted: r.interrupted,
		Skipped: copyCounts(p.Skipped), SkippedExamples: p.Examples, Damaged: p.Recording.Damaged}
	for i := range p.Sockets {
		s := &p.Sockets[i]
		rr := r.sockets[i].rankReport(s.Label())
		rr.Producer, rr.DPRank, rr.Endpoint = s.Producer, s.DPRank, r.describe(i)
		rr.Skipped = copyCounts(s.Skipped)
		rep.Ranks = append(rep.Ranks, rr)
	}
	var all sockStats
	for i := range r.sockets {
		all.merge(&r.sockets[i])
	}
	rep.Overall = all.rankReport("all")
	rep.Overall.DPRank = -1
	rep.Overall.Skipped = copyCounts(p.Skipped)
	return rep
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *sockStats) rankReport(label string) rankReport {
	rr := rankReport{Rank: label, Replayed: s.replayed, Undelivered: s.undelivered, Failed: s.failed, Failures: s.failures,
		Heartbeats: s.heartbeats, HeartbeatsUndelivered: s.hbUnsent, HeartbeatsFailed: s.heartbeatFails}
	if s.sends > 0 {
		rr.Lateness = lateness{
			MeanMs: ms(s.lateSum) / float64(s.sends),
			P50Ms:  ms(s.lateness.quantile(0.50)),
			P90Ms:  ms(s.lateness.quantile(0.90)),
			P99Ms:  ms(s.lateness.quantile(0.99)),
			MaxMs:  ms(s.lateMax),
		}
	}
	rr.ScheduledDurationS = (s.lastDue - s.firstDue).Seconds()
	rr.ActualDurationS = (s.lastSent - s.firstSent).Seconds()
	if rr.ScheduledDurationS > 0 {
		rr.ScheduledRatePerS = float64(s.sends) / rr.ScheduledDurationS
	}
	if rr.ActualDurationS > 0 {
		rr.AchievedRatePerS = float64(s.sends) / rr.ActualDurationS
	}
	return rr
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText writes the report as a terminal table.
func (rep *Report) WriteText(w io.Writer) error {
	o := &rep.Overall
	state := "done"
	if rep.Interrupted {
		state = "interrupted"
	}
	fmt.Fprintf(w, "replay %s (--to %s, speed %g, counter ids %s, %d pass(es)): %d replayed, %d undelivered, %d failed, %d skipped, %d heartbeats\n",
		state, rep.Target, rep.Speed, rep.CounterIDs, rep.Passes, o.Replayed, o.Undelivered, o.Failed, sumCounts(rep.Skipped), o.Heartbeats)
	fmt.Fprintf(w, "schedule %s at %.1f/s, sent over %s at %.1f/s; lateness mean %s p50 %s p90 %s p99 %s max %s\n",
		fmtSeconds(o.ScheduledDurationS), o.ScheduledRatePerS, fmtSeconds(o.ActualDurationS), o.AchievedRatePerS,
		fmtMs(o.Lateness.MeanMs), fmtMs(o.Lateness.P50Ms), fmtMs(o.Lateness.P90Ms), fmtMs(o.Lateness.P99Ms), fmtMs(o.Lateness.MaxMs))
	if o.Lateness.MaxMs >= float64(lagWarnAfter)/float64(time.Millisecond) {
		fmt.Fprintf(w, "LAGGED: sends were up to %s behind schedule (this host could not keep the pace)\n", fmtMs(o.Lateness.MaxMs))
	}
	if n := rep.NoSubscriber(); len(n) > 0 {
		fmt.Fprintf(w, "NOT DELIVERED: %d records and %d heartbeats were sent while their socket had no subscriber; libzmq dropped them (%d of %d sockets)\n",
			o.Undelivered, o.HeartbeatsUndelivered, len(n), len(rep.Ranks))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tendpoint\treplayed\tundelivered\tskipped\tfailed\theartbeats\tlate mean\tp50\tp90\tp99\tmax\trate/s\tscheduled/s\t")
	row := func(r *rankReport) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t\n", r.Rank, r.Endpoint, r.Replayed, r.Undelivered,
			sumCounts(r.Skipped), r.Failed, r.Heartbeats, fmtMs(r.Lateness.MeanMs), fmtMs(r.Lateness.P50Ms), fmtMs(r.Lateness.P90Ms),
			fmtMs(r.Lateness.P99Ms), fmtMs(r.Lateness.MaxMs), r.AchievedRatePerS, r.ScheduledRatePerS)
	}
	for i := range rep.Ranks {
		row(&rep.Ranks[i])
	}
	row(o)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.NoSubscriber() {
		fmt.Fprintf(w, "no subscriber: %s (%s): %d records and %d heartbeats not delivered\n", r.Rank, r.Endpoint, r.Undelivered, r.HeartbeatsUndelivered)
	}
	for _, k := range sortedKeys(rep.Skipped) {
		fmt.Fprintf(w, "skipped %s: %d\n", k, rep.Skipped[k])
	}
	for _, e := range rep.SkippedExamples {
		fmt.Fprintf(w, "  %s\n", e)
	}
	for _, k := range sortedKeys(o.Failures) {
		fmt.Fprintf(w, "failed (%d): %s\n", o.Failures[k], k)
	}
	for _, d := range rep.Damaged {
		fmt.Fprintf(w, "damaged: %s\n", d)
	}
	return nil
}

// NoSubscriber lists the ranks whose socket had no subscriber for some of its sends: what they sent
// then was not delivered.
func (rep *Report) NoSubscriber() []*rankReport {
	var out []*rankReport
	for i := range rep.Ranks {
		if r := &rep.Ranks[i]; r.Undelivered > 0 || r.HeartbeatsUndelivered > 0 {
			out = append(out, r)
		}
	}
	return out
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// latencyHist keeps the durations added, for exact percentiles, up to maxExactSamples; beyond, it
// spills them into a log-linear histogram and counts the rest there: exact below 2*histSub ns, then
// histSub buckets per power of two (the middle of a bucket is within 1/(2*histSub) of any value in
// it). Its memory is bounded whatever the number of sends, so a replay looping until stopped keeps its
// percentiles.
type latencyHist struct {
	samples []time.Duration // while counts is nil
	counts  []uint64        // nil until more than maxExactSamples were added
	n       uint64
	max     time.Duration
}

// maxExactSamples bounds the durations kept for exact percentiles (8 bytes each).
const maxExactSamples = 1 << 21

const (
	histSubBits = 7
	histSub     = 1 << histSubBits
)

func histIndex(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	shift := bits.Len64(v) - (histSubBits + 1)
	return (shift+1)*histSub + int(v>>shift) - histSub
}

// histValue is the middle of bucket i.
func histValue(i int) uint64 {
	if i < 2*histSub {
		return uint64(i)
	}
	shift := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return m<<shift + (uint64(1)<<shift)/2
}

func (h *latencyHist) add(d time.Duration) {
	h.n++
	h.max = max(h.max, d)
	if h.counts == nil {
		if len(h.samples) < maxExactSamples {
			h.samples = append(h.samples, d)
			return
		}
		h.spill()
	}
	h.counts[histIndex(uint64(d))]++
}

// spill moves the samples into the histogram.
func (h *latencyHist) spill() {
	h.counts = make([]uint64, histIndex(math.MaxInt64)+1)
	for _, d := range h.samples {
		h.counts[histIndex(uint64(d))]++
	}
	h.samples = nil
}

// merge adds o's durations to h.
func (h *latencyHist) merge(o *latencyHist) {
	if o.n == 0 {
		return
	}
	if h.counts == nil && o.counts == nil && len(h.samples)+len(o.samples) <= maxExactSamples {
		h.samples = append(h.samples, o.samples...)
	} else {
		if h.counts == nil {
			h.spill()
		}
		for _, d := range o.samples {
			h.counts[histIndex(uint64(d))]++
		}
		for i, c := range o.counts {
			h.counts[i] += c
		}
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile (nearest rank): exact while the samples are kept, else from the
// histogram, never above the largest value added.
func (h *latencyHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if h.counts == nil {
		sorted := slices.Clone(h.samples)
		slices.Sort(sorted)
		return nearestRank(sorted, q)
	}
	return h.histQuantile(q)
}

// histQuantile is quantile from the histogram (once the samples spilled into it).
func (h *latencyHist) histQuantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var c uint64
	for i, k := range h.counts {
		c += k
		if c >= rank {
			return min(time.Duration(histValue(i)), h.max)
		}
	}
	return h.max
}

// sortedKeys returns m's keys in order (for stable messages).
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
