// Package bridge moves Dynamo's per-forward-pass metrics (FPM) from ZeroMQ onto NATS JetStream.
//
// One FPM travels through these files, in this order:
//
//	socket.go     one goroutine per ZMQ endpoint owns its SUB socket and reads 3-frame multiparts;
//	monitor.go    it also watches the socket's monitor events, reconnecting a session libzmq gave up on
//	              (a frame over MaxPayload, refused unread) and dead-lettering the refusal
//	frames.go     parseFrames splits (topic, 8-byte big-endian sequence, msgpack payload);
//	              schemas.DecodeFPM turns the payload into a validated FPM with its canonical JSON
//	epoch.go      the (key, sequence) pair gets its publisher run: a sequence going back starts one
//	runs.go       the publisher goroutine agrees each run's epoch with the other bridges (KV
//	              FPM_BRIDGE_RUNS, compare-and-set) and stamps it before the run's first publication
//	message.go    the nats.Msg: subject fpm.<ns>.<comp>.<worker>.<rank>, JSON body, Fpm-* headers;
//	              bad input becomes a dead letter on FPM_EVENTS instead (streams.DeadLetter), a closed
//	              drop range a drop marker (streams.DropMarker); subjects, headers and ids are streams'
//	buffer.go     a bounded FIFO shared by all sockets; when full, new messages are dropped and the
//	              dropped sequence ranges become drop markers (which are never dropped)
//	publish.go    one goroutine publishes in order with a bounded async window, and on failure waits
//	              for the broker and republishes the unacknowledged messages with the same ids
//	batch.go      group commit: a queue of FPMs goes to its stream as one atomic batch (one fsync,
//	              one ack after it); a short queue one by one
//	markerspool.go the drop markers still unstored when the bridge stops go to the marker spool
//	              (Config.MarkerSpool), which the next run publishes first
//	acked.go      each ack also goes into the ledger: per publisher key, the FPM and stream sequences
//	              JetStream acknowledged (the ack records)
//	checkpoint.go the ledger's changed records are written to KV FPM_BRIDGE_ACKS every second
//	lostcheck.go  at start and after every reconnect, before anything is published, the records are
//	              compared with the FPM stream; acknowledged FPMs it no longer holds become a
//	              lost_after_ack gap event (streams.LostAfterAck) on the publisher's gap subject
//	bridge.go     New, Run, Ready, Stats: the component contract shared by fpmbus
//	config.go     Config, its defaults and Validate; endpointsFor
//	limits.go     what a message must fit before it is published (server max_control_line and
//	              max_payload, ZMQ_MAXMSGSIZE); what does not fit is dead-lettered, never published
//	metrics.go    Prometheus collectors per rank; stats.go the stats snapshot
//	portcheck.go  warns when Dynamo's FPM ports overlap the host's ephemeral port range
//
// # Invariants
//
//   - The ZMQ read loop never waits on the broker: it parses, decodes, stamps the receive time and
//     does a non-blocking enqueue. A publisher is never slowed down by NATS.
//   - Every multipart received is accounted for exactly once, per rank: published to FPM, dead-lettered
//     to FPM_EVENTS (invalid input, or an FPM that cannot be published: see limits.go), or dropped
//     with a drop marker (buffer full, shutdown). A frame libzmq refused for its size counts as one
//     received, invalid multipart.
//     Stats().Ranks[r] satisfies, once the bridge has stopped,
//     Received == Published + Dropped + Invalid, and Invalid == DeadLettered + DeadLettersLost.
//   - Memory is bounded: at most MaxBuffer messages (and MaxBufferBytes bytes) wait in the buffer, at
//     most MaxInFlight are in flight; drop markers are small and only created by drops. libzmq holds
//     at most MaxBuffer messages per socket (ZMQ_RCVHWM) and never reads a frame over MaxPayload
//     (ZMQ_MAXMSGSIZE). The README's bridge section gives the bound as a formula of the flags.
//   - No message can close the NATS connection or stop the publisher: what does not fit the server's
//     limits is dead-lettered before it is published, and a message that fails on its own is given
//     up after maxRejects attempts. An answer in which the stream did not decide (its id being stored
//     by another publish, a replica that is not the leader) is retried like an outage: never a reason
//     to give an FPM up.
//   - A message keeps its Nats-Msg-Id across the bridge's retries, so JetStream deduplicates them.
//   - Two publisher runs are stored as two runs, and redundant bridges store each FPM once. An FPM's
//     Nats-Msg-Id (streams.FPMMsgID) is key + sequence + digest of the payload bytes + the run's
//     agreed epoch: the same whichever bridge publishes it, different for any two different FPMs.
//     No two different FPMs share an id: two FPMs of one key at one sequence belong to two publisher
//     runs, whose epochs differ (strictly increasing per publisher in FPM_BRIDGE_RUNS), even when their
//     bytes agree (a recording replayed twice, a deterministic publisher restarted, idle heartbeats).
//     No FPM gets two ids: every subscriber receives the same bytes, so the digest is the same, and the
//     epoch is agreed before the run's first publication (runs.go: a bridge adopts the epoch of a run
//     another bridge recorded or stored when a message it received in its own run shows the run is
//     that one, and records a new run otherwise). Where the agreement cannot hold (the bucket
//     unreachable, a live bridge lagging more than liveProbe: runs.go states the limits) each bridge
//     stores its own copy of that run, never fewer.
//   - A publisher restart is never filed under the old run: the sequence going back shows it, and a
//     reconnect (the only thing a PUB subscriber sees of a restart whose new run is already past the
//     old run's last number) starts a new run too (epoch.go, socket.go), marked Fpm-Run-Start so the
//     gap detector names the new run's first numbers.
//   - Fpm-Epoch is the agreed epoch too, so the stream two bridges filled reads, for the gap
//     detector, like one bridge's.
//   - An acknowledged FPM the stream loses is noticed, not silently counted as stored. JetStream acks
//     once a message is written, not once it is on disk (natsserver.SyncPolicy), and a damaged block
//     file is cut when the server starts. The bridge remembers per publisher key what it saw
//     acknowledged (ack records, written every second to KV FPM_BRIDGE_ACKS: per run the first and
//     last sequence and stream sequence acked, the count, and the sequence ranges never acked inside).
//     When it starts (every record in the bucket) and after each reconnect (its own keys), before it
//     publishes anything that would hide a loss, it reads the key's newest FPM from the stream's
//     leader; acknowledged FPMs after it are reported as one lost_after_ack event per run (exact
//     ranges and count), logged and counted (fpmbus_bridge_lost_after_ack_total), and the record is
//     cut back so the loss is reported once. What it cannot see: a loss in the middle of a run (newer
//     FPMs of the key still stored), acks after the record's last write before the bridge itself
//     crashed, and everything when the records are lost with the stream (they live on the same
//     server and share its sync policy; see the README's durability matrix).
//
// # Ownership and locks
//
// Run owns every goroutine it starts (one reader per endpoint, one publisher) and stops each with
// close(quit); <-done. Each ZMQ socket is created, used and closed by its reader goroutine only (ZMQ
// sockets are not thread-safe); a reader parks in Go's network poller on the socket's ZMQ_FD while idle
// and receives without blocking, so no OS thread sits in a blocking cgo call (it falls back to blocking
// receives with a 100 ms timeout where the fd cannot be polled). The nats.Conn belongs to the caller:
// the bridge never closes or drains it; the JetStream context New creates subscribes on it for acks
// until it is closed.
//
// A run is created by a reader goroutine, which then only reads its immutable fields; its agreed epoch
// is resolved and cached by the publisher goroutine (which may wait on the broker; the readers never do).
//
// The ledger belongs to the publisher goroutine (and to Run once it has exited); the checkpointer's
// goroutine only gets copies of records, and Run stops it after the publisher, writing the last ones.
// The check at start runs on Run's goroutine before the publisher starts; the check after a reconnect
// runs on the publisher goroutine, which publishes nothing meanwhile.
//
// Lock order: buffer.mu, epochs.mu and publisher.evMu are never held together. nats.go calls the ack
// handlers (which take evMu) with its own publisher lock held; the bridge never calls into nats.go
// while holding evMu.
package bridge
