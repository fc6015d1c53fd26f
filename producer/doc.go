// Package producer is fpmbus's synthetic Dynamo FPM publisher: a stand-in for the ZeroMQ side of a vLLM
// worker, used by `fpmbus publish`, by `fpmbus up --demo` and by tests and benchmarks.
//
// It mirrors Dynamo's _FpmPublisherThread (components/src/dynamo/vllm/instrumented_scheduler.py) rank for
// rank, and no difference on the wire is intended:
//
//   - one ZMQ PUB socket per data-parallel rank, bound on tcp://<host>:<base port + dp_rank> (Dynamo binds
//     tcp://*; this package binds 127.0.0.1 unless told otherwise);
//   - a bounded queue (10,000 by default) between the engine and the sender; a full queue drops the FPM
//     silently (counted in Stats);
//   - every message is the three-frame multipart (b"", seq.to_bytes(8, "big"), payload), sent with
//     NOBLOCK; EAGAIN drops the message (counted);
//   - the payload is the msgspec msgpack encoding of ForwardPassMetrics (schemas.AppendMsgpack), with
//     counter_id stamped with the sequence number just before encoding;
//   - the sequence is shared by FPMs and heartbeats and starts at 0 per rank (per publisher thread); a
//     dropped send still consumes its sequence number, so receivers see the gap;
//   - after HeartbeatInterval (1 s) without a successful publish the sender emits a heartbeat: an all-zero
//     FPM with only version, worker_id, dp_rank and counter_id set (wall_time 0);
//   - empty batches are never published.
//
// Differences that are not on the wire: the "engine" is a seeded scheduler simulation (Engine) instead of
// vLLM; the publisher flushes its queue and closes its sockets with a bounded LINGER (Config.Linger, 1 s by
// default) rather than Dynamo's linger 0, so a Count-limited run delivers its tail to a connected
// subscriber (a negative Linger restores linger 0); and SNDHWM, the queue size, the heartbeat interval and
// XPUB_NODROP can be changed for tests.
//
// Slow joiner: a PUB socket drops every message published before a SUB socket has connected and its
// subscription has arrived; libzmq offers no way to wait for that. Connect the bridge (or the test's SUB
// socket) first, and give the publisher a Config.StartDelay (a few hundred milliseconds on loopback) so the
// subscription lands before sequence 0 is sent. End-to-end tests that expect contiguous sequences from 0
// must do both.
//
// Ownership: every rank has one generator goroutine (owns the Engine) and one sender goroutine (owns the
// Sender and its socket), started by Publisher.Run and stopped by it before it returns (close(quit); <-done).
// Sockets are bound in New and handed to their sender goroutine when Run starts it; they are used by no
// other goroutine.
package producer
