package streams

// Header names carried on every message the bridge publishes. They are named here once; every other
// package refers to these constants.
const (
	// HeaderMsgID is JetStream's deduplication header. The bridge sets it to MsgID(...).
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

	// Dead letters: the body is the raw frames concatenated; these headers say why and how to split them.
	HeaderError      = "Fpm-Error"
	HeaderErrorStage = "Fpm-Error-Stage" // frames | decode | validate | size
	HeaderFrameSizes = "Fpm-Frame-Sizes" // comma-separated byte lengths of the frames in the body
	// HeaderOriginalSize is set when the body was truncated to fit the server's max_payload.
	HeaderOriginalSize = "Fpm-Original-Size"

	// HeaderEventType names the kind of JSON event on FPM_EVENTS (drop_marker, gap, ...).
	HeaderEventType = "Fpm-Event"
)
