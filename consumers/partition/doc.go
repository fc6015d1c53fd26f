// Package partition is the one mechanism every stateful fpmbus consumer (trace writer, gap detector,
// benchmark merger) uses to share a stream's keys among the instances of a group: each key belongs to
// one of P partitions, each partition has exactly one owner at a time, an owner that stops hands its
// partitions on at once, and one that crashes loses them after a bounded time, without loss, without
// reordering a key's messages, and without two instances ever processing a key at the same time.
//
// # Design: server-side partitions, push consumers moved by compare-and-set, a reset on every takeover
//
// Pieces, all on the NATS server (2.14+; fpmbus embeds 2.15):
//
//   - Partitions. With P > 1 the group reads a partition stream <Stream>_PART_<Group> that sources
//     its stream through the server's subject transform "{{partition(P,i...)}}.<subject>": the server
//     prefixes every message with its partition number while copying it. The FPM stream, its subjects
//     and its messages are untouched (users keep `nats sub 'fpm.>'`), and a key's messages keep their
//     order. With P = 1 there is no copy: the group consumes the stream itself.
//   - Ownership. Partition p is one durable push consumer (<Group>-<p>; with P = 1 just <Group>), with
//     flow control and idle heartbeats, delivering to one subject: its owner's. The owner record, key
//     <stream>.<group>.owner.<p> in KV bucket FPM_GROUPS, names the owner and its subject; it is written
//     only with compare-and-set on its revision, so of two members deciding to take a partition at
//     once exactly one does. Only that one points the consumer at a fresh _INBOX subject of its own
//     (a consumer update), and the server refuses to move a deliver subject that has a subscriber
//     (error 10013): a live owner's partition cannot be taken from under it. Exclusivity is the
//     server's, not a client protocol's: the server delivers to one subject, that only the owner
//     subscribes to. An owner rewrites its record (same revision) every PinnedTTL/2 and ends its
//     session when that fails (someone took the record) or when two idle heartbeats go missing.
//   - Flow control. The owner subscribes itself (push.go) rather than through nats.go's push consumer:
//     an owner that dies or leaves with a flow-control request in flight leaves the consumer stalled
//     for every later owner (a subject move or a reset does not clear it), and the server names the
//     request only in the stall header of its idle heartbeats, which nats.go does not answer. The
//     owner answers requests and stalls, so a takeover after such a death resumes within one idle
//     heartbeat.
//   - Liveness. A standby assigned a partition looks at it every PinnedTTL/10 (at most 500 ms). It
//     takes it at once when the record says released or names this member itself (its own ended
//     session, or with a stable id its dead incarnation), or when nobody has owned it yet. It takes it
//     when the owner's subject has no subscriber (the owner's connection is gone: crashed, stopped,
//     cut off or frozen, and closed by the server: a frozen one once it misses its pings, about 30 s
//     with fpmbus's server settings) and the owner has not rewritten its record (every
//     PinnedTTL/2) for PinnedTTL: the same bound as a pin. A fresh record whose subject has no
//     subscriber yet is an owner between its claim and its subscription, and is left alone. A subject
//     that keeps a subscriber while the record has been stale for the longer of 3 x PinnedTTL and
//     ReleaseTimeout + PinnedTTL (a `nats sub '>'` left running, or an owner that cannot write its
//     record) is claimed too; the server moves it once that subscriber leaves, and the old owner stops
//     at its next record refresh. Record ages are the server's storage times against the standby's
//     clock: hosts' clocks must agree to well within PinnedTTL.
//   - Why push. A pinned-client pull consumer (ADR-42) would give the same exclusivity, but the server
//     then re-encodes a Nats-Pin-Id header into every message it delivers, about 2 us of CPU each:
//     0.72x of a bare pull consumer's rate on 2 cores. A push consumer to one subject costs less than
//     serving pull requests (BenchmarkTraceWriterVsBareConsumer, BenchmarkDetectorVsAckOnly: the push
//     side runs at about 1.1-1.2x of bare).
//   - Ordered takeover. A new owner resets the consumer to its ack floor (ResetConsumer, server
//     2.14+) after pointing it at itself and before subscribing: every message the previous owner did
//     not ack comes again, in stream order, before anything newer. While it owns the partition the
//     member checks that deliveries are numbered without gaps (a gap means one got lost on the way,
//     e.g. in a reconnect) and ends the session to take it again (and reset) if not.
//   - Balance. Members heartbeat in KV bucket FPM_GROUPS (key <stream>.<group>.<member>, every
//     PinnedTTL/4; deleted on graceful leave) and watch it. Every member computes the same assignment
//     from the live set (rendezvous hashing with a ceil(P/N) cap: balanced, few moves when one joins
//     or leaves) and stands by only for the partitions assigned to it; a partition given to another
//     member is released gracefully. The bucket steers who stands by; the record decides who owns.
//   - Outages of the cluster. A member always counts itself live, so while the members bucket cannot
//     be written or watched (its stream electing a leader after a node stopped) it keeps what it
//     owns (an owner needs the bucket only to refresh its record, and a refresh that cannot be written
//     changes nothing), and nobody can take a partition (a claim needs the bucket); the watch is
//     opened again when it ends, and replaced when the member's own acknowledged heartbeat does not
//     come back through it within max(PinnedTTL/2, 1 s). Join retries, for up to 30 s, server calls
//     that fail only because the cluster cannot answer yet (no responders, no answer, JetStream or a
//     stream's peers unavailable), each call bounded by 5 s (TestJoinWaitsForTheClusterToAnswer,
//     TestMembersSurviveAnOutageOfTheMembersBucket). A partition stream's source that the server lost
//     in an outage is set up again on a backoff that grows with every failure (up to 2 minutes), so
//     the group could stay behind long after the cluster is back: every 10 s each member looks at the
//     source and, when it has been inactive for 20 s, asks the partition stream's leader to step
//     down; the next leader sets it up at once (source.go; it needs
//     $JS.API.STREAM.LEADER.STEPDOWN.<partition stream>, in ops/nats/permissions.conf).
//
// Handing a partition over gracefully (Stop, a rebalance): the owner stops handing messages (it stays
// subscribed, so the subject stays its own; what arrives meanwhile is dropped unacked), closes the
// handler's channel, waits for the handler to make its output durable, ack and return, waits until the
// server has applied those acks, unsubscribes and marks its record released. The next owner, already
// standing by, takes it within a standby poll, resets, and goes on from the next message; nothing is
// delivered twice (TestGroupGracefulStopHandsOverExactlyOnce: 10,000 messages, 10,000 deliveries).
// After a crash the partition waits until the standby sees the owner's subject without subscriber and
// its record stale, PinnedTTL after the dead owner's last refresh; the next owner resets and gets
// every unacked message first. An idle partition is owned like a busy one (no message is needed to
// take it), so a handler that acts on time, like the gap detector's stale check, runs for it. The dead
// owner may have made messages durable without acking them; those come again and the output must
// recognise them (handler rules).
//
// Bounds: a graceful handoff takes the handler's drain plus a standby poll and a few round trips.
// Crash failover takes about PinnedTTL plus a standby poll (default PinnedTTL 10 s). A member cut off
// from the server ends its sessions at the disconnect (handlers see ctx cancelled) and takes its
// partitions again after reconnecting, unless another member took them meanwhile.
//
// A restarted instance need not wait for its own dead incarnation: a member given a stable id
// (WithMemberID: the caller knows it is the same instance, e.g. `fpmbus up` derives it from the host
// and the absolute data directory, which only one process can hold) finds, at Join, the key the dead
// incarnation left in the members bucket, with the partitions it last owned (a member puts its key
// whenever its ownership changes, besides every PinnedTTL/4). It marks the records of those it still
// owns released, so whoever is assigned them takes them within a standby poll and gets every message
// the dead incarnation did not ack first, in stream order.
//
// # Why not orbit.go pcgroups (v0.2.2)
//
// Studied and rejected; it uses the same server features but does not meet the requirements:
//   - Static groups need the partition number as the first token of the stream's own subjects (an
//     FPM subject transform), which changes the FPM subjects users rely on; their membership is fixed
//     and any change to it stops every member.
//   - Elastic groups copy the stream into a work-queue stream (like P > 1 here), but "members" are
//     names an administrator adds to or drops from a KV config; instances of one member name are hot
//     standbys of each other. An instance stopping or crashing never moves its partitions to other
//     members unless someone edits the config, and a membership change deletes and recreates
//     consumers while messages may be in flight (the library's own comments note redelivered
//     duplicates). There is no reset on takeover, so order across owners is the server's (newer
//     first). It also logs with the global logger and hands messages one by one to a callback.
//
// Making each partition a pcgroups member name would rebuild this package on top of pcgroups' KV
// config, watchers and sleeps. Using the server primitives directly is fewer moving parts.
//
// # Costs
//
//   - P > 1 writes every message twice (the source and the partition stream) and stores it twice:
//     the partition stream has the source's retention, limits, storage and replicas, so a lagging
//     group loses nothing the source still has. A work-queue copy would hold only the backlog, but
//     the server deleting every acked message made consumption 1.5 to 4 times slower in our runs
//     (TestThroughputComparison, member_P16_workqueue). Use P = 1 when one instance (plus standbys)
//     is enough: no copy at all, and about the throughput of a plain durable consumer.
//   - The extra server work of P > 1 (sixteen filtered consumers on one stream) costs a quarter to a
//     third of one member's throughput against P = 1 (medians on a shared 2-CPU host, server in
//     process: plain consumer 81k msgs/s, P = 1 69k, P = 16 50k, work-queue P = 16 32k, P = 16 while
//     the server is still copying 25k); it pays off once instances run on separate hosts.
//   - The partition consumers' idle heartbeat (PinnedTTL/5, at least 1 s) is fixed when they are
//     declared (the server cannot change it): a later Join with another PinnedTTL keeps it.
//   - P is fixed for a group's life: Join refuses another P, filters or key tokens (ErrGroupMismatch);
//     Delete the group to change them (it then starts again from the stream's first message).
//   - One durable consumer and one owner record per partition per group. While a member is assigned
//     a partition it does not own it reads the consumer's info and the record every PinnedTTL/10 (at
//     most 500 ms); an owner rewrites its record every PinnedTTL/2; each member puts its key every
//     PinnedTTL/4. Every member of a group must use
//     the same Config (each Join updates the consumers to its own).
//
// The members bucket uses file storage (a server restart keeps it); a server restart closes every
// connection, and the members take their partitions again (TestGroupSurvivesServerRestart).
//
// # Keys and partitions
//
// A Filter names a subject filter and which of its '*' wildcards form the key (KeyTokens, 1-based;
// none = the whole subject). The partition of a message is FNV-1a 32 over the concatenated key-token
// values (no separator), modulo P: exactly the server's partition() transform, so Config.PartitionOf
// in any process agrees with the server (TestPartitionOfMatchesServerTransform) and the map never
// changes for a given config (TestPartitionOfGolden). FPMConfig keys FPM by namespace, component,
// worker_id and dp_rank (tokens 1-4 of fpm.*.*.*.*); WorkerKeyedFilter keys FPM subjects by their
// worker_id token alone, which is the FPM shards' key (shards.go). Several filters may share a key: the merger's
// fpmbench.rank.*.* and fpmbench.probe.* with KeyTokens {1} put a run's ranks and probes together.
// With P a power of two only the low log2(P) bits of each key byte matter (FNV-1a's multiply keeps
// low bits low); real worker ids and ranks spread evenly over 16 (256 keys: 14 to 18 per partition),
// but keys that differ only in characters whose low bits move together can bunch up.
//
// # Handler rules (what a consumer must do)
//
//   - Ack a message only after its output is durable; ack or Term every message; never Nak (a message
//     given back is redelivered only by the next owner's reset). With Config.CumulativeAcks an ack
//     covers every message handed before it: ack the end of the prefix made durable, never Term.
//   - A message can come again after a crash (durable, not yet acked): keep, per key and durably with
//     the output, the last StreamSequence written, and skip (ack) messages at or below it. Sequences
//     grow per key; StreamSequence is the source stream's, also when reading a partition stream.
//   - msgs closed: finish, make durable, ack, close files, return nil. ctx cancelled: stop at once,
//     return (ctx.Err() is fine); do not write more.
//   - AckWait must exceed the longest time a message waits for its ack (e.g. a flush interval): a
//     message redelivered while its handler holds it is dropped, but costs a delivery.
//   - Ownership is a lease: a member frozen (not merely slow) while holding messages, long enough for
//     the server to close its connection and PinnedTTL more, may, when it resumes, still write what it
//     held before it learns at its next record refresh that the partition moved (its ctx is then
//     cancelled). The per-key sequence check keeps such writes from
//     duplicating lines only where the output is shared; nothing in NATS can fence a frozen process.
package partition
