package gaps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// ReportConfig selects what BuildReport summarizes.
type ReportConfig struct {
	// Group and StateBucket name the detector group whose state is read (defaults defaultGroup,
	// defaultStateBucket).
	Group       string
	StateBucket string
	// Since, when set, counts messages and gaps stored since then (read from the FPM and FPM_EVENTS
	// streams); zero means the detector's cumulative counters.
	Since time.Time
	// FilterSubject limits the FPMs counted with Since (default fpm.>).
	FilterSubject string
}

// PublisherReport is one publisher's line of a report.
type PublisherReport struct {
	Key        streams.Key `json:"key"`
	State      string      `json:"state"` // live, stale, restarted
	Messages   uint64      `json:"messages"`
	Heartbeats uint64      `json:"heartbeats"`
	// Gaps and Missing by cause; a publisher_restart counts as a gap even with nothing missing.
	// Missing is net of Recovered: numbers gap events named missing whose copies were stored after
	// the event (recovered events) are messages, not missing.
	Gaps      CauseCounts `json:"gaps"`
	Missing   CauseCounts `json:"missing"`
	Recovered uint64      `json:"recovered"`
	// DroppedUnrevealed counts the numbers bridge drop markers name after the last one the detector
	// saw of their run: dropped while no later FPM of the run came to reveal them as a gap (the run
	// ended first), so no gap event names them (unrevealed.go). They count in MissingTotal.
	DroppedUnrevealed uint64 `json:"dropped_unrevealed"`
	// LostAfterAckGaps and LostAfterAckMissing count the bridge's lost_after_ack events (FPMs JetStream
	// had acknowledged that the stream no longer holds) and the FPMs they report. The bridge publishes
	// them, not the detector, so they are read from FPM_EVENTS, with or without Since.
	LostAfterAckGaps    uint64 `json:"lost_after_ack_gaps"`
	LostAfterAckMissing uint64 `json:"lost_after_ack_missing"`
	GapsTotal           uint64 `json:"gaps_total"`
	MissingTotal        uint64 `json:"missing_total"`
	// LossPercent is missing / (messages + missing) * 100: every cause counts, late_start too (the
	// numbers a run sent before the bridge was subscribed).
	LossPercent  float64 `json:"loss_percent"`
	StalePeriods uint64  `json:"stale_periods"`
	Restarts     uint64  `json:"restarts"`
	Duplicates   uint64  `json:"duplicates"`
	OutOfOrder   uint64  `json:"out_of_order"`
	PendingGaps  int     `json:"pending_gaps"`
	LastSeq      uint64  `json:"last_seq"`
	LastSeenMs   int64   `json:"last_seen_ms"`
	RunStartedMs int64   `json:"run_started_ms"`
}

// Report is the result of BuildReport.
type Report struct {
	Group      string            `json:"group"`
	Since      *time.Time        `json:"since,omitempty"`
	Publishers []PublisherReport `json:"publishers"`
	// StreamLosses are the loss events of the durable consumers (fpmevents.loss.<consumer>): stored
	// messages a stream removed, by its limits or by a delete, before that consumer read them, and
	// (cause pruned) trace lines the trace writer's retention removed with their segments. They are
	// per consumer and stream, not per publisher: a removed message can no longer say whose it was.
	StreamLosses []StreamLoss `json:"stream_losses"`
}

