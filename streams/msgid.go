package streams

import "strconv"

// MsgID is the Nats-Msg-Id of one FPM: stable for the same message (so the bridge's own retries are
// deduplicated) and unique across publisher restarts, because the publisher-run epoch is part of it
// while the ZMQ sequence restarts at 0.
func MsgID(k Key, epochMs int64, seq uint64) string {
	return keyTokens(k) + ":" + strconv.FormatInt(epochMs, 10) + ":" + strconv.FormatUint(seq, 10)
}
