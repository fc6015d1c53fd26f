// Package durable is the one consumer contract of fpmbus: every durable consumer (trace writer, gap
// detector, benchmark merger, dataset sealer) is an implementation of Consumer run by a Runner, and
// the Runner owns everything that is not specific to a stage.
//
// # Writing a stage
//
// A stage is a Consumer (below) and a constructor of one shape, the one every shipped stage has:
//
//	func New(cfg Config, js jetstream.JetStream, opts ...durable.Option) (*Stage, error)
//
// Its Config holds everything an operator configures, its own knobs (hooks, shared state) and, as in
// every fpmbus component, its Logger and Prometheus Registerer; the options are this package's
// (WithMemberID, WithClock), the same for every stage. The constructor checks cfg, js and the options
// with CheckStage, builds its group (a GroupConfig: FPMGroup or benchGroup, then what the stage
// changes) and its Runner with New(Config{Name, Group, ..., Logger, Registerer}, js, consumer, opts...),
// and shows the runner's Ready, Owned and Run as its own. The package example is a whole fifth
// consumer in about thirty lines.
//
// # What a stage provides (Consumer)
//
//   - Handle: process a batch of one partition's messages, in stream order. For each message the stage
//     calls Msg.Done once the message's effect is durable (or there is nothing to keep), from any
//     goroutine, as late as it likes (a merger holds a run's ranks until the run is complete); or
//     Msg.Reject when the message can never succeed (it is then dead-lettered and never delivered again).
//     An error returned by Handle or Tick is fatal for the instance: the runner stops, its partitions go
//     to another instance, and what was not done is redelivered there.
//   - Tick: periodic work on the runner's goroutine (flush, sweep, stale checks).
//   - Close: a final flush with a deadline, after every partition has been released.
//   - Optionally (PartitionObserver): Assigned when a partition is taken, Release when it is handed on
//     gracefully (make everything of it durable and call Done), Lost when it is lost abruptly (forget it
//     without writing: another instance may own it already). A stage that writes nothing at a handover
//     embeds ForgetOnHandover.
//
// Every method of a Consumer is called from one goroutine, the runner's loop, so a stage needs no
// locks for the state these calls share. Work a stage does on its own goroutines comes back to the
// loop with Runner.Do.
//
// # What the runner owns
//
//   - Scale-out and failover: every runner is a member of a partition group (GroupConfig, documented
//     here; the runner drives consumers/partition, which a stage never imports). Each partition has one
//     owner at a time and hot standbys; ownership, ordered takeover, graceful handover and crash
//     failover (after PinnedTTL) are the runner's. With Partitions 0 (FPMGroup's default) New gives the
//     group one partition per shard of its stream, asking the server how many FPM shards there are, so
//     that every partition reads its shard (or the one stream FPM) directly and nothing is copied; a
//     stage asks for another count only when it needs one (a partition stream <Stream>_PART_<Group>
//     then copies what the filters select).
//   - Acks: a message is acknowledged only after its Done. With cumulative acks (the group's AckAll
//     policy) the runner acks, per partition session, the last message of the prefix that is done: one
//     ack covers many messages. Otherwise it acks each done message. A message held longer than a third
//     of AckWait gets an in-progress ack, so long work is never redelivered under its holder.
//   - Poison: a message delivered more than MaxDeliveries times (it crashed or stalled every instance
//     that took it), or rejected by the stage, is published as a dead letter on FPM_EVENTS naming the
//     consumer, subject, stream sequence and reason, then terminated (or, under cumulative acks, marked
//     done: a Term would acknowledge every message before it). It never holds up the others.
//   - Retention loss: a consumer that reads every subject of its stream notices messages the stream
//     removed before they were read (its deliveries jump over stream sequences) and reports the exact
//     range and count: a log line, a metric and a loss event on FPM_EVENTS with cause "retention".
//   - Metrics common to every consumer: delivered, acked, redelivered, terminated, lost to retention,
//     lag (messages still pending on the server) and processing time, labelled by consumer, registered
//     with Config.Registerer.
//   - A stage that holds messages until something else arrives takes its group's settings as a
//     HoldingConfig (defaults, checks, group and runner config; crash loops bounded by
//     holdingMaxDeliveries).
//   - Readiness (Ready) and the stop sequence: stop fetching, let the stage drain and make durable what
//     it holds (Release per partition), ack, Close with the deadline; what is still not done is left
//     unacked and the partition consumer is reset, so the next owner gets it at once and in order.
package durable
