package gaps

import (
	"strings"

	"github.com/fpmbus/fpmbus/streams"
)

// stateVersion is the version of the State JSON written to the KV bucket.
const stateVersion = 1

// state is everything the detector knows about one publisher. It is checkpointed as JSON in the
// state bucket (one KV entry per publisher and group) before the messages it reflects are acked, so
// a restarted or rebalanced detector continues exactly where the last one stopped: messages at or
// below StreamSeq (FPM) and MarkerSeq (FPM_EVENTS) are already reflected, events in Outbox may not
// have been published yet.
type state struct {
	V   int         `json:"v"`
	Key streams.Key `json:"key"`
	// StreamSeq is the FPM stream sequence of the last FPM of this publisher reflected here; MarkerSeq
	// the FPM_EVENTS sequence of the last drop marker.
	StreamSeq uint64 `json:"stream_seq"`
	MarkerSeq uint64 `json:"marker_seq"`
	// EventStreamSeq is the FPM_EVENTS sequence of the last event known to be stored; NextEventSeq the
	// event_seq the next event gets (1-based, per publisher).
	EventStreamSeq uint64 `json:"event_stream_seq"`
	NextEventSeq   uint64 `json:"next_event_seq"`
	// Started is set by the first FPM.
	Started bool `json:"started"`
	// Run is the current publisher run, MaxEpoch the newest bridge epoch seen in it, Last its message
	// with the highest sequence number.
	Run      runSummary `json:"run"`
	MaxEpoch int64      `json:"max_epoch"`
	Last     point      `json:"last"`
	// FirstSeenMs and LastSeenMs are the oldest and newest observed time of any FPM of the publisher.
	FirstSeenMs int64 `json:"first_seen_ms"`
	LastSeenMs  int64 `json:"last_seen_ms"`
	// Epochs says, per bridge epoch (oldest first, at most maxEpochs), which numbers were stored or
	// named missing under it, so a late message is a duplicate only when its number was already
	// counted or named under its own epoch (see tracker.late). EpochsFloor is the newest epoch of
	// those dropped: nothing is known of an epoch at or below it any more.
	Epochs      []epochSeen `json:"epochs,omitempty"`
	EpochsFloor int64       `json:"epochs_floor,omitempty"`
	// Pending are revealed gaps whose cause is not known yet (waiting for a drop marker).
	Pending []pending `json:"pending,omitempty"`
	// Markers are drop markers that may still explain a pending or future gap.
	Markers []heldMarker `json:"markers,omitempty"`
	// Crossings are where the run was taken to go on across a new bridge epoch with no drop marker
	// showing a restart in between (oldest first, at most maxCrossings): a marker read after the grace
	// that shows one names the new run's numbers then (tracker.markedLate).
	Crossings []crossing `json:"crossings,omitempty"`
	// Redundant is set once FPMs of the publisher came from two bridges (Fpm-Bridge) one after the
	// other: redundant bridges (or a handover). From then on a gap covered by drop markers waits for
	// the marker grace like any other, because another bridge may still store what one bridge dropped.
	Redundant bool `json:"redundant,omitempty"`
	// Stale is set while the publisher is silent.
	Stale    *point   `json:"stale,omitempty"`
	Counters counters `json:"counters"`
	// Recovering is a run of named numbers stored after all, waiting to be reported (a recovered
	// event) when it ends.
	Recovering *recovering `json:"recovering,omitempty"`
	// Outbox holds events not yet confirmed stored on FPM_EVENTS, in event_seq order.
	Outbox []Event `json:"outbox,omitempty"`
}

