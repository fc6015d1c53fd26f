package replay

import (
	"encoding/binary"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
)

// drain subscribes to endpoint and reads everything until stop is closed; done is closed after.
func drain(b *testing.B, endpoint string) (stop, done chan struct{}) {
	b.Helper()
	sub := producertest.NewSubscriber(b, endpoint, 0)
	stop, done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = sub.Recv(50 * time.Millisecond)
		}
	}()
	return stop, done
}

// benchPlan is n records on ranks ranks, perMs records per millisecond of recorded time (0: all at
// once, so the replay runs as fast as it can).
func benchPlan(b *testing.B, n, ranks, perMs int) *Plan {
	b.Helper()
	fpms := make([][]byte, ranks)
	for r := range ranks {
		fpms[r] = fpmJSON(b, "bench", r, 123456)
	}
	rec := &Recording{Records: make([]record, n)}
	for i := range rec.Records {
		r := i % ranks
		obs := int64(t0)
		if perMs > 0 {
			obs += int64(i / perMs)
		}
		rec.Records[i] = record{Namespace: "dynamo", Component: "backend", Producer: "bench", CaptureMode: "full",
			ObservedMs: obs, Order: int64(i), WorkerID: "bench", DPRank: int64(r), CounterID: 123456, FPM: fpms[r]}
	}
	p, err := NewPlan(rec, PlanConfig{Heartbeats: heartbeatsOff})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkReplayRateVsRawZMQ: the highest rate the replay sends at (a schedule due all at once)
// against a bare libzmq send loop of the same payloads on the same kind of socket, each with a
// subscriber draining it. Each iteration alternates eight runs of each and keeps each side's best (the
// host is shared: the best run is the one least disturbed). Reports both rates and their ratio (goal
// >= 0.8).
func BenchmarkReplayRateVsRawZMQ(b *testing.B) {
	const n, rounds = 100_000, 8
	plan := benchPlan(b, n, 1, 0)
	var rawRate, replayRate float64
	for b.Loop() {
		var bestRaw, bestReplay float64
		for range rounds {
			bestRaw = max(bestRaw, rawSendRate(b, plan))
			bestReplay = max(bestReplay, replayRate1(b, plan))
		}
		rawRate += bestRaw
		replayRate += bestReplay
	}
	k := float64(b.N)
	b.ReportMetric(rawRate/k, "raw_msgs/s")
	b.ReportMetric(replayRate/k, "replay_msgs/s")
	b.ReportMetric(replayRate/rawRate, "ratio")
}

// rawSendRate sends the plan's payloads in a bare loop: Dynamo's three frames, NOBLOCK, nothing else.
func rawSendRate(b *testing.B, plan *Plan) float64 {
	port := producertest.FreeBasePort(b, "", 1)
	ctx, err := zmq4.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	pub, err := ctx.NewSocket(zmq4.PUB)
	if err != nil {
		b.Fatal(err)
	}
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:" + strconv.Itoa(port)); err != nil {
		b.Fatal(err)
	}
	stop, done := drain(b, "tcp://127.0.0.1:"+strconv.Itoa(port))
	time.Sleep(200 * time.Millisecond) // the subscription lands
	var seq [8]byte
	start := time.Now()
	for i := range plan.Steps {
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		_, _ = pub.SendBytes(nil, zmq4.DONTWAIT|zmq4.SNDMORE)
		_, _ = pub.SendBytes(seq[:], zmq4.DONTWAIT|zmq4.SNDMORE)
		_, _ = pub.SendBytes(plan.Steps[i].payload.bytes, zmq4.DONTWAIT)
	}
	rate := float64(len(plan.Steps)) / time.Since(start).Seconds()
	close(stop)
	<-done
	pub.Close()
	ctx.Term()
	return rate
}

// replayRate1 replays the plan (through its pacer, reporter and producer.Sender) and returns the
// achieved rate the report gives (first to last send).
func replayRate1(b *testing.B, plan *Plan) float64 {
	port := producertest.FreeBasePort(b, "", 1)
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: port, StartDelay: 200 * time.Millisecond, Linger: -1}})
	if err != nil {
		b.Fatal(err)
	}
	stop, done := drain(b, "tcp://127.0.0.1:"+strconv.Itoa(port))
	rep, err := r.Run(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	close(stop)
	<-done
	return rep.Overall.AchievedRatePerS
}

