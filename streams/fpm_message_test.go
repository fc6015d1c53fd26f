package streams

import "testing"

// An FPM message carries the subject of its key, the body as given, and every Fpm-* header; the
// counter/sequence mismatch and a topic are set only when there is one; the producer defaults to the
// worker_id.
func TestFPMMessageHeaders(t *testing.T) {
	k := Key{Namespace: "ns", Component: "comp", WorkerID: "w.1", DPRank: 3}
	base := FPMMessage{Key: k, Body: []byte(`{"a":1}`), Seq: 7, CounterID: 7, EpochMs: 1000, ReceivedAtMs: 1500, Endpoint: "tcp://h:1", Bridge: "b"}
	cases := map[string]struct {
		edit func(*FPMMessage)
		want map[string]string
	}{
		"counter equals the sequence": {func(*FPMMessage) {}, map[string]string{HeaderProducer: "w.1", HeaderSeqMismatch: "", HeaderTopic: ""}},
		"counter differs":             {func(m *FPMMessage) { m.CounterID = 99 }, map[string]string{HeaderSeqMismatch: "99"}},
		"a producer and a topic":      {func(m *FPMMessage) { m.Producer, m.Topic = "p", "t" }, map[string]string{HeaderProducer: "p", HeaderTopic: "t"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := base
			c.edit(&m)
			msg := m.Msg()
			if msg.Subject != "fpm.ns.comp.w%2E1.3" || string(msg.Data) != `{"a":1}` {
				t.Fatalf("subject %q, body %q", msg.Subject, msg.Data)
			}
			want := map[string]string{HeaderMsgID: MsgID(k, 1000, 7), HeaderSeq: "7", HeaderReceivedAt: "1500", HeaderNamespace: "ns",
				HeaderComponent: "comp", HeaderWorkerID: "w.1", HeaderDPRank: "3", HeaderEpoch: "1000", HeaderEndpoint: "tcp://h:1", HeaderBridge: "b"}
			for h, v := range c.want {
				want[h] = v
			}
			for h, v := range want {
				if got := msg.Header.Get(h); got != v {
					t.Errorf("header %s = %q, want %q", h, got, v)
				}
			}
			if _, ok := msg.Header[HeaderSeqMismatch]; ok != (want[HeaderSeqMismatch] != "") {
				t.Errorf("%s present: %v", HeaderSeqMismatch, ok)
			}
		})
	}
}
