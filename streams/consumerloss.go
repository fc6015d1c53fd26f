package streams

import "strconv"

// Consumer loss events: messages a stream removed before a durable consumer read them (the stream's
// limits, or a deletion behind its back), reported by the consumer runner of every stage, and a
// consumer's own output it removed by its retention rule (the trace writer's pruned segments), on
// ConsumerLossSubject(<consumer>) with header Fpm-Event: loss, so a loss is counted where a user looks
// (`fpmbus gaps report`, `nats sub 'fpmevents.loss.>'`) and not only in one instance's log.

const (
	// consumerLossRoot is the root of ConsumerLossSubject.
	consumerLossRoot = eventsRoot + ".loss"
	// ConsumerLossWildcard matches every consumer's loss events.
	ConsumerLossWildcard = consumerLossRoot + ".*"
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
	// LossPruned: the consumer wrote the messages and removed what it wrote by its own retention
	// rule (the trace writer's --max-segments pruning a producer's oldest segment): Count lines, of
	// stream sequences First..Last where the writer knows them (0 otherwise).
	LossPruned = "pruned"
)

// ConsumerLoss is the body of a loss event: stream sequences First..Last (Count messages) were removed
// from Stream before Consumer read them; with cause LossPruned, Count lines Consumer wrote were removed
// with its output file Segment (of Producer; FirstObservedMs and LastObservedMs are the earliest and
// latest observation times of its lines, which the stream may have stored in another order).
type ConsumerLoss struct {
	Event      string `json:"event"` // ConsumerLossEvent
	Cause      string `json:"cause"` // LossRetention, LossDeleted or LossPruned
	Consumer   string `json:"consumer"`
	Stream     string `json:"stream"`
	First      uint64 `json:"first_seq"`
	Last       uint64 `json:"last_seq"`
	Count      uint64 `json:"count"`
	DetectedAt int64  `json:"detected_at_unix_ms"`
	// LossPruned only.
	Segment         string `json:"segment,omitempty"`
	Producer        string `json:"producer,omitempty"`
	FirstObservedMs int64  `json:"first_observed_unix_ms,omitempty"`
	LastObservedMs  int64  `json:"last_observed_unix_ms,omitempty"`
}

// ConsumerLossSubject carries consumer's (its durable name's) loss events.
func ConsumerLossSubject(consumer string) string {
	return consumerLossRoot + "." + EncodeToken(consumer)
}

// ConsumerLossMsgID is the Nats-Msg-Id of the loss event for sequences first..last of stream seen by
// consumer: two instances (or a restart) reporting the same loss store it once.
func ConsumerLossMsgID(consumer, stream string, first, last uint64) string {
	return "loss:" + consumer + ":" + stream + ":" + strconv.FormatUint(first, 10) + "-" + strconv.FormatUint(last, 10)
}

// ConsumerPrunedMsgID is the Nats-Msg-Id of the loss event for the output file segment that consumer
// pruned: a retried publish stores it once.
func ConsumerPrunedMsgID(consumer, segment string) string {
	return "loss:" + consumer + ":pruned:" + segment
}
