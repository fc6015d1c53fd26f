package streams

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// FPMMessage is one FPM as it is stored on stream FPM: what the bridge publishes for a message it
// received from a worker's PUB socket, and what `fpmbus trace replay --to stream` publishes for a
// recorded one. Msg builds the nats.Msg: subject FPMSubject(Key), the canonical JSON body, and the
// Fpm-* headers every consumer reads (headers.go), so both publishers set the same headers the same
// way.
type FPMMessage struct {
	// Key is the publisher: namespace, component, and the payload's worker_id and dp_rank.
	Key Key
	// Body is the canonical JSON of the FPM (schemas.FPM.JSON).
	Body []byte
	// Seq is the ZMQ sequence frame (HeaderSeq).
	Seq uint64
	// CounterID is the payload's counter_id; a value other than Seq is flagged (HeaderSeqMismatch).
	CounterID int64
	// EpochMs identifies the publisher run (HeaderEpoch; part of the message id with Seq).
	EpochMs int64
	// ReceivedAtMs is the receive time (HeaderReceivedAt): a trace line's observed_at_unix_ms.
	ReceivedAtMs int64
	// Producer files the message (HeaderProducer); "" means Key.WorkerID.
	Producer string
	// Endpoint is where the bytes came from (HeaderEndpoint); Bridge names the publisher (HeaderBridge).
	Endpoint, Bridge string
	// Topic is a non-empty ZMQ topic frame (HeaderTopic), normally "".
	Topic string
}

// Msg returns the message to publish.
func (m *FPMMessage) Msg() *nats.Msg {
	producer := m.Producer
	if producer == "" {
		producer = m.Key.WorkerID
	}
	seq := strconv.FormatUint(m.Seq, 10)
	h := make(nats.Header, 13)
	h[HeaderMsgID] = one(MsgID(m.Key, m.EpochMs, m.Seq))
	h[HeaderSeq] = one(seq)
	h[HeaderReceivedAt] = one(strconv.FormatInt(m.ReceivedAtMs, 10))
	h[HeaderNamespace] = one(m.Key.Namespace)
	h[HeaderComponent] = one(m.Key.Component)
	h[HeaderProducer] = one(producer)
	h[HeaderWorkerID] = one(m.Key.WorkerID)
	h[HeaderDPRank] = one(strconv.Itoa(m.Key.DPRank))
	h[HeaderEpoch] = one(strconv.FormatInt(m.EpochMs, 10))
	h[HeaderEndpoint] = one(m.Endpoint)
	h[HeaderBridge] = one(m.Bridge)
	if m.CounterID < 0 || uint64(m.CounterID) != m.Seq {
		h[HeaderSeqMismatch] = one(strconv.FormatInt(m.CounterID, 10))
	}
	if m.Topic != "" {
		h[HeaderTopic] = one(m.Topic)
	}
	return &nats.Msg{Subject: FPMSubject(m.Key), Header: h, Data: m.Body}
}

// one is a header value list of one value. Header names are set as written (already canonical), not
// through Header.Set.
func one(v string) []string { return []string{v} }
