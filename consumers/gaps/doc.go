// Package gaps is the gap detector: durable JetStream consumers of the FPM stream and of the
// bridge's drop markers that track every publisher's sequence (namespace, component, worker_id,
// dp_rank) and publish one JSON event per gap on FPM_EVENTS, subject
// fpmevents.gap.<namespace>.<component>.<worker_id>.<dp_rank> (streams.GapEventSubject), saying what
// was lost and why.
//
// Dynamo's publisher numbers every message it sends, heartbeats included, from 0 per run (the ZMQ
// sequence frame, = counter_id, header Fpm-Seq). A missing number is classified as
//
//	bridge_drop        the bridge dropped it itself and said so in a drop marker (fpmevents.drop.…)
//	zmq_drop           the bridge received a jump and no marker covered it within --marker-grace
//	publisher_restart  the sequence went back under a new bridge epoch; the event says how far the
//	                   old run got (its missing numbers are the new run's first ones that never came)
//	stale              the publisher was silent past --stale-after and came back further on
//	late_start         the first message seen of a publisher is above 0: the numbers before it were
//	                   sent before the bridge was subscribed
//
// plus "stale" and "resumed" events that open and close a silent period. Duplicates and out-of-order
// numbers are counted, not reported. Every missing number is in exactly one gap event.
//
// One FPM travels through these files:
//
//	detector.go   Detector: New, Run, Ready; the loop over partitions and markers, ticks, graceful stop
//	session.go    the partition.Handler: partitions gained, handed on (checkpoint, ack) and lost
//	ack.go        cumulative acks: per partition session, ack the end of the prefix made durable
//	fetch.go      a goroutine moving pulled drop markers onto a channel
//	tracker.go    the per-publisher rules (pure: state in, state and events out)
//	event.go      Event (the JSON format), causes, the evidence a drop marker gives
//	state.go      State, one publisher's checkpoint, and its KV key
//	store.go      loading, catching up and checkpointing state; publishing events; acking
//	partition.go  which publishers an instance owns (the partitions it holds now)
//	report.go     BuildReport: `fpmbus gaps report`
//	metrics.go    Prometheus metrics (fpmbus_gaps_*)
//	heartbeat.go  heartbeat detection without a full parse
//
// What crosses the wire is streams' (the one wire contract): the drop marker (streams.DropMarker,
// parsed and checked by streams.ParseDropMarker), the events' subjects, message ids
// (streams.GapMsgID, RestartMsgID, StaleMsgID, ResumedMsgID) and headers (Fpm-Event,
// Fpm-Gap-Event-Seq). This package owns the event body (Event) and the rules that produce it.
//
// # Invariants
//
//   - Per publisher, FPMs are applied in stream order, each once: State.StreamSeq is the last one
//     applied; a delivered message at or below it is a redelivery and is skipped. A publisher loaded
//     from its checkpoint first re-reads (direct get by subject) its FPMs between the checkpoint and
//     the first one delivered, so a message acked after the checkpoint is never lost to it.
//
//   - A message whose effect is more than "the sequence advanced by one" (a gap, a marker, a
//     duplicate, an event, ...) is acked only after the State reflecting it is in the state bucket,
//     written with the expected revision (a concurrent writer makes the write fail and the publisher
//     is reloaded; its held messages are acked once it is, the re-read covering them). Plain advances
//     are acked with the next commit without waiting for a state write, and checkpointed at most
//     every CheckpointInterval (and when their partition is handed on): the re-read above covers
//     them. Acks are cumulative (AckAll): a partition's messages are acked in delivery order, the
//     last of each durable prefix standing for the rest, so a message waiting for its checkpoint
//     holds back the acks of every later one of its partition. An unusable message is skipped, not
//     Term'ed. A publisher is called stale only when FPM holds nothing of it after its last applied
//     message (a direct get, after the re-read if a takeover left one to do).
//
//   - Events are checkpointed in State.Outbox before they are published, and published with a
//     deterministic Nats-Msg-Id (streams.GapMsgID gap:<key>:<epoch>:<first>-<last>, …:restart, stale:…,
//     resumed:…);
//     a loaded outbox is reconciled with the events already stored on the publisher's subject, so a
//     crash anywhere stores each event once.
//
//   - Event content comes from the messages (bridge receive time, epochs, sequence numbers) and from
//     stream time, never from the detector's clock; the wall clock only decides when to look (stale
//     publishers while caught up).
//
//   - A revealed gap is classified zmq_drop only when every drop marker stored up to
//     (its revealing FPM's stream time + MarkerGrace) has been applied: the marker consumer has
//     passed that stream time, or is caught up with the server's clock past it (nothing pending and
//     nothing delivered after the last marker applied, by delivery sequence: the consumer's stream
//     position also moves past the events it does not match). Every pending gap is examined, of
//     whatever run of its publisher: a restart does not end the old run's gaps.
//
//   - Publishers are shared through consumers/partition (group Config.Group, Config.Partitions,
//     keyed by the publisher): only the member holding a publisher's partition applies its FPMs and
//     markers. Handing a partition on gracefully first checkpoints, publishes and acks everything of
//     its publishers; a lost partition is forgotten at once, without writing (a checkpoint already in
//     flight is fenced by the expected revision). A message is never Nak'ed: what is not acked comes
//     again to the next owner.
//
//   - Drop markers are read by an ordered consumer per instance from its start; a loaded publisher
//     first reads by direct get its markers after MarkerSeq (only if its subject has any).
//
// # Ownership
//
// Run's goroutine owns all state. It starts the marker fetcher goroutine, the partition member
// (whose handler goroutines only forward messages and partition changes to the loop on one
// channel) and at most one checkpoint goroutine at a time (which touches only its own snapshot), and
// stops them before returning. There are no mutexes.
package gaps
