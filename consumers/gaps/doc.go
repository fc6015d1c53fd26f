// Package gaps is the gap detector: a durable consumer of the FPM stream, reading the bridge's drop
// markers too, that tracks every publisher's sequence (namespace, component, worker_id, dp_rank) and
// publishes one JSON event per gap on FPM_EVENTS, subject
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
//	reconnect          a new bridge epoch began on a new connection with the sequence further on
//	                   (Fpm-Run-Start: reconnect): the publisher may have restarted unseen, so the
//	                   new run's numbers before the first received are named, as for a restart
//	stale              the publisher was silent past --stale-after and came back further on
//	late_start         the first message seen of a publisher is above 0: the numbers before it were
//	                   sent before the bridge was subscribed
//
// plus "stale" and "resumed" events that open and close a silent period, and "recovered" events that
// take back numbers a gap event named whose copies a bridge stored after the event (TypeRecovered).
// Duplicates and out-of-order numbers are counted, not reported. Every missing number is in exactly
// one gap event, and a stored one in none that was not taken back.
//
// The detector is a durable.Consumer (consumers/durable): a durable.Runner owns its partition group,
// acks, dead letters, crash-loop guard, common metrics and stop sequence, and hands it batches of FPMs.
// One FPM travels through these files:
//
//	detector.go     Detector: New, Run, Ready; setup and the upgrade of explicit-ack groups
//	consumer.go     the Consumer and PartitionObserver methods: Handle, Tick, Close, Assigned (preload),
//	                Release (synchronous checkpoint), Lost (forget)
//	apply.go        an FPM or drop marker applied to its publisher's state; unusable FPMs rejected
//	tracker.go      the per-publisher rules (pure: state in, state and events out)
//	checkpoint.go   checkpoints: when, what, and marking the messages they cover done
//	store.go        stateStore: the state bucket, direct reads of FPM and FPM_EVENTS, checkpoint writes
//	publishers.go   the owned publishers: loading, catching up, reloading, forgetting
//	clock.go        the wall-clock checks: stale publishers, marker graces passed
//	markerreader.go the drop marker reader (an ordered consumer, not a durable one)
//	event.go        Event (the JSON format), causes, deterministic event ids
//	state.go        state, one publisher's checkpoint, and its KV key
//	report.go       BuildReport, ParseSince: `fpmbus gaps report`
//	metrics.go      Prometheus metrics (fpmbus_gaps_*; the runner adds fpmbus_consumer_*{consumer="gaps"})
//	heartbeat.go    heartbeat detection without a full parse
//
// What crosses the wire is streams' (the one wire contract): the drop marker (streams.DropMarker,
// parsed and checked by streams.ParseDropMarker), the events' subjects, message ids
// (streams.GapMsgID, RestartMsgID, StaleMsgID, ResumedMsgID) and headers (Fpm-Event,
// Fpm-Gap-Event-Seq), and the fields every gap event carries (streams.GapEventFields, which the
// bridge's lost_after_ack events carry too). This package owns the rest of the event body (Event: the
// message after the gap, the stale fields, the evidence) and the rules that produce it.
//
// # Invariants
//
//   - Per publisher, FPMs are applied in stream order, each once: state.StreamSeq is the last one
//     applied; a delivered message at or below it is a redelivery and is skipped. A publisher loaded
//     from its checkpoint first re-reads (direct get by subject) its FPMs between the checkpoint and
//     the first one delivered, so a message acked after the checkpoint is never lost to it.
//
//   - A message whose effect is more than "the sequence advanced by one" (a gap, a marker, a
//     duplicate, an event, ...) is marked done (Msg.Done: the runner may ack it) only after the state
//     reflecting it is in the state bucket, written with the expected revision (a concurrent writer
//     makes the write fail and the publisher is reloaded; its held messages are done once it is, the
//     re-read covering them). Plain advances are done with the next checkpoint without waiting for a
//     state write, and written at most every CheckpointInterval (and when their partition is handed
//     on): the re-read above covers them. Acks are cumulative (AckAll): the runner acks a partition's
//     messages in delivery order, the last of each done prefix standing for the rest, so a message
//     waiting for its checkpoint holds back the acks of every later one of its partition. An FPM that
//     can never be applied (its subject names no publisher, its sequence headers do not parse) is
//     rejected (Msg.Reject): the runner dead-letters it on fpmevents.deadletter.consumer.gaps and it is done; its
//     number, if it had one, is reported missing like any lost one. A publisher is called stale only
//     when FPM holds nothing of it after its last applied message (a direct get, after the re-read if
//     a takeover left one to do).
//
//   - Events are checkpointed in state.Outbox before they are published, and published with a
//     deterministic Nats-Msg-Id (streams.GapMsgID gap:<key>:<epoch>:<first>-<last>, …:restart,
//     recovered:…, stale:…, resumed:…);
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
//     position also moves past the events it does not match). Every FPM of its publisher stored up
//     to that time must have been applied too (the next one not applied, by direct get, is stored
//     after it): the missing numbers themselves may be stored after the FPM that revealed the gap
//     (a bridge resends what a stream leader that stopped answering never acknowledged), and they
//     fill it. Every pending gap is examined, of whatever run of its publisher: a restart does not
//     end the old run's gaps.
//
//   - An FPM that would make a publisher's run go on across a new bridge epoch (a bridge's first run
//     of it: no run start, the sequence gone on) is applied only when the drop markers stored up to
//     its stream time + MarkerGrace are, by the same watermark: a bridge started again publishes the
//     markers its previous run spooled beside its first FPMs, and a marker may show that a new run
//     began in between (the bridge's, from 0 or from below the last number it stored). Meanwhile it
//     and the publisher's later FPMs are held, acknowledged with checkpoints that stay before them,
//     and read again from the stream (Detector.waitsForMarkers). A marker read later still names the
//     new run's numbers then (tracker.markedLate, from state.Crossings): never a number left unnamed
//     because its marker came late.
//
//   - Publishers are shared through consumers/partition (group Config.Group, Config.Partitions,
//     keyed by the publisher), run by the durable.Runner: only the member holding a publisher's
//     partition applies its FPMs and markers. Assigned loads the partition's publishers first.
//     Release (a graceful hand-over) checkpoints, publishes and marks done everything of its
//     publishers before it returns; Lost forgets them at once, without writing (a checkpoint already
//     in flight is fenced by the expected revision). A message is never Nak'ed: what is not acked
//     comes again to the next owner. An idle partition is taken over too (consumers/partition
//     redelivers its last acked message, which is skipped as already reflected), so a silent
//     publisher or a gap waiting for its grace is reported even when its owner died.
//
//   - Drop markers are read by an ordered consumer per instance from its start (markerReader; not a
//     durable consumer, nothing to ack); a loaded publisher first reads by direct get its markers
//     after MarkerSeq (only if its subject has any).
//
// # Ownership
//
// The runner's loop goroutine owns all state: every Consumer method runs on it. The detector's own
// goroutines are the marker reader's (it queues pulled markers and asks the loop, with Runner.Do,
// to apply them) and at most one checkpoint goroutine at a time (it touches only its own snapshot and
// hands its result back with Runner.Do); Close and Run stop them before returning. There are no
// mutexes.
package gaps
