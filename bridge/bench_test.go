package bridge

import (
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// benchN is the number of FPMs per benchmark iteration (FPMBUS_BENCH_N overrides it).
func benchN(def int) int {
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_N")); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkBridgeVsRawPublish measures, in one process on the same embedded JetStream server (file
// storage, the default stream config):
//
//	raw-msgs/s     JetStream async publishes of the bridge's canonical bodies with the same headers,
//	               prebuilt, MaxInFlight 4096, timed until every ack is in (the ceiling for the bridge);
//	bridge-msgs/s  the bridge end to end: ZMQ PUB send of the msgpack payloads -> receive, parse, decode,
//	               build, buffer, publish -> ack, timed until Stats().Published reaches N;
//	ratio          bridge-msgs/s / raw-msgs/s.
//
// Run with: go test ./bridge -run '^$' -bench BridgeVsRawPublish -benchtime 3x
// (FPMBUS_BENCH_ONLY=raw or =bridge runs one side, for profiling; FPMBUS_BENCH_N sets N.)
func BenchmarkBridgeVsRawPublish(b *testing.B) {
	n := benchN(50000)
	env := natsservertest.Start(b)
	pls := make([][]byte, n)
	for i := range pls {
		pls[i] = payload("bench", 0, uint64(i))
	}
	js, err := jetstream.New(env.NC, jetstream.WithPublishAsyncMaxPending(defaultMaxInFlight))
	if err != nil {
		b.Fatal(err)
	}
	var rawDur, bridgeDur, rawCPU, bridgeCPU time.Duration
	iter := 0
	for b.Loop() {
		iter++
		if os.Getenv("FPMBUS_BENCH_ONLY") != "bridge" {
			d, c := benchRaw(b, js, pls, "raw-"+strconv.Itoa(iter))
			rawDur, rawCPU = rawDur+d, rawCPU+c
		}
		if os.Getenv("FPMBUS_BENCH_ONLY") != "raw" {
			d, c := benchBridge(b, env, pls, iter)
			bridgeDur, bridgeCPU = bridgeDur+d, bridgeCPU+c
		}
	}
	total := float64(n * iter)
	raw := total / rawDur.Seconds()
	br := total / bridgeDur.Seconds()
	b.ReportMetric(raw, "raw-msgs/s")
	b.ReportMetric(br, "bridge-msgs/s")
	b.ReportMetric(br/raw, "ratio")
	// CPU of the whole process (server, clients, libzmq threads) per message, in microseconds.
	b.ReportMetric(float64(rawCPU.Microseconds())/total, "raw-cpu-µs/msg")
	b.ReportMetric(float64(bridgeCPU.Microseconds())/total, "bridge-cpu-µs/msg")
	b.ReportMetric(0, "ns/op")
}

// rawMsgs builds what the bridge would publish for pls, as worker: canonical JSON bodies, the same
// headers.
func rawMsgs(b *testing.B, pls [][]byte, worker string) []*nats.Msg {
	key := fpmKey(worker, 0)
	epoch := time.Now().UnixMilli()
	msgs := make([]*nats.Msg, len(pls))
	for i, pl := range pls {
		f, err := schemas.DecodeFPM(pl)
		if err != nil {
			b.Fatal(err)
		}
		hb := newHeaders(11)
		seq := uint64(i)
		hb.set(streams.HeaderMsgID, streams.MsgID(key, epoch, seq))
		hb.set(streams.HeaderSeq, strconv.FormatUint(seq, 10))
		hb.set(streams.HeaderReceivedAt, strconv.FormatInt(epoch, 10))
		hb.set(streams.HeaderNamespace, key.Namespace)
		hb.set(streams.HeaderComponent, key.Component)
		hb.set(streams.HeaderProducer, worker)
		hb.set(streams.HeaderWorkerID, worker)
		hb.set(streams.HeaderDPRank, "0")
		hb.set(streams.HeaderEpoch, strconv.FormatInt(epoch, 10))
		hb.set(streams.HeaderEndpoint, "tcp://127.0.0.1:20380")
		hb.set(streams.HeaderBridge, "bench")
		msgs[i] = &nats.Msg{Subject: streams.FPMSubject(key), Header: hb.h, Data: f.JSON}
	}
	return msgs
}

// benchRaw publishes the canonical JSON of every payload, with the bridge's headers, and waits for
// every ack. It returns the wall time and the process CPU time of the timed part.
func benchRaw(b *testing.B, js jetstream.JetStream, pls [][]byte, worker string) (wall, cpu time.Duration) {
	msgs := rawMsgs(b, pls, worker)
	cpu0 := processCPU()
	start := time.Now()
	for _, m := range msgs {
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("raw publishes not acknowledged within a minute")
	}
	return time.Since(start), processCPU() - cpu0
}

// benchBridge sends every payload over ZMQ to a fresh bridge and waits until all are acknowledged.
// It returns the wall time and the process CPU time of the timed part.
func benchBridge(b *testing.B, env *natsservertest.Env, pls [][]byte, iter int, opts ...option) (wall, cpu time.Duration) {
	pub := newTestPub(b, "tcp://127.0.0.1:*")
	defer pub.Close()
	h := startBridge(b, env, []Endpoint{{URL: pub.URL}}, func(c *Config) {
		c.MaxBuffer = len(pls)
		c.BridgeID = "bench-" + strconv.Itoa(iter)
	}, opts...)
	defer func() { _ = h.stop() }()
	pub.waitSubscribed()
	n := uint64(len(pls))
	cpu0 := processCPU()
	start := time.Now()
	for i, pl := range pls {
		pub.send(uint64(i), pl)
	}
	for h.b.Stats().Ranks[0].Published < n {
		if time.Since(start) > time.Minute {
			b.Fatalf("bridge: %s", fmtStats(h.b.Stats()))
		}
		time.Sleep(200 * time.Microsecond)
	}
	wall, cpu = time.Since(start), processCPU()-cpu0
	if s := h.b.Stats().Ranks[0]; s.Dropped != 0 || s.Received != n {
		b.Fatalf("bridge dropped: %+v", s)
	}
	return wall, cpu
}

// BenchmarkBridgeLatency paces FPMs at 10,000 per second (10 every millisecond, like a busy rank's
// bursts) through a ZMQ PUB into the bridge and reports the p50/p99/max latency from ZMQ send to
// JetStream ack, i.e. until the FPM is stored. The send time is taken right after each message's last
// SendBytes; the stored time is when the bridge receives the JetStream ack (stamped in its ack handler
// and reported through withAckHook), which is when the bridge knows the message is durable. For reference, raw-p50/raw-p99 are the same
// measurement for JetStream async publishes of the same bodies and headers at the same pace (publish
// call to ack handler), on the same server; send-recv-* is the ZMQ leg (send to the bridge's receive
// stamp) and recv-ack-* the bridge's own leg (receive to ack).
//
// Run with: go test ./bridge -run '^$' -bench BridgeLatency -benchtime 1x
func BenchmarkBridgeLatency(b *testing.B) {
	const rate, perTick = 10000, 10
	n := benchN(30000)
	env := natsservertest.Start(b)
	sent := make([]time.Time, n)
	acked := make([]time.Time, n)
	var nAcked atomic.Int64
	var lat, rawLat, sendToRecv, recvToAck []time.Duration
	recvd := make([]time.Time, n)
	pace := func(send func(i int)) {
		tick := time.NewTicker(time.Second / (rate / perTick))
		defer tick.Stop()
		for i := 0; i < n; {
			<-tick.C
			for j := 0; j < perTick && i < n; j, i = j+1, i+1 {
				send(i)
				sent[i] = time.Now()
			}
		}
	}
	waitAcks := func() {
		deadline := time.Now().Add(time.Minute)
		for nAcked.Load() < int64(n) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d acks", nAcked.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	iter := 0
	for b.Loop() {
		iter++
		// The bridge, end to end.
		nAcked.Store(0)
		pub := newTestPub(b, "tcp://127.0.0.1:*")
		h := startBridge(b, env, []Endpoint{{URL: pub.URL}}, func(c *Config) { c.BridgeID = "lat-" + strconv.Itoa(iter) },
			withAckHook(func(it *item, at time.Time) {
				acked[it.seq] = at
				recvd[it.seq] = it.recv
				nAcked.Add(1)
			}))
		pub.waitSubscribed()
		pls := make([][]byte, n)
		for i := range pls {
			pls[i] = payload("lat-"+strconv.Itoa(iter), 0, uint64(i))
		}
		pace(func(i int) { pub.send(uint64(i), pls[i]) })
		waitAcks()
		for i := range n {
			lat = append(lat, acked[i].Sub(sent[i]))
			sendToRecv = append(sendToRecv, recvd[i].Sub(sent[i]))
			recvToAck = append(recvToAck, acked[i].Sub(recvd[i]))
		}
		_ = h.stop()
		pub.Close()

		// Raw JetStream at the same pace, for reference.
		nAcked.Store(0)
		msgs := rawMsgs(b, pls, "rawlat-"+strconv.Itoa(iter))
		index := make(map[*nats.Msg]int, n)
		for i, m := range msgs {
			index[m] = i
		}
		js, err := jetstream.New(env.NC, jetstream.WithPublishAsyncMaxPending(defaultMaxInFlight),
			jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
				acked[index[m]] = time.Now()
				nAcked.Add(1)
			}))
		if err != nil {
			b.Fatal(err)
		}
		pace(func(i int) {
			if _, err := js.PublishMsgAsync(msgs[i]); err != nil {
				b.Fatal(err)
			}
		})
		waitAcks()
		for i := range n {
			rawLat = append(rawLat, acked[i].Sub(sent[i]))
		}
	}
	slices.Sort(lat)
	slices.Sort(sendToRecv)
	slices.Sort(recvToAck)
	slices.Sort(rawLat)
	q := func(l []time.Duration, p float64) float64 {
		return float64(l[int(p*float64(len(l)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(lat, 0.50), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(q(lat, 1), "max-ms")
	b.ReportMetric(q(rawLat, 0.50), "raw-p50-ms")
	b.ReportMetric(q(rawLat, 0.99), "raw-p99-ms")
	b.ReportMetric(q(sendToRecv, 0.50), "send-recv-p50-ms")
	b.ReportMetric(q(sendToRecv, 0.99), "send-recv-p99-ms")
	b.ReportMetric(q(recvToAck, 0.50), "recv-ack-p50-ms")
	b.ReportMetric(q(recvToAck, 0.99), "recv-ack-p99-ms")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the user+system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
