package producer_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
)

// BenchmarkPublisherSend measures what one rank's sender does per message (stamp counter_id, encode the
// msgpack payload, send the three frames without blocking), in messages per second: with no subscriber
// (libzmq discards at once) and with a subscriber draining as fast as it can.
func BenchmarkPublisherSend(b *testing.B) {
	f, _ := producer.NewEngine(1, "bench-worker", 0).Step()
	for _, withSub := range []bool{false, true} {
		name := "no-subscriber"
		if withSub {
			name = "subscriber"
		}
		b.Run(name, func(b *testing.B) {
			port := producertest.FreeBasePort(b, "", 1)
			ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
			s, err := producer.NewSender(nil, ep, producer.DefaultSendHWM, producer.WithLinger(0))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if withSub {
				stop := drain(b, ep)
				defer stop()
				time.Sleep(200 * time.Millisecond) // slow joiner
			}
			buf := make([]byte, 0, 512)
			var seq uint64
			var dropped int
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				f.CounterID = int64(seq)
				buf = schemas.AppendMsgpack(buf[:0], &f)
				if err := s.Send(seq, buf); errors.Is(err, producer.ErrDropped) {
					dropped++
				} else if err != nil {
					b.Fatal(err)
				}
				seq++
			}
			b.ReportMetric(float64(seq)/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(len(buf)), "payload-bytes")
			if dropped > 0 {
				b.ReportMetric(float64(dropped), "eagain")
			}
		})
	}
}

// drain connects a SUB socket to ep and reads until the returned stop function is called.
func drain(b *testing.B, ep string) (stop func()) {
	ctx, err := zmq4.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	sock, err := ctx.NewSocket(zmq4.SUB)
	if err != nil {
		b.Fatal(err)
	}
	sock.SetLinger(0)
	sock.SetRcvtimeo(50 * time.Millisecond)
	sock.SetSubscribe("")
	if err := sock.Connect(ep); err != nil {
		b.Fatal(err)
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() { // owns sock
		defer close(done)
		defer func() { sock.Close(); ctx.Term() }()
		for {
			select {
			case <-quit:
				return
			default:
			}
			sock.RecvMessageBytes(0)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// BenchmarkPublisherHeartbeatInterval measures what TestPublisherHeartbeats leaves to timing: how soon
// after each interval an idle rank's heartbeat reaches a subscriber on the same host. One rank
// publishes one FPM and then idles, heartbeating every 20 ms; each iteration receives one heartbeat.
// Reports the mean gap between heartbeats and the most one gap exceeded the interval.
func BenchmarkPublisherHeartbeatInterval(b *testing.B) {
	const interval = 20 * time.Millisecond
	p, err := producer.New(producer.Config{Host: "127.0.0.1", BasePort: producertest.FreeBasePort(b, "127.0.0.1", 1), DPSize: 1,
		WorkerID: "bench", Count: 1, IdleAfterCount: true, HeartbeatInterval: interval, WaitSubscribers: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	sub := producertest.NewSubscriber(b, p.Endpoints()[0], 0)
	ctx, cancel := context.WithCancel(b.Context())
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			b.Error(err)
		}
	}()
	if _, err := sub.Recv(10 * time.Second); err != nil { // the FPM
		b.Fatal(err)
	}
	last := time.Now()
	var sum, late time.Duration
	for b.Loop() {
		m, err := sub.Recv(10 * time.Second)
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		if f, err := schemas.DecodeFPM(m.Payload()); err != nil || !f.IsHeartbeat() {
			b.Fatalf("seq %d: not a heartbeat (%v)", m.Seq, err)
		}
		sum += now.Sub(last)
		late = max(late, now.Sub(last)-interval)
		last = now
	}
	b.ReportMetric(float64(sum)/float64(b.N)/float64(time.Millisecond), "gap_ms")
	b.ReportMetric(float64(late)/float64(time.Millisecond), "late_max_ms")
}