// StreamLoss sums one consumer's loss events of one cause on one stream.
type StreamLoss struct {
	Consumer string `json:"consumer"`
	Stream   string `json:"stream"`
	Cause    string `json:"cause"` // streams.LossRetention, streams.LossDeleted or streams.LossPruned
	// Ranges counts the events (with cause pruned: the segments), Messages the messages (lines) they
	// report.
	Ranges   int    `json:"ranges"`
	Messages uint64 `json:"messages"`
	// FirstSeq and LastSeq bound the stream sequences reported (0: none known).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// BuildReport summarizes, per publisher, messages, heartbeats, gaps and missing messages by cause,
// the loss percentage and the current state, from the detector group's state bucket (and, with
// Since, from the streams).
func BuildReport(ctx context.Context, js jetstream.JetStream, rc ReportConfig) (*Report, error) {
	if rc.Group == "" {
		rc.Group = defaultGroup
	}
	if rc.StateBucket == "" {
		rc.StateBucket = defaultStateBucket
	}
	if rc.FilterSubject == "" {
		rc.FilterSubject = defaultFilterSubject
	}
	rep := &Report{Group: rc.Group, Publishers: []PublisherReport{}}
	by := map[streams.Key]*PublisherReport{}
	get := func(k streams.Key) *PublisherReport {
		p := by[k]
		if p == nil {
			p = &PublisherReport{Key: k, State: conditionLive}
			by[k] = p
		}
		return p
	}
	states, err := loadStates(ctx, js, rc.StateBucket, rc.Group)
	if err != nil {
		return nil, err
	}
	for k, st := range states {
		p := get(k)
		p.LastSeq, p.LastSeenMs, p.RunStartedMs, p.PendingGaps = st.Last.Seq, st.LastSeenMs, st.Run.StartedAtMs, len(st.Pending)
		switch {
		case st.Stale != nil:
			p.State = conditionStale
		case st.Run.ByRestart && (rc.Since.IsZero() || st.Run.StartedAtMs >= rc.Since.UnixMilli()):
			p.State = conditionRestarted
		}
		if rc.Since.IsZero() {
			c := st.Counters
			p.Messages, p.Heartbeats, p.Gaps, p.Missing = c.Messages, c.Heartbeats, c.Gaps, c.Missing
			p.StalePeriods, p.Restarts, p.Duplicates, p.OutOfOrder = c.StalePeriods, c.Restarts, c.Duplicates, c.OutOfOrder
			p.Recovered = c.Recovered
		}
	}
	// Gap events: with Since, every cause from the stream; without, only the bridge's lost_after_ack
	// ones (the detector's state counts its own).
	eventsSince := rc.Since
	if eventsSince.IsZero() {
		eventsSince = time.Unix(0, 0)
	}
	ended := map[streams.Key][]endedRun{} // from publisher_restart events, for dropUnrevealed
	err = scan(ctx, js, streams.StreamEvents, streams.GapEventWildcard, eventsSince, func(m jetstream.Msg) {
		var e Event
		if json.Unmarshal(m.Data(), &e) != nil {
			return
		}
		if e.Type == TypeGap && e.Cause == CausePublisherRestart && e.Evidence.OldRun != nil {
			r := e.Evidence.OldRun
			ended[e.Key] = append(ended[e.Key], endedRun{r.FirstEpoch, r.LastEpoch, r.LastSeq, e.Epoch})
		}
		if e.Type == TypeGap && e.Cause == streams.GapCauseLostAfterAck {
			p := get(e.Key)
			p.LostAfterAckGaps++
			p.LostAfterAckMissing += e.Missing
			return
		}
		if rc.Since.IsZero() {
			return
		}
		p := get(e.Key)
		switch e.Type {
		case TypeGap:
			p.Gaps.add(e.Cause, 1)
			p.Missing.add(e.Cause, e.Missing)
			if e.Cause == CausePublisherRestart || e.Cause == causeReconnect {
				p.Restarts++
			}
		case TypeRecovered:
			p.Missing.sub(e.Cause, e.Missing)
			p.Recovered += e.Missing
		case typeStale:
			p.StalePeriods++
		}
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) && rc.Since.IsZero() {
		err = nil // nothing published yet: no events to count
	}
	if err != nil {
		return nil, err
	}
	if rep.StreamLosses, err = streamLosses(ctx, js, eventsSince); err != nil {
		return nil, err
	}
	markers := map[streams.Key][]streams.DropMarker{}
	err = scan(ctx, js, streams.StreamEvents, streams.DropMarkerWildcard, eventsSince, func(m jetstream.Msg) {
		k, kerr := streams.ParseKeySubject(m.Subject(), streams.DropMarkerRoot)
		dm, derr := streams.ParseDropMarker(m.Data())
		if kerr == nil && derr == nil { // the subject wins, as in the detector
			markers[k] = append(markers[k], dm)
		}
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	for k, ms := range markers {
		if n := dropUnrevealed(ms, states[k], ended[k]); n > 0 {
			get(k).DroppedUnrevealed = n
		}
	}
	if !rc.Since.IsZero() {
		since := rc.Since
		rep.Since = &since
		subjects := map[string]streams.Key{}
		n, err := streams.FPMShardsOf(ctx, js)
		if err != nil {
			return nil, err
		}
		count := func(m jetstream.Msg) {
			k, ok := subjects[m.Subject()]
			if !ok {
				var err error
				if k, err = streams.ParseFPMSubject(m.Subject()); err != nil {
					return
				}
				subjects[m.Subject()] = k
			}
			p := get(k)
			p.Messages++
			if isHeartbeat(m.Data()) {
				p.Heartbeats++
			}
		}
		for _, name := range streams.FPMStreamNames(n) { // each key in one stream: the counts add up
			if err := scan(ctx, js, name, rc.FilterSubject, since, count); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range by {
		p.GapsTotal, p.MissingTotal = p.Gaps.Total()+p.LostAfterAckGaps, p.Missing.Total()+p.LostAfterAckMissing+p.DroppedUnrevealed
		if d := p.Messages + p.MissingTotal; d > 0 {
			p.LossPercent = float64(p.MissingTotal) * 100 / float64(d)
		}
		rep.Publishers = append(rep.Publishers, *p)
	}
	slices.SortFunc(rep.Publishers, func(x, y PublisherReport) int {
		a, b := x.Key, y.Key
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Component, b.Component),
			cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
	})
	return rep, nil
}

// streamLosses sums the durable consumers' loss events stored since since.
func streamLosses(ctx context.Context, js jetstream.JetStream, since time.Time) ([]StreamLoss, error) {
	type key struct{ consumer, stream, cause string }
	sums := map[key]*StreamLoss{}
	err := scan(ctx, js, streams.StreamEvents, streams.ConsumerLossWildcard, since, func(m jetstream.Msg) {
		var l streams.ConsumerLoss
		if json.Unmarshal(m.Data(), &l) != nil || l.Count == 0 {
			return
		}
		k := key{l.Consumer, l.Stream, l.Cause}
		s := sums[k]
		if s == nil {
			s = &StreamLoss{Consumer: l.Consumer, Stream: l.Stream, Cause: l.Cause}
			sums[k] = s
		}
		s.Ranges++
		s.Messages += l.Count
		if l.First != 0 { // a pruned segment whose sequences the writer did not know names none
			if s.FirstSeq == 0 || l.First < s.FirstSeq {
				s.FirstSeq = l.First
			}
			s.LastSeq = max(s.LastSeq, l.Last)
		}
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = nil
	}
	out := make([]StreamLoss, 0, len(sums))
	for _, s := range sums {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b StreamLoss) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), cmp.Compare(a.Stream, b.Stream), cmp.Compare(a.Cause, b.Cause))
	})
	return out, err
}

// loadStates reads the newest state of every publisher of group.
func loadStates(ctx context.Context, js jetstream.JetStream, bucket, group string) (map[streams.Key]*state, error) {
	out := map[streams.Key]*state{}
	s, err := js.Stream(ctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gaps: state bucket %s: %w", bucket, err)
	}
	prefix := "$KV." + bucket + "."
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + group + ".>"}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("gaps: read state bucket %s: %w", bucket, err)
	}
	err = drain(ctx, oc, func(m jetstream.Msg) {
		k, ok := keyFromKV(group, strings.TrimPrefix(m.Subject(), prefix))
		if !ok {
			return
		}
		if op := m.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return
		}
		var st state
		if json.Unmarshal(m.Data(), &st) == nil {
			out[k] = &st
		}
	})
	return out, err
}

