package gaps

import (
	"github.com/fpmbus/fpmbus/streams"
)

// EventSchema names the JSON format of every event the detector publishes.
const EventSchema = streams.GapEventSchema

// Event types (the "type" field and the Fpm-Event header).
const (
	// TypeGap reports missing sequence numbers of one publisher, with their cause. Every missing
	// sequence number is reported by exactly one gap event.
	TypeGap = streams.GapEventType
	// typeStale reports that a publisher sent nothing, not even a heartbeat, for StaleAfter.
	typeStale = "stale"
	// typeResumed closes a stale period: the publisher was heard again.
	typeResumed = "resumed"
	// TypeRecovered takes back numbers a gap event named missing: copies of them were stored after
	// the event was classified (a redundant bridge that lagged past the marker grace, a bridge that
	// held them through a full disk or a broker restart). Its cause is the gap event's, recovers its
	// id, and first_missing..last_missing (missing: how many) the numbers no longer missing, under
	// epoch: a reader subtracts them from that cause.
	TypeRecovered = "recovered"
)

// Causes of a gap (the "cause" field; label cause of the metrics).
const (
	// CauseBridgeDrop: the bridge dropped the messages itself (buffer full during a broker outage,
	// shutdown, rejected) and said so in a drop marker covering them.
	CauseBridgeDrop = "bridge_drop"
	// CauseZMQDrop: the bridge received a jump in the sequence and no drop marker covered it within
	// the marker grace: the publisher's send buffer or the ZMQ transport lost them.
	CauseZMQDrop = "zmq_drop"
	// CausePublisherRestart: the sequence went back; the publisher started a new run. The event says
	// how far the old run got; its missing numbers are the new run's first ones that never arrived.
	CausePublisherRestart = "publisher_restart"
	// causeReconnect: the bridge's connection to the publisher ended and a new one began, and the
	// sequence went on forward under a new bridge epoch (header Fpm-Run-Start: reconnect). A PUB
	// subscriber sees a publisher restart only as such a reconnect when the new run had sent more
	// numbers by the time the bridge was connected again than the old run had in all, so the run is
	// taken for a new one whose first numbers (0 up to the first received) never arrived: never a loss
	// left unnamed. If only the connection broke (the publisher did not restart), the numbers named
	// up to the old run's last were stored under the old epoch: named though stored, the price of
	// never guessing continuity. The event says how far the old run got, like a publisher_restart.
	causeReconnect = "reconnect"
	// CauseLateStart: the first numbers of a publisher's run never reached the bridge because it was
	// not subscribed yet (the publisher started before the bridge, or the bridge connected late): the
	// numbers before the first one of the first run the detector sees (when that is above 0). A
	// restarted run's first numbers are in its publisher_restart event instead.
	CauseLateStart = "late_start"
	// CauseStale: the publisher went silent for longer than StaleAfter and came back with a jump that
	// no drop marker covered (node or network loss). Also the cause of every typeStale event.
	CauseStale = "stale"
)

// Causes lists every cause, in report order.
var Causes = []string{CauseBridgeDrop, CauseZMQDrop, CausePublisherRestart, causeReconnect, CauseStale, CauseLateStart}

// point is one FPM around a gap (streams.GapPoint, the wire type of every gap event).
type point = streams.GapPoint

// citedMarker is a drop marker cited as evidence.
type citedMarker struct {
	FirstSeq          uint64 `json:"first_seq"`
	LastSeq           uint64 `json:"last_seq"`
	Count             uint64 `json:"count"`
	Reason            string `json:"reason"`
	Bridge            string `json:"bridge"`
	Epoch             int64  `json:"epoch"`
	FirstReceivedAtMs int64  `json:"first_received_at_ms"`
	LastReceivedAtMs  int64  `json:"last_received_at_ms"`
}

// markerRef cites m as evidence.
func markerRef(m *streams.DropMarker) citedMarker {
	return citedMarker{FirstSeq: m.FirstSeq, LastSeq: m.LastSeq, Count: m.Count, Reason: m.Reason, Bridge: m.Bridge,
		Epoch: m.Epoch, FirstReceivedAtMs: m.FirstReceivedAtMs, LastReceivedAtMs: m.LastReceivedAtMs}
}

