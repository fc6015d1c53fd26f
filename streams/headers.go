package streams

// Header names of every message fpmbus publishes. They are named here once; every other package refers
// to these constants.

// Headers of an FPM (stream FPM), set by the bridge.
const (
	// HeaderMsgID is JetStream's deduplication header. Its value for each kind of message is built by
	// the functions of msgid.go.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderSeq is the ZMQ sequence frame as a decimal integer.
	HeaderSeq = "Fpm-Seq"
	// HeaderReceivedAt is the bridge's receive time in Unix milliseconds; it becomes a trace line's
	// observed_at_unix_ms, so a replay reproduces it.
	HeaderReceivedAt = "Fpm-Received-At-Ms"
	HeaderNamespace  = "Fpm-Namespace"
	HeaderComponent  = "Fpm-Component"
	// HeaderProducer is the producer id a trace writer files this message under (default: worker_id).
	HeaderProducer = "Fpm-Producer"
	HeaderWorkerID = "Fpm-Worker-Id"
	HeaderDPRank   = "Fpm-Dp-Rank"
	// HeaderEpoch identifies one run of a publisher as the bridge saw it: the bridge's receive time
	// (Unix ms) of the first message after the publisher (or the bridge) started. With HeaderSeq it makes
	// message ids unique across publisher restarts.
	HeaderEpoch = "Fpm-Epoch"
	// HeaderSeqMismatch is present when the payload's counter_id differs from the sequence frame; its
	// value is the payload's counter_id. Such messages are stored, flagged and counted, never dropped.
	HeaderSeqMismatch = "Fpm-Seq-Mismatch"
	// HeaderEndpoint is the ZMQ endpoint the bytes came from.
	HeaderEndpoint = "Fpm-Endpoint"
	// HeaderBridge names the bridge instance that published the message.
	HeaderBridge = "Fpm-Bridge"
	// HeaderTopic carries a non-empty ZMQ topic frame (Dynamo sends an empty one, so it is normally
	// absent).
	HeaderTopic = "Fpm-Topic"
	// HeaderRunStart says how the publisher run (HeaderEpoch) began, as the bridges agreed: RunStartRestart
	// (the sequence went back) or RunStartReconnect (the bridge's connection to the publisher ended and
	// a new one began with the sequence further on: the publisher may have restarted meanwhile). Absent
	// for a bridge's first run of a publisher, which it takes for the run before going on. On every FPM
	// of such a run, so the gap detector finds it on whichever copy it reads first.
	HeaderRunStart = "Fpm-Run-Start"
)

// Headers of events on FPM_EVENTS (drop markers, gap events, benchmark outcomes).
const (
	// HeaderEventType names the kind of JSON event on FPM_EVENTS (drop_marker, gap, bench_merged, ...).
	HeaderEventType = "Fpm-Event"
	// HeaderGapEventSeq carries a gap detector event's per-publisher number (its event_seq).
	HeaderGapEventSeq = "Fpm-Gap-Event-Seq"
)

// Headers of a dead letter (deadletter.go). The body is the input as received; these headers say why
// it was refused, how to split the body, and where the input came from.
const (
	// HeaderError is the precise reason, on one line.
	HeaderError = "Fpm-Error"
	// HeaderErrorStage is the step that refused the input: StageFrames, StageDecode, StageValidate or
	// StageSize for the bridge; a consumer names its own step.
	HeaderErrorStage = "Fpm-Error-Stage"
	// HeaderFrameSizes lists the byte lengths of the frames concatenated in the body, comma-separated.
	HeaderFrameSizes = "Fpm-Frame-Sizes"
	// HeaderOriginalSize is set when the body was cut to fit the server's max_payload: the whole size.
	HeaderOriginalSize = "Fpm-Original-Size"
	// HeaderConsumer names the consumer (its durable) that dead-lettered a stored message.
	HeaderConsumer = "Fpm-Consumer"
	// HeaderStream and HeaderStreamSeq locate the dead-lettered message: its stream and sequence there.
	HeaderStream    = "Fpm-Stream"
	HeaderStreamSeq = "Fpm-Stream-Seq"
	// HeaderSubject is the subject the dead-lettered message was stored under.
	HeaderSubject = "Fpm-Subject"
	// HeaderDelivered is how often the server delivered a message a consumer dead-lettered.
	HeaderDelivered = "Fpm-Delivered"
	// HeaderErrorSize (StageSize, or a publish the server refused for its size) is the size in bytes
	// of what was too large (a subject's protocol line, a message's headers plus body); absent when
	// libzmq refused a frame, whose size it does not report.
	HeaderErrorSize = "Fpm-Error-Size"
	// HeaderErrorLimit is the limit in bytes that was exceeded.
	HeaderErrorLimit = "Fpm-Error-Limit"
)

// Headers of benchmark messages (stream FPM_BENCH, bench.go). Every artefact message carries Kind, Run,
// SHA256 and Size; a body kept in the object store is named by Object and the message body is empty.
const (
	HeaderBenchKind   = "Fpm-Bench-Kind"    // rank | probe | merged | sidecar (BenchKind*)
	HeaderBenchRun    = "Fpm-Bench-Run"     // the run_id, unencoded (also on profiles and bench events)
	HeaderBenchRank   = "Fpm-Bench-Rank"    // rank messages: the DP rank
	HeaderBenchDPSize = "Fpm-Bench-Dp-Size" // rank messages: the artefact's dp.size
	HeaderBenchFile   = "Fpm-Bench-File"    // the producer's path of the artefact (recorded in rank_files)
	HeaderBenchSHA256 = "Fpm-Bench-Sha256"  // hex sha256 of the body
	HeaderBenchSize   = "Fpm-Bench-Size"    // body size in bytes
	HeaderBenchObject = "Fpm-Bench-Object"  // object name in BenchObjectBucket when the body is not inline
	// HeaderBenchRankDigests (merged messages) lists the merged ranks' digests: "0=<sha256>,1=<sha256>,...".
	HeaderBenchRankDigests = "Fpm-Bench-Rank-Digests"
	// HeaderBenchProbeContext (merged messages) is the merger's probe context as compact JSON; absent
	// without an engine block (then there is no sidecar).
	HeaderBenchProbeContext = "Fpm-Bench-Probe-Context"
)
