package replay

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// bridgeHeaders are the headers the bridge sets on every FPM (bridge/message.go fpmItem), the flagged
// and topic ones aside.
var bridgeHeaders = []string{streams.HeaderMsgID, streams.HeaderSeq, streams.HeaderReceivedAt, streams.HeaderNamespace,
	streams.HeaderComponent, streams.HeaderProducer, streams.HeaderWorkerID, streams.HeaderDPRank, streams.HeaderEpoch,
	streams.HeaderEndpoint, streams.HeaderBridge}

// The stream target stores what a bridge would have stored for the replayed sockets, under the replay's
// namespace: the recorded fpm as the body, the bridge's headers, sequences from 0 per rank, receive
// times from the replay's clock, a mismatch between counter_id and sequence flagged as the bridge flags it.
func TestStreamTargetStoresWhatABridgeWould(t *testing.T) {
	env := natsservertest.Start(t)
	var ls []line
	for i := range 10 {
		for rank := range 2 {
			ls = append(ls, line{producer: "w", observed: t0 + int64(i*3), fpm: fpmJSON(t, "w", rank, int64(100+i))})
		}
	}
	plan, err := NewPlan(recordingOf(t, ls...), PlanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(plan, Config{Target: TargetStream, Stream: streamConfig{Conn: env.NC, BridgeID: "replay-test"}})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixMilli()
	rep := runReplay(t, r)
	after := time.Now().UnixMilli()
	if rep.Overall.Replayed != 20 || rep.Overall.Failed != 0 {
		t.Fatalf("report %+v", rep.Overall)
	}
	msgs := natsservertest.Messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != 20 {
		t.Fatalf("stored %d, want 20", len(msgs))
	}
	next := map[int]int{}
	for _, m := range msgs {
		k, err := streams.ParseFPMSubject(m.Subject())
		if err != nil || k.Namespace != defaultNamespace || k.Component != "backend" || k.WorkerID != "w" {
			t.Fatalf("subject %s (%v)", m.Subject(), err)
		}
		i := next[k.DPRank]
		next[k.DPRank]++
		if want := fpmJSON(t, "w", k.DPRank, int64(100+i)); !bytes.Equal(m.Data(), want) {
			t.Fatalf("%s #%d body\n%s\nwant\n%s", m.Subject(), i, m.Data(), want)
		}
		h := m.Headers()
		for _, name := range bridgeHeaders {
			if h.Get(name) == "" {
				t.Fatalf("%s: header %s missing: %v", m.Subject(), name, h)
			}
		}
		epoch, _ := strconv.ParseInt(h.Get(streams.HeaderEpoch), 10, 64)
		recv, _ := strconv.ParseInt(h.Get(streams.HeaderReceivedAt), 10, 64)
		if h.Get(streams.HeaderSeq) != strconv.Itoa(i) || h.Get(streams.HeaderMsgID) != streams.MsgID(k, epoch, uint64(i)) ||
			h.Get(streams.HeaderSeqMismatch) != strconv.Itoa(100+i) || h.Get(streams.HeaderProducer) != "w" ||
			h.Get(streams.HeaderBridge) != "replay-test" || recv < before || recv > after || epoch > recv {
			t.Fatalf("%s #%d headers %v", m.Subject(), i, h)
		}
	}
}

// publishFPMs stores n FPMs per rank on stream FPM as the bridge does, receive times 2 ms apart from
// recv0; one body in the middle is not an FPM.
func publishFPMs(t *testing.T, env *natsservertest.Env, n int, recv0 int64) {
	t.Helper()
	for i := range n {
		for rank := range 2 {
			m := streams.FPMMessage{Key: streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "src", DPRank: rank},
				Body: fpmJSON(t, "src", rank, int64(i)), Seq: uint64(i), CounterID: int64(i), EpochMs: recv0,
				ReceivedAtMs: recv0 + int64(2*i), Producer: "prod", Endpoint: "tcp://x", Bridge: "b"}
			msg := m.Msg()
			if i == n/2 && rank == 1 {
				msg.Data = []byte(`{"version":2}`)
			}
			if _, err := env.JS.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A range of stream FPM is read as a full trace of it would read: observed times from the bridge's
// receive time, producers from Fpm-Producer, the stream's order; a body that is no FPM is counted.
func TestReadStreamRange(t *testing.T) {
	env := natsservertest.Start(t)
	publishFPMs(t, env, 20, t0)
	cases := map[string]struct {
		rng   StreamRange
		n     int
		first int64 // counter of the first record
	}{
		"the whole stream":      {StreamRange{}, 39, 0},
		"by sequence":           {StreamRange{StartSeq: 11, EndSeq: 30}, 19, 5},
		"one rank, by sequence": {StreamRange{StartSeq: 11, Filter: "fpm.dynamo.backend.src.0"}, 15, 5},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			rec, err := readStream(t.Context(), env.JS, c.rng)
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Records) != c.n || rec.Records[0].CounterID != c.first {
				t.Fatalf("%d records (invalid %d %q), first %+v", len(rec.Records), rec.Invalid, rec.InvalidExamples, rec.Records[0])
			}
			for i, r := range rec.Records {
				if r.Producer != "prod" || r.Namespace != "dynamo" || r.CaptureMode != schemas.CaptureFull || r.ObservedMs != t0+2*r.CounterID {
					t.Fatalf("record %+v", r)
				}
				if i > 0 && (r.ObservedMs < rec.Records[i-1].ObservedMs || r.Order <= rec.Records[i-1].Order) {
					t.Fatal("records out of order")
				}
			}
		})
	}
	rec, err := readStream(t.Context(), env.JS, StreamRange{})
	if err != nil || rec.Invalid != 1 {
		t.Fatalf("%v; invalid %d", err, rec.Invalid)
	}
	if _, err := readStream(t.Context(), env.JS, StreamRange{StartSeq: 5, Since: time.Now()}); !errors.Is(err, ErrBadRange) {
		t.Fatalf("both ways: %v", err)
	}
	empty, err := readStream(t.Context(), env.JS, StreamRange{Filter: "fpm.nothing.>"})
	if err != nil || len(empty.Records) != 0 {
		t.Fatalf("empty range: %v, %d", err, len(empty.Records))
	}
}
