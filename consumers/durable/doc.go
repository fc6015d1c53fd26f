// Package durable is the one consumer contract of fpmbus: every durable consumer (trace writer, gap
// detector, benchmark merger, dataset sealer) is an implementation of Consumer run by a Runner, and
// the Runner owns everything that is not specific to a stage.
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
//     without writing: another instance may own it already).
//
// Every method of a Consumer is called from one goroutine, the runner's loop, so a stage needs no
// locks for the state these calls share. Work a stage does on its own goroutines comes back to the
// loop with Runner.Do.
//
// # What the runner owns
//
//   - Scale-out and failover: every runner is a member of a consumers/partition group (P = 1: one
//     active instance and hot standbys on the stream itself; P > 1: partitions spread over the
//     instances). Ownership, ordered takeover, graceful handover and crash failover are that package's;
//     stages name their group through this package (GroupConfig, Filter, FPMGroup, BenchGroup) and
//     never import consumers/partition.
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
//     lag (messages still pending on the server) and processing time, labelled by consumer.
//   - The options every stage takes (Settings: logger, registerer, member id, clock): a stage offers
//     WithLogger, WithMemberID, ... as its own by wrapping the ones here, so each value is checked in
//     one place, and hands them to its Runner with Inherit (NewStageRunner builds a stage's Runner so;
//     NewStage wraps it in a Stage, which a stage's exported type embeds for Ready, Owned and Run).
//     Every stage's constructor starts with CheckStage: its configuration, a JetStream, its options.
//     A stage that holds messages until something else arrives takes its group's settings as a
//     HoldingConfig (defaults, checks, group and runner config; crash loops bounded by
//     HoldingMaxDeliveries). A stage that writes nothing at a handover embeds ForgetOnHandover as its
//     PartitionObserver.
//   - Readiness (Ready) and the stop sequence: stop fetching, let the stage drain and make durable what
//     it holds (Release per partition), ack, Close with the deadline; what is still not done is left
//     unacked and the partition consumer is reset, so the next owner gets it at once and in order.
package durable
