package streams

// Gap events: JSON bodies on FPM_EVENTS, subject GapEventSubject(key), published by the gap detector
// (consumers/gaps: its Event adds the message after the gap, the stale fields and its evidence) and by
// the bridge (LostAfterAck: acknowledged FPMs the stream lost). Both embed GapEventFields first, so
// every gap event starts with the same fields, of the same meaning, in the same order, and a reader of
// either (`fpmbus gaps report`, `nats sub 'fpmevents.gap.>'`) reads them alike.

// Gap event constants shared by the gap detector and the bridge.
const (
	// GapEventSchema names the JSON format of every gap event.
	GapEventSchema = "fpmbus.gap.v1"
	// GapEventType is the "type" field and Fpm-Event header of a gap event.
	GapEventType = "gap"
)

// GapEventFields are the fields every gap event on FPM_EVENTS carries, whoever publishes it.
type GapEventFields struct {
	// Schema is GapEventSchema.
	Schema string `json:"schema"`
	// Type is the event's kind, also its Fpm-Event header: GapEventType, or the detector's "stale" and
	// "resumed", which open and close a silent period.
	Type string `json:"type"`
	// ID is the event's Nats-Msg-Id, deterministic so a republished event is stored once (GapMsgID,
	// RestartMsgID, StaleMsgID, ResumedMsgID from the detector; LostAfterAckMsgID from the bridge).
	ID string `json:"id"`
	// Key is the publisher the event is about; the event's subject is GapEventSubject(Key).
	Key Key `json:"key"`
	// EventSeq numbers the detector's events per publisher from 1 (header Fpm-Gap-Event-Seq). The
	// bridge leaves it 0: its events are outside that numbering.
	EventSeq uint64 `json:"event_seq"`
	// Cause is why the numbers are missing: one of the detector's causes (stale for its stale and
	// resumed events too), or GapCauseLostAfterAck from the bridge.
	Cause string `json:"cause"`
	// Epoch is the publisher run (bridge epoch) the event belongs to: the run of the message that
	// revealed the gap (a restart's new run; for stale, the last message heard; for resumed, the
	// message heard again), or the run whose acknowledged FPMs the stream lost.
	Epoch int64 `json:"epoch"`
	// FirstMissing..LastMissing spans the missing sequence numbers, absent when Missing is 0 (stale,
	// resumed, a publisher restart whose new run lost none). Missing counts them; for lost_after_ack it
	// is an upper bound when evidence.count_exact is false.
	FirstMissing *uint64 `json:"first_missing,omitempty"`
	LastMissing  *uint64 `json:"last_missing,omitempty"`
	Missing      uint64  `json:"missing"`
	// MissingRanges lists the missing numbers as ranges when they are not contiguous, absent otherwise:
	// a publisher_restart's when drop markers cover numbers in the middle (those are a bridge_drop
	// event's), a lost_after_ack's when the bridge never stored numbers inside the span (ZMQ losses,
	// drops, dead letters).
	MissingRanges [][2]uint64 `json:"missing_ranges,omitempty"`
	// Before is the last FPM before the gap (for a restart the old run's last one; for stale and
	// resumed the last one heard), absent for late_start: nothing of the run came before. For
	// lost_after_ack it is the newest FPM of the publisher the stream still holds, absent when that is
	// not of the lost run.
	Before *GapPoint `json:"before,omitempty"`
}

// GapPoint is one FPM around a gap: its sequence, its observed time (the bridge's receive time,
// Fpm-Received-At-Ms), the bridge epoch it was published under and the bridge that published it.
type GapPoint struct {
	Seq          uint64 `json:"seq"`
	ObservedAtMs int64  `json:"observed_at_ms"`
	Epoch        int64  `json:"epoch"`
	Bridge       string `json:"bridge,omitempty"`
}
