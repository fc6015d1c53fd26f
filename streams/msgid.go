package streams

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Message ids (Nats-Msg-Id) of every message fpmbus publishes. An id is derived from what the message
// says (an FPM's also from the publisher run it belongs to), never from when it was sent, so that a
// retry or a re-publication after a crash is stored once (within the streams' duplicate window). Each
// kind of message has its own prefix, so ids of different kinds never collide.

// FPMMsgID is the Nats-Msg-Id of one FPM, the same whichever bridge publishes it, so that redundant
// bridges on one publisher store each FPM once (and a bridge's own retries are deduplicated):
//
//	<key>:<seq>:<digest>:e<epoch>
//
// digest is PayloadDigest of the payload as received, epoch the publisher run's agreed epoch. The id is
// derived from what every bridge receives and agrees on, never from when or by whom:
//
//   - Two publisher runs are two runs, even when their bytes agree (a recording replayed twice, a
//     deterministic publisher restarted, idle heartbeats, which are the same at the same seq of every
//     run): the epoch tells them apart. Redundant bridges agree on it through BucketBridgeRuns before
//     the run's first publication, and it strictly increases per publisher, so two runs never share an
//     id and every bridge that agreed on the run gives an FPM the same one.
//   - Within a run (key, seq) names one FPM. The digest is there for the one case the epoch cannot
//     tell apart: a bridge that wrongly adopted the previous run's epoch (a publisher restart within
//     milliseconds of the bridge's start): a busy FPM's payload carries its own counter_id, wall_time
//     and request counts, so the new run's busy FPMs are still stored rather than taken for the old
//     run's.
//
// Ids of different publisher keys never collide: keyTokens is injective and ':' is escaped in it.
func FPMMsgID(k Key, seq uint64, digest string, epochMs int64) string {
	return keyTokens(k) + ":" + strconv.FormatUint(seq, 10) + ":" + digest + ":e" + strconv.FormatInt(epochMs, 10)
}

// PayloadDigest is the digest of an FPM payload in message ids: the first 16 bytes of its SHA-256, in
// hex (32 characters). 128 bits make an accidental collision between two payloads of one key at one
// seq within a duplicate window negligible.
func PayloadDigest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:16])
}

// MsgID is the epoch-and-sequence identity of a publisher run's message, the base of drop marker ids
// (dropMarkerMsgID) and of the Nats-Msg-Id fpmbus gave FPMs before redundant bridges (tests and tools
// that publish FPMs by hand still use it: any id unique per FPM will do).
func MsgID(k Key, epochMs int64, seq uint64) string {
	return keyTokens(k) + ":" + strconv.FormatInt(epochMs, 10) + ":" + strconv.FormatUint(seq, 10)
}

// dropMarkerMsgID is the Nats-Msg-Id of the drop marker for sequences first..last of publisher run
// epochMs dropped for reason: derived from the range, so publishing a marker twice stores it once.
func dropMarkerMsgID(k Key, epochMs int64, first, last uint64, reason string) string {
	return "drop:" + MsgID(k, epochMs, first) + ":" + strconv.FormatUint(last, 10) + ":" + reason
}

// socketDeadLetterMsgID is the Nats-Msg-Id of a bridge's dead letter: bridge, the socket's DP rank,
// the receive time (Unix ns) and the bridge's running count of dead letters, so two invalid inputs
// are never taken for one.
func socketDeadLetterMsgID(bridge string, dpRank int, receivedAtNs int64, count uint64) string {
	return "deadletter:" + bridge + ":" + strconv.Itoa(dpRank) + ":" + strconv.FormatInt(receivedAtNs, 10) + ":" +
		strconv.FormatUint(count, 10)
}

// consumerDeadLetterMsgID is the Nats-Msg-Id of consumer's dead letter for the message at streamSeq
// of stream: a consumer that dead-letters the same message again after a restart stores it once.
func consumerDeadLetterMsgID(consumer, stream string, streamSeq uint64) string {
	return "consumer-deadletter:" + EncodeToken(consumer) + ":" + stream + ":" + strconv.FormatUint(streamSeq, 10)
}

// GapMsgID is the Nats-Msg-Id of the gap event for sequences first..last revealed under epoch.
func GapMsgID(k Key, epoch int64, first, last uint64) string {
	return "gap:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":" + strconv.FormatUint(first, 10) + "-" + strconv.FormatUint(last, 10)
}

// RestartMsgID is the Nats-Msg-Id of the publisher_restart event of the run that started under epoch.
func RestartMsgID(k Key, epoch int64) string {
	return "gap:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":restart"
}

// RecoveredMsgID is the Nats-Msg-Id of the recovered event taking back first..last under epoch.
func RecoveredMsgID(k Key, epoch int64, first, last uint64) string {
	return "recovered:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":" + strconv.FormatUint(first, 10) + "-" + strconv.FormatUint(last, 10)
}

// StaleMsgID is the Nats-Msg-Id of the stale event after message lastSeq of epoch.
func StaleMsgID(k Key, epoch int64, lastSeq uint64) string {
	return "stale:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":" + strconv.FormatUint(lastSeq, 10)
}

// ResumedMsgID is the Nats-Msg-Id of the resumed event closing the stale event StaleMsgID(k, epoch,
// lastSeq).
func ResumedMsgID(k Key, epoch int64, lastSeq uint64) string {
	return "resumed:" + keyTokens(k) + ":" + strconv.FormatInt(epoch, 10) + ":" + strconv.FormatUint(lastSeq, 10)
}

// Benchmark message ids. <run> is the run_id encoded with EncodeToken; a body's sha256 is part of the id
// wherever the same subject may carry other bytes later, so a re-publication of other bytes is stored
// (and seen as a conflict) while one of the same bytes is deduplicated.

// BenchRankMsgID is the Nats-Msg-Id of run runID's rank artefact with sha256 digest.
func BenchRankMsgID(runID string, rank int, digest string) string {
	return "fpmbench:rank:" + EncodeToken(runID) + ":" + strconv.Itoa(rank) + ":" + digest
}

// BenchProbeMsgID is the Nats-Msg-Id of run runID's worker-probe replies with sha256 digest.
func BenchProbeMsgID(runID, digest string) string {
	return "fpmbench:probe:" + EncodeToken(runID) + ":" + digest
}

// BenchProfileMsgID is the Nats-Msg-Id of run runID's collection profile with sha256 digest.
func BenchProfileMsgID(runID, digest string) string {
	return "fpmbench:profile:" + EncodeToken(runID) + ":" + digest
}

// BenchMergedMsgID is the Nats-Msg-Id of run runID's merged artefact: one per run, whatever its bytes.
func BenchMergedMsgID(runID string) string { return "fpmbench:merged:" + EncodeToken(runID) }

// BenchSidecarMsgID is the Nats-Msg-Id of run runID's worker-probe sidecar with sha256 digest.
func BenchSidecarMsgID(runID, digest string) string {
	return "fpmbench:sidecar:" + EncodeToken(runID) + ":" + digest
}

// BenchOutcomeMsgID is the Nats-Msg-Id of run runID's one outcome event.
func BenchOutcomeMsgID(runID string) string {
	return "fpmevents:bench:" + EncodeToken(runID) + ":outcome"
}

// BenchConflictMsgID is the Nats-Msg-Id of the conflict event for rank's re-publication with sha256
// digest (the refused bytes).
func BenchConflictMsgID(runID string, rank int, digest string) string {
	return "fpmevents:bench:" + EncodeToken(runID) + ":conflict:" + strconv.Itoa(rank) + ":" + digest
}