// scan passes every message of stream on filter stored since t to f.
func scan(ctx context.Context, js jetstream.JetStream, stream, filter string, since time.Time, f func(jetstream.Msg)) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("gaps: stream %s: %w", stream, err)
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return fmt.Errorf("gaps: read %s: %w", stream, err)
	}
	return drain(ctx, oc, f)
}

// drain fetches until the consumer has nothing pending.
func drain(ctx context.Context, c jetstream.Consumer, f func(jetstream.Msg)) error {
	for {
		ci, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumPending == 0 {
			return nil
		}
		batch, err := c.Fetch(int(min(ci.NumPending, 10000)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			f(m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// WriteText writes r as an aligned table.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Since != nil {
		fmt.Fprintf(tw, "group %s, since %s\n", r.Group, r.Since.Format(time.RFC3339))
	} else {
		fmt.Fprintf(tw, "group %s, since the detector first saw each publisher\n", r.Group)
	}
	fmt.Fprintln(tw, "NAMESPACE\tCOMPONENT\tWORKER\tRANK\tSTATE\tMESSAGES\tHEARTBEATS\tGAPS\tBRIDGE_DROP\tZMQ_DROP\tRESTART\tRECONNECT\tSTALE\tLATE_START\tLOST_AFTER_ACK\tMISSING\tLOSS%\tLAST_SEQ\tLAST_SEEN")
	for _, p := range r.Publishers {
		worker := p.Key.WorkerID
		if worker == "" {
			worker = `""`
		}
		last := "-"
		if p.LastSeenMs > 0 {
			last = time.UnixMilli(p.LastSeenMs).UTC().Format(time.RFC3339)
		}
		gap := func(c string) string { return fmt.Sprintf("%d/%d", p.Gaps.Get(c), p.Missing.Get(c)) }
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%.3f\t%d\t%s\n",
			p.Key.Namespace, p.Key.Component, worker, p.Key.DPRank, p.State, p.Messages, p.Heartbeats, p.GapsTotal,
			gap(CauseBridgeDrop), gap(CauseZMQDrop), gap(CausePublisherRestart), gap(causeReconnect), gap(CauseStale), gap(CauseLateStart),
			p.LostAfterAckGaps, p.LostAfterAckMissing, p.MissingTotal, p.LossPercent, p.LastSeq, last)
	}
	fmt.Fprintln(tw, "(cause columns: gaps/missing messages)")
	for _, p := range r.Publishers {
		if p.DroppedUnrevealed > 0 {
			fmt.Fprintf(tw, "%s: %d FPM(s) dropped by a bridge after the last one seen of their run (drop markers; no later FPM revealed them as a gap), counted in MISSING\n",
				p.Key, p.DroppedUnrevealed)
		}
	}
	for _, l := range r.StreamLosses {
		if l.Cause == streams.LossPruned {
			fmt.Fprintf(tw, "consumer %s: %d line(s) removed from its output with %d segment(s) pruned by its retention (--max-segments)", l.Consumer, l.Messages, l.Ranges)
			if l.FirstSeq != 0 {
				fmt.Fprintf(tw, ", of messages of %s between stream sequences %d and %d", l.Stream, l.FirstSeq, l.LastSeq)
			}
			fmt.Fprintln(tw)
			continue
		}
		fmt.Fprintf(tw, "consumer %s: %d message(s) of %s removed (%s) before it read them, in %d range(s) between stream sequences %d and %d\n",
			l.Consumer, l.Messages, l.Stream, l.Cause, l.Ranges, l.FirstSeq, l.LastSeq)
	}
	return tw.Flush()
}

// ParseSince reads the report's --since: an RFC 3339 time or a duration before now ("1h", "30m"); ""
// is everything. A bad one is an invalid.FlagError.
func ParseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, invalid.Flagf("--since %q: want an RFC 3339 time (2026-05-01T12:00:00Z) or a duration before now (1h)", s)
	}
	return t, nil
}