// pending is a revealed gap held open until every missing number is covered by a drop marker or the
// marker grace has passed.
type pending struct {
	// Kind is jump (sequence skipped forward), resume (a jump ending a stale period), restart (the
	// first numbers of a new run) or start (the numbers before the first one the detector saw of a
	// publisher).
	Kind string `json:"kind"`
	// Reconnect (kind restart): the new run was not seen to go back, it began on a new connection of
	// the bridge (Fpm-Run-Start: reconnect) further on: cause reconnect, unless a late message of the
	// run at or below the old run's last shows the sequence did go back (then publisher_restart).
	Reconnect bool `json:"reconnect,omitempty"`
	// Ranges are the missing numbers (sorted, disjoint, inclusive); late messages punch holes.
	Ranges [][2]uint64 `json:"ranges"`
	Before point       `json:"before"` // zero for kind start
	After  point       `json:"after"`
	// RevealedMs is the stream time (Unix ms) at which the message after the gap was stored; the
	// marker grace counts from it.
	RevealedMs int64 `json:"revealed_ms"`
	// EpochLo..EpochHi are the bridge epochs a drop marker for these numbers can carry.
	EpochLo int64 `json:"epoch_lo"`
	EpochHi int64 `json:"epoch_hi"`
	// OldRun is the run a restart ended (kind restart).
	OldRun *runSummary `json:"old_run,omitempty"`
	// AfterStale: the gap ends a stale period (kind resume, or a restart while stale).
	AfterStale bool  `json:"after_stale,omitempty"`
	SilentMs   int64 `json:"silent_ms,omitempty"`
	// Placed (kind restart): the run began under an epoch stored late, below a later one
	// (placedRunBegins); a later join of that epoch into another run drops it (joinPlaced).
	Placed bool `json:"placed,omitempty"`
}

// epochSeen is what the tracker knows of one bridge epoch's numbers.
type epochSeen struct {
	Epoch int64 `json:"epoch"`
	// Seen are the numbers counted as messages, or named missing by a gap event, under the epoch
	// (sorted, disjoint, inclusive; at most maxSeenRanges, the closest ones merged beyond that).
	Seen [][2]uint64 `json:"seen"`
	// RunLast, when set, is the last message of a run a restart ended, under this epoch: a late
	// message of the epoch past it goes on with that run.
	RunLast *point `json:"run_last,omitempty"`
	// First is the message counted under the epoch that was received first, LastAtMs the latest
	// receive time of one (nil and 0 before any).
	First    *point `json:"first,omitempty"`
	LastAtMs int64  `json:"last_at_ms,omitempty"`
	// Named are the numbers of Seen that gap events named missing, with the event and its cause
	// (oldest first, at most maxNamed): a copy of one stored later is not a duplicate but a message
	// the event must take back (a recovered event), as no bridge had stored it when the event was
	// classified. Beyond maxNamed the oldest are forgotten: a copy of one of those is then counted a
	// duplicate, as before the detector kept them.
	Named []namedRange `json:"named,omitempty"`
}

// namedRange is a run of numbers one gap event named missing under an epoch.
type namedRange struct {
	Lo    uint64 `json:"lo"`
	Hi    uint64 `json:"hi"`
	Cause string `json:"cause"`
	Gap   string `json:"gap"` // the event's id
}

// recovering is a run of numbers named missing by one gap event whose copies were stored after the
// event, not yet reported: contiguous copies extend it, anything else ends it (tracker.recover).
type recovering struct {
	Epoch int64  `json:"epoch"`
	Lo    uint64 `json:"lo"`
	Hi    uint64 `json:"hi"`
	Cause string `json:"cause"`
	Gap   string `json:"gap"`
	// First and Last are the first and last copies stored, as the event's evidence.
	First point `json:"first"`
	Last  point `json:"last"`
}

// heldMarker is a drop marker kept in State; Used once it covered part of a gap.
type heldMarker struct {
	streams.DropMarker
	Used bool `json:"used,omitempty"`
}

// crossing is a run taken to go on from Before, the last FPM seen, to After, under a bridge epoch
// newer than MaxEpoch, every epoch seen before it.
type crossing struct {
	MaxEpoch int64 `json:"max_epoch"`
	Before   point `json:"before"`
	After    point `json:"after"`
}

// Pending kinds.
const (
	kindJump    = "jump"
	kindResume  = "resume"
	kindRestart = "restart"
	kindStart   = "start"
	// kindMarked: the first numbers of a new run that a drop marker read late showed begin at a
	// crossing, up to the last number of the old run (tracker.markedLate).
	kindMarked = "marked"
)

