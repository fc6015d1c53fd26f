// Package streams is fpmbus's wire contract and nothing else, declared as code, one type per thing:
// the subject scheme, every header name, every message id, the messages that more than one stage
// reads or writes, and the JetStream resources they live in (streams, buckets, their names and
// settings). A pipeline stage (the bridge, each consumer) never imports another stage: what one
// publishes and another reads is defined here, once.
//
//	subjects.go    Key, token encoding, FPM / drop / gap / dead-letter subjects and their parsers
//	names.go       ValidName: the bytes a name may hold to be a subject token as it is
//	headers.go     every header name (Nats-Msg-Id, Fpm-*, Fpm-Bench-*)
//	msgid.go       every Nats-Msg-Id format (FPMs, drop markers, dead letters, gap events, bench)
//	fpm_message.go FPMMessage: one FPM's message, subject, headers and body
//	dropmarker.go  DropMarker: the bridge's drop marker, its message and ParseDropMarker (fuzzed)
//	gapevent.go    GapEventFields and GapPoint: what every gap event carries, the gap detector's or the
//	               bridge's (lostafterack.go: LostAfterAck, the acknowledged FPMs the stream lost)
//	deadletter.go  DeadLetter: input a stage can never process, from a bridge socket or a consumer
//	consumerloss.go ConsumerLoss: messages a stream removed before a durable consumer read them
//	bridgekv.go, runrecord.go   the bridge's KV buckets: acknowledged FPMs, publisher runs agreed on
//	datasets.go, datasetevent.go   KV FPM_DATASETS (sealed cells, protected) and its events
//	bench.go       benchmark subjects, kinds and rank digests; benchlimits.go: run ids, artefact sizes
//	shards.go, fpm_range.go   FPM shard streams and ingest subjects; a range of FPMs over them and
//	               its time bounds (ParseTimeBound)
//	config.go, ensure.go, diff.go, apply.go, placement.go, buckets.go   the streams (FPM, FPM_EVENTS,
//	               FPM_BENCH) and buckets: their settings, Ensure, Diff, Plan and Apply (PrintAndApply:
//	               `fpmbus streams apply`)
//	flags.go       the stream settings' flags next to Config (Config.RegisterFlags)
//
// What is not here: connecting to a server (internal/natsconn), the embedded server and its store
// watch (internal/natsserver), moving bench artefact bodies (internal/benchstore) and the edge
// topology (internal/edgenode). They import this package; it imports none of them.
//
// Every component calls Ensure at start, so streams exist before anything publishes or consumes:
// Ensure creates a missing stream from the component's flags and uses an existing one as it is
// (warning about each setting that differs). Stream settings belong to the operator: only Plan
// (`fpmbus streams apply`) changes an existing stream, and it refuses a change that can delete stored
// messages unless forced. That rule is why Ensure and Plan stay beside the settings they apply
// although they call a server: a stage that created streams its own way would break the contract.
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