// BenchmarkLateness10kPerSecond8Ranks: a 2-second schedule of 10,000 FPM/s over 8 ranks (ten records
// per millisecond of recorded time), each rank drained by a subscriber; reports the lateness p99 and
// max (goal p99 <= 2 ms on 2 cores).
func BenchmarkLateness10kPerSecond8Ranks(b *testing.B) {
	const ranks = 8
	plan := benchPlan(b, 20_000, ranks, 10)
	var p99, p50, maxLate float64
	for b.Loop() {
		base := producertest.FreeBasePort(b, "", ranks)
		r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1, Linger: -1}})
		if err != nil {
			b.Fatal(err)
		}
		var stops, dones []chan struct{}
		for i := range ranks {
			s, d := drain(b, "tcp://127.0.0.1:"+strconv.Itoa(base+i))
			stops, dones = append(stops, s), append(dones, d)
		}
		rep, err := r.Run(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		for i := range stops {
			close(stops[i])
			<-dones[i]
		}
		if rep.Overall.Replayed != len(plan.Steps) {
			b.Fatalf("replayed %d of %d", rep.Overall.Replayed, len(plan.Steps))
		}
		p50 += rep.Overall.Lateness.P50Ms
		p99 += rep.Overall.Lateness.P99Ms
		maxLate = max(maxLate, rep.Overall.Lateness.MaxMs)
	}
	k := float64(b.N)
	b.ReportMetric(p50/k, "p50_ms")
	b.ReportMetric(p99/k, "p99_ms")
	b.ReportMetric(maxLate, "max_ms")
}

// BenchmarkZMQArrivalLateness: what the ZMQ tests leave to timing, measured where a consumer sees it.
// A sampled recording of one rank, 100 records 5 ms apart then a second's silence, replayed with
// 100 ms heartbeats to a subscriber on the same host. Reports how late records arrive against their
// due time (p50, p99, max over every iteration's records), how late each heartbeat arrives after the
// message before it plus the interval (max), and the heartbeats that filled the silence (9 when every
// wake-up is on time).
func BenchmarkZMQArrivalLateness(b *testing.B) {
	const (
		records  = 100
		every    = 5 // ms
		interval = 100 * time.Millisecond
		silence  = 1000 // ms
	)
	var ls []line
	for i := range records {
		ls = append(ls, line{producer: "bench", mode: schemas.CaptureSampled, observed: t0 + int64(i*every), fpm: fpmJSON(b, "bench", 0, int64(i))})
	}
	ls = append(ls, line{producer: "bench", mode: schemas.CaptureSampled, observed: t0 + int64((records-1)*every+silence), fpm: fpmJSON(b, "bench", 0, records)})
	plan, err := NewPlan(recordingOf(b, ls...), PlanConfig{HeartbeatInterval: interval})
	if err != nil {
		b.Fatal(err)
	}
	var late []time.Duration
	var hbLateMax time.Duration
	heartbeats := 0
	for b.Loop() {
		base := producertest.FreeBasePort(b, "", 1)
		r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1, Linger: -1}})
		if err != nil {
			b.Fatal(err)
		}
		sub := producertest.NewSubscriber(b, "tcp://127.0.0.1:"+strconv.Itoa(base), 0)
		out := collectUntil(b, sub, func(gs []got) bool { return len(gs) > records && !gs[len(gs)-1].fpm.IsHeartbeat() })
		rep, err := r.Run(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		gs := <-out
		if len(gs) < records+1 {
			b.Fatalf("received %d messages, want at least %d", len(gs), records+1)
		}
		for i := range gs {
			g := &gs[i]
			at := g.at.Sub(rep.StartedAt)
			if i < records {
				late = append(late, at-time.Duration(i*every)*time.Millisecond)
			} else if g.fpm.IsHeartbeat() {
				heartbeats++
				hbLateMax = max(hbLateMax, g.at.Sub(gs[i-1].at)-interval)
			} else {
				late = append(late, at-time.Duration((records-1)*every+silence)*time.Millisecond)
			}
		}
	}
	slices.Sort(late)
	b.ReportMetric(ms(nearestRank(late, 0.50)), "arrival_p50_ms")
	b.ReportMetric(ms(nearestRank(late, 0.99)), "arrival_p99_ms")
	b.ReportMetric(ms(nearestRank(late, 1)), "arrival_max_ms")
	b.ReportMetric(ms(hbLateMax), "heartbeat_late_max_ms")
	b.ReportMetric(float64(heartbeats)/float64(b.N), "heartbeats/silence")
}