// CauseCounts counts per cause.
type CauseCounts struct {
	BridgeDrop       uint64 `json:"bridge_drop"`
	ZMQDrop          uint64 `json:"zmq_drop"`
	PublisherRestart uint64 `json:"publisher_restart"`
	Reconnect        uint64 `json:"reconnect"`
	Stale            uint64 `json:"stale"`
	LateStart        uint64 `json:"late_start"`
}

func (c *CauseCounts) ptr(cause string) *uint64 {
	switch cause {
	case CauseBridgeDrop:
		return &c.BridgeDrop
	case CauseZMQDrop:
		return &c.ZMQDrop
	case CausePublisherRestart:
		return &c.PublisherRestart
	case causeReconnect:
		return &c.Reconnect
	case CauseStale:
		return &c.Stale
	case CauseLateStart:
		return &c.LateStart
	}
	return nil
}

// Get returns the count of cause (0 for an unknown cause).
func (c CauseCounts) Get(cause string) uint64 {
	if p := c.ptr(cause); p != nil {
		return *p
	}
	return 0
}

func (c *CauseCounts) add(cause string, n uint64) {
	if p := c.ptr(cause); p != nil {
		*p += n
	}
}

// sub takes n off cause's count, never below zero.
func (c *CauseCounts) sub(cause string, n uint64) {
	if p := c.ptr(cause); p != nil {
		*p -= min(*p, n)
	}
}

// Total is the sum over the causes.
func (c CauseCounts) Total() uint64 {
	return c.BridgeDrop + c.ZMQDrop + c.PublisherRestart + c.Reconnect + c.Stale + c.LateStart
}

// counters are a publisher's cumulative counts since the detector first saw it.
type counters struct {
	// Messages counts distinct FPMs (duplicates excluded), Heartbeats the idle heartbeats among them.
	Messages   uint64 `json:"messages"`
	Heartbeats uint64 `json:"heartbeats"`
	// Duplicates are FPMs whose sequence number was already counted, or named missing, under their
	// epoch (an FPM stored again, or a copy stored after a gap event named it); OutOfOrder are FPMs
	// that arrived after a later one and filled a pending gap. Neither is a gap. Messages counts each
	// number once per epoch: the stream holds an FPM once per epoch, so Messages is what it holds of
	// the publisher, less the duplicates.
	Duplicates uint64 `json:"duplicates"`
	OutOfOrder uint64 `json:"out_of_order"`
	// Recovered counts numbers a gap event named missing that were stored after all (a bridge that
	// lagged past the marker grace stored its copy): each is counted in Messages and taken off
	// Missing, and a recovered event says which.
	Recovered uint64 `json:"recovered,omitempty"`
	// SeqMismatch counts FPMs the bridge flagged with Fpm-Seq-Mismatch (counter_id != sequence frame).
	SeqMismatch uint64 `json:"seq_mismatch"`
	// Gaps counts gap events by cause (a publisher_restart event counts even when nothing is
	// missing); Missing counts the missing sequence numbers they report.
	Gaps    CauseCounts `json:"gaps"`
	Missing CauseCounts `json:"missing"`
	// Restarts counts publisher restarts, StalePeriods stale events.
	Restarts     uint64 `json:"restarts"`
	StalePeriods uint64 `json:"stale_periods"`
	// Markers counts drop markers received; MarkersUnused those discarded without covering a gap
	// (for example a shutdown marker for messages that were stored after all, or a marker that came
	// after its gap had been classified).
	Markers       uint64 `json:"markers"`
	MarkersUnused uint64 `json:"markers_unused"`
}

// Condition is a publisher's current state in reports and metrics.
const (
	conditionLive      = "live"
	conditionStale     = "stale"
	conditionRestarted = "restarted"
)

// kvKey is the state bucket key of k for group: "<group>.<namespace>.<component>.<worker_id>.<dp_rank>"
// with the subject tokens' '%' escapes written as '=' (streams.KVKeyTokens).
func kvKey(group string, k streams.Key) string {
	return group + "." + streams.KVKeyTokens(k)
}

// keyFromKV parses kvKey's result back.
func keyFromKV(group, kv string) (streams.Key, bool) {
	rest, ok := strings.CutPrefix(kv, group+".")
	if !ok {
		return streams.Key{}, false
	}
	k, err := streams.ParseKVKeyTokens(rest)
	return k, err == nil
}
