// Package streams is fpmbus's wire contract, declared as code, one type per thing: the subject scheme,
// every header name, every message id, the messages that more than one stage reads or writes, and the
// JetStream resources they live in. A pipeline stage (the bridge, each consumer) never imports another
// stage: what one publishes and another reads is defined here, once.
//
//	subjects.go    Key, token encoding, FPM / drop / gap / dead-letter subjects and their parsers
//	headers.go     every header name (Nats-Msg-Id, Fpm-*, Fpm-Bench-*)
//	msgid.go       every Nats-Msg-Id format (FPMs, drop markers, dead letters, gap events, bench)
//	dropmarker.go  DropMarker: the bridge's drop marker, its message and ParseDropMarker (fuzzed)
//	gapevent.go    GapEventFields and GapPoint: what every gap event carries, the gap detector's or the
//	               bridge's (lostafterack.go: LostAfterAck, the acknowledged FPMs the stream lost)
//	deadletter.go  DeadLetter: input a stage can never process, from a bridge socket or a consumer
//	consumerloss.go ConsumerLoss: messages a stream removed before a durable consumer read them
//	bench.go       benchmark subjects, kinds, PublishProfile and PublishBench (`fpmbus bench publish`)
//	objectstore.go BenchStore: artefact bodies inline on FPM_BENCH or in FPM_BENCH_OBJECTS, verified
//	config.go, apply.go   the streams (FPM, FPM_EVENTS, FPM_BENCH), Ensure, Apply and Plan
//	connect.go     ConnConfig and Connect: the first connection within a timeout, its failure named
//	               (ErrAuth, ErrTLS, ErrUnreachable), connection events logged, OnClosed
//	redact.go      RedactURL: the only way a server URL reaches a log line or an error
//	natscontext.go LoadNATSContext: the nats CLI's context files
//	server.go, inprocess.go   the embedded server of `fpmbus up` (a nats-server configuration file, a
//	               token, TLS; Authenticates, ListensOnLoopback) and its in-process connections
//
// Every component calls Ensure at start, so streams exist before anything publishes or consumes:
// Ensure creates a missing stream from the component's flags and uses an existing one as it is
// (warning about each setting that differs). Stream settings belong to the operator: only Plan
// (`fpmbus streams apply`) changes an existing stream, and it refuses a change that can delete stored
// messages unless forced.
//
// Subjects (every <token> is percent-encoded with EncodeToken):
//
//	fpm.<namespace>.<component>.<worker_id>.<dp_rank>                  stream FPM: one FPM, canonical JSON
//	fpmevents.deadletter.<namespace>.<component>.<dp_rank>              stream FPM_EVENTS: a bridge's undecodable/invalid input
//	fpmevents.deadletter.consumer.<consumer>                            stream FPM_EVENTS: a message a consumer can never process
//	fpmevents.drop.<namespace>.<component>.<worker_id>.<dp_rank>        stream FPM_EVENTS: bridge drop markers
//	fpmevents.gap.<namespace>.<component>.<worker_id>.<dp_rank>         stream FPM_EVENTS: gap events
//	fpmevents.loss.<consumer>                                           stream FPM_EVENTS: messages removed before the consumer read them
//	fpmevents.bench.<run>.outcome|conflict                              stream FPM_EVENTS: benchmark merger events
//	fpmbench.rank|probe|profile|merged|sidecar.<run>[.<rank>]           stream FPM_BENCH: benchmark artefacts
//
// The FPM and event roots differ ("fpm" vs "fpmevents") so that `nats sub 'fpm.>'` shows FPMs only.
//
// Message ids are derived from what a message says, never from when it is sent, so a retry or a
// re-publication after a crash is stored once within the duplicate window; the only exception is a
// bridge's dead letter, which has no identity of its own (its id counts them).
package streams
