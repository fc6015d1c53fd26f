package streams

import (
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Acknowledged FPMs that the stream no longer holds.
//
// JetStream acknowledges a publish once the message is written, not once it is on disk (see
// SyncPolicy), and a damaged or truncated block file loses messages on the server's next start. The
// bridge therefore remembers, per publisher key, what it counted as stored (the ack records in
// BucketBridgeAcks) and compares that with the stream after it starts and after every reconnect. An
// acknowledged FPM that is gone is reported as a gap event of cause GapCauseLostAfterAck on the
// publisher's gap subject (GapEventSubject), in the gap detector's event format, so `nats sub
// 'fpmevents.gap.>'` and `fpmbus gaps report` see it with every other gap.

// BucketBridgeAcks is the KV bucket of the bridge's ack records: one key per publisher key
// (BridgeAckKey), a JSON record of the FPM sequences and stream sequences the bridge saw acknowledged.
const BucketBridgeAcks = "FPM_BRIDGE_ACKS"

// BridgeAcksBucket is the definition of BucketBridgeAcks (see bridgeBucket).
func (c Config) BridgeAcksBucket() jetstream.KeyValueConfig {
	return c.bridgeBucket(BucketBridgeAcks,
		"fpmbus bridge: per publisher key, the FPMs the bridge saw acknowledged (lost_after_ack checks)")
}

// BridgeAckKey is k's key in BucketBridgeAcks (see KVKeyTokens).
func BridgeAckKey(k Key) string { return KVKeyTokens(k) }

// GapCauseLostAfterAck: JetStream acknowledged the FPMs to the bridge and the stream no longer holds
// them (a power cut or OS crash before the server's fsync, a damaged block file, a deletion behind the
// bridge's back). Published by the bridge, never by the gap detector.
const GapCauseLostAfterAck = "lost_after_ack"

// LostAfterAckMsgID is the Nats-Msg-Id of the lost_after_ack event for sequences first..last of
// publisher run epoch: two bridges (or two checks) finding the same loss store it once.
func LostAfterAckMsgID(k Key, epoch int64, first, last uint64) string {
	return "lost:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":" + strconv.FormatUint(first, 10) + "-" + strconv.FormatUint(last, 10)
}

// LostAfterAck is the bridge's gap event for acknowledged FPMs the stream no longer holds: the fields
// every gap event carries (type GapEventType, id LostAfterAckMsgID, cause GapCauseLostAfterAck,
// event_seq 0), plus its own evidence.
type LostAfterAck struct {
	GapEventFields
	Evidence LostAfterAckEvidence `json:"evidence"`
}

// LostAfterAckEvidence says what the bridge had counted as stored and what the stream holds now.
type LostAfterAckEvidence struct {
	Summary string `json:"summary"`
	// Bridge found the loss; AckedBy is the bridge whose acks the record holds.
	Bridge  string `json:"bridge"`
	AckedBy string `json:"acked_by"`
	// AckedFirstStreamSeq..AckedLastStreamSeq are the FPM stream sequences the lost FPMs' acks named
	// (the run's, when the whole run is lost).
	AckedFirstStreamSeq uint64 `json:"acked_first_stream_seq"`
	AckedLastStreamSeq  uint64 `json:"acked_last_stream_seq"`
	// StoredLastStreamSeq is the stream sequence of the newest FPM of the publisher the stream holds (0:
	// none); StreamFirstSeq and StreamLastSeq are the stream's bounds when the check ran.
	StoredLastStreamSeq uint64 `json:"stored_last_stream_seq"`
	StreamFirstSeq      uint64 `json:"stream_first_seq"`
	StreamLastSeq       uint64 `json:"stream_last_seq"`
	// RecordedAtMs is when the bridge last wrote the record the loss was found against; CheckedAtMs
	// when the check ran; Trigger is "start" or "reconnect".
	RecordedAtMs int64  `json:"recorded_at_ms"`
	CheckedAtMs  int64  `json:"checked_at_ms"`
	Trigger      string `json:"trigger"`
	// CountExact is false when the bridge no longer remembered every number it never stored inside the
	// span (more than it keeps per run): Missing is then an upper bound.
	CountExact bool `json:"count_exact"`
}

// Msg is the event's message: subject GapEventSubject(e.Key), the event as JSON, Nats-Msg-Id e.ID,
// Fpm-Event gap, Fpm-Bridge and Fpm-Epoch.
func (e *LostAfterAck) Msg() *nats.Msg {
	return bridgeEventMsg(GapEventSubject(e.Key), e.ID, GapEventType, e.Evidence.Bridge, e.Epoch, e)
}
