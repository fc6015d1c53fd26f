package streams

import "strconv"

// Consumer loss events: messages a stream removed before a durable consumer read them (the stream's
// limits, or a deletion behind its back), reported by the consumer runner of every stage on
// ConsumerLossSubject(<consumer>) with header Fpm-Event: loss, so a loss is counted where a user looks
// (`fpmbus gaps report`, `nats sub 'fpmevents.loss.>'`) and not only in one instance's log.

const (
	// ConsumerLossRoot is the root of ConsumerLossSubject.
	ConsumerLossRoot = EventsRoot + ".loss"
	// ConsumerLossWildcard matches every consumer's loss events.
	ConsumerLossWildcard = ConsumerLossRoot + ".*"
	// ConsumerLossEvent is a loss event's Fpm-Event header and "event" field.
	ConsumerLossEvent = "loss"
)

// Causes of a ConsumerLoss.
const (
	// LossRetention: the stream's limits (max_bytes, max_age, max_msgs) removed the messages: they lie
	// below the stream's first sequence.
	LossRetention = "retention"
	// LossDeleted: the messages were removed one by one (a purge by subject, `nats stream rmm`,
	// max_msgs_per_subject) while later ones remain.
	LossDeleted = "deleted"
)

// ConsumerLoss is the body of a loss event: stream sequences First..Last (Count messages) were removed
// from Stream before Consumer read them.
type ConsumerLoss struct {
	Event      string `json:"event"` // ConsumerLossEvent
	Cause      string `json:"cause"` // LossRetention or LossDeleted
	Consumer   string `json:"consumer"`
	Stream     string `json:"stream"`
	First      uint64 `json:"first_seq"`
	Last       uint64 `json:"last_seq"`
	Count      uint64 `json:"count"`
	DetectedAt int64  `json:"detected_at_unix_ms"`
}

// ConsumerLossSubject carries consumer's (its durable name's) loss events.
func ConsumerLossSubject(consumer string) string {
	return ConsumerLossRoot + "." + EncodeToken(consumer)
}

// ConsumerLossMsgID is the Nats-Msg-Id of the loss event for sequences first..last of stream seen by
// consumer: two instances (or a restart) reporting the same loss store it once.
func ConsumerLossMsgID(consumer, stream string, first, last uint64) string {
	return "loss:" + consumer + ":" + stream + ":" + strconv.FormatUint(first, 10) + "-" + strconv.FormatUint(last, 10)
}