// runSummary describes one publisher run (one sequence from its first seen number on).
type runSummary struct {
	FirstSeq    uint64 `json:"first_seq"`
	LastSeq     uint64 `json:"last_seq"`
	FirstEpoch  int64  `json:"first_epoch"`
	LastEpoch   int64  `json:"last_epoch"`
	Messages    uint64 `json:"messages"`
	StartedAtMs int64  `json:"started_at_ms"`
	LastAtMs    int64  `json:"last_at_ms"`
	// ByRestart: the run began with a publisher restart, or a reconnect taken for one (not with the
	// first message ever seen).
	ByRestart bool `json:"by_restart"`
}

// evidence says why the detector chose the cause.
type evidence struct {
	// Summary is one human-readable sentence.
	Summary string `json:"summary"`
	// Markers are the drop markers covering a bridge_drop range.
	Markers []citedMarker `json:"markers,omitempty"`
	// MarkerGraceMs: how long (stream time on FPM_EVENTS) the detector waited for a drop marker.
	MarkerGraceMs int64 `json:"marker_grace_ms,omitempty"`
	// EpochChanged: the messages before and after the gap carry different bridge epochs; with
	// BridgeChanged false as well, the same bridge id started a new epoch without a sequence regression
	// (a restarted bridge), never a publisher restart.
	EpochChanged  bool `json:"epoch_changed,omitempty"`
	BridgeChanged bool `json:"bridge_changed,omitempty"`
	// AfterStale: the gap ends a stale period (the publisher had been silent for StaleAfter).
	AfterStale bool `json:"after_stale,omitempty"`
	// OldRun is how far the previous run got (publisher_restart, reconnect).
	OldRun *runSummary `json:"old_run,omitempty"`
	// NewRunFirstSeq is the first sequence number received from the new run (publisher_restart,
	// reconnect).
	NewRunFirstSeq *uint64 `json:"new_run_first_seq,omitempty"`
	// SilentMs is how long nothing was heard before the publisher came back (observed times).
	SilentMs int64 `json:"silent_ms,omitempty"`
	// FirstSeenSeq (late_start) is the first number of the run the bridge received: the gap is every
	// number before it.
	FirstSeenSeq *uint64 `json:"first_seen_seq,omitempty"`
	// SubscribedByMs (late_start) is when the bridge was subscribed to the publisher at the latest: its
	// receive time of the run's first message, the run's epoch (Fpm-Epoch). The bridge does not
	// publish when its socket connected, so nothing bounds it closer.
	SubscribedByMs int64 `json:"subscribed_by_ms,omitempty"`
}

// Event is one JSON event on FPM_EVENTS, subject streams.GapEventSubject(key), header
// Fpm-Event: <type>, Nats-Msg-Id: <id>: the fields every gap event carries (streams.GapEventFields,
// the bridge's lost_after_ack events have them too), then the detector's own. See the package
// documentation for the format.
type Event struct {
	streams.GapEventFields
	// After is the first message after the gap (for a restart the new run's first one received; for
	// resumed the one heard again); absent for stale.
	After *point `json:"after,omitempty"`
	// StaleAfterMs and StaleAtMs (stale): the threshold and the observed time it was crossed
	// (before.observed_at_ms + stale_after_ms).
	StaleAfterMs int64 `json:"stale_after_ms,omitempty"`
	StaleAtMs    int64 `json:"stale_at_ms,omitempty"`
	// Restarted (resumed): whether the publisher restarted while it was silent.
	Restarted *bool `json:"restarted,omitempty"`
	// Recovers (recovered) is the id of the gap event that named the numbers.
	Recovers string   `json:"recovers,omitempty"`
	Evidence evidence `json:"evidence"`
}

// Subject is the subject the event is published on.
func (e *Event) Subject() string { return streams.GapEventSubject(e.Key) }

func u64p(v uint64) *uint64 { return &v }
func boolp(v bool) *bool    { return &v }
