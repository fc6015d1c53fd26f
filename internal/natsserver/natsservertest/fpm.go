package natsservertest

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// FPMBody is the canonical JSON body of a valid FPM of key with counter_id counter, made by the
// schemas codec from a msgpack payload: a heartbeat (all counts zero) or a forward pass whose values
// vary with counter.
func FPMBody(t testing.TB, key streams.Key, counter int64, heartbeat bool) []byte {
	t.Helper()
	m := &schemas.FPM{Version: 1, WorkerID: key.WorkerID, DPRank: int64(key.DPRank), CounterID: counter}
	if !heartbeat {
		m.WallTime = 0.025 + float64(counter%7)/1000
		m.Scheduled = schemas.ScheduledRequests{NumPrefillRequests: 2, SumPrefillTokens: 256 + counter%100, VarPrefillLength: 1.5, SumPrefillKVTokens: 64, NumDecodeRequests: 3, SumDecodeKVTokens: 1024 + counter}
		m.Queued = schemas.QueuedRequests{NumPrefillRequests: 1, SumPrefillTokens: 128}
	}
	d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(m))
	if err != nil {
		t.Fatalf("test FPM: %v", err)
	}
	return d.JSON
}

// FPMMsg is the message the bridge publishes for that FPM (FPMBody), received at receivedMs
// (Fpm-Received-At-Ms; 0: header missing) from producer (Fpm-Producer; "": header missing).
func FPMMsg(t testing.TB, key streams.Key, counter, receivedMs int64, producer string, heartbeat bool) *nats.Msg {
	m := nats.NewMsg(streams.FPMSubject(key))
	m.Data = FPMBody(t, key, counter, heartbeat)
	m.Header.Set(streams.HeaderMsgID, streams.MsgID(key, 1, uint64(counter)))
	m.Header.Set(streams.HeaderSeq, strconv.FormatInt(counter, 10))
	m.Header.Set(streams.HeaderNamespace, key.Namespace)
	m.Header.Set(streams.HeaderComponent, key.Component)
	m.Header.Set(streams.HeaderWorkerID, key.WorkerID)
	m.Header.Set(streams.HeaderDPRank, strconv.Itoa(key.DPRank))
	if receivedMs != 0 {
		m.Header.Set(streams.HeaderReceivedAt, strconv.FormatInt(receivedMs, 10))
	}
	if producer != "" {
		m.Header.Set(streams.HeaderProducer, producer)
	}
	return m
}
