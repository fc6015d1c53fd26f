package producer_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"reflect"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
)

// startDelay gives the test's SUB sockets time to connect and subscribe before sequence 0 (slow joiner).
const startDelay = 300 * time.Millisecond

// newPublisher binds a publisher on free loopback ports and connects one subscriber per rank.
func newPublisher(t *testing.T, cfg producer.Config, rcvhwm int) (*producer.Publisher, []*producertest.Subscriber) {
	t.Helper()
	cfg.Host = "127.0.0.1"
	if cfg.DPSize == 0 {
		cfg.DPSize = 1
	}
	cfg.BasePort = producertest.FreeBasePort(t, cfg.Host, cfg.DPSize)
	if cfg.StartDelay > 0 && cfg.WaitSubscribers == 0 {
		// Tests that give a start delay want their subscriber to see everything: wait for it to join
		// instead of hoping the delay covers ZMQ's slow joiner on a loaded machine.
		cfg.WaitSubscribers = 1
	}
	p, err := producer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var subs []*producertest.Subscriber
	for _, ep := range p.Endpoints() {
		subs = append(subs, producertest.NewSubscriber(t, ep, rcvhwm))
	}
	return p, subs
}

// runAsync starts p.Run and returns a function that waits for its result.
func runAsync(t *testing.T, ctx context.Context, p *producer.Publisher) func() error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx) }()
	t.Cleanup(func() { p.Close() })
	return func() error {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
			return nil
		}
	}
}

func TestPublisherFrameFormat(t *testing.T) {
	const count = 200
	p, subs := newPublisher(t, producer.Config{DPSize: 3, WorkerID: "worker-7", Count: count, Seed: 5, StartDelay: startDelay}, 0)
	wait := runAsync(t, context.Background(), p)
	for rank, sub := range subs {
		for want := range uint64(count) {
			m, err := sub.Recv(recvTimeout)
			if err != nil {
				t.Fatalf("rank %d: message %d: %v", rank, want, err)
			}
			if len(m.Frames) != 3 || len(m.Frames[0]) != 0 || len(m.Frames[1]) != 8 {
				t.Fatalf("rank %d: frames %q, want (empty topic, 8-byte seq, payload)", rank, m.Frames)
			}
			if m.Seq != want {
				t.Fatalf("rank %d: seq %d, want %d (contiguous from 0)", rank, m.Seq, want)
			}
			f, err := schemas.DecodeFPM(m.Payload())
			if err != nil {
				t.Fatalf("rank %d seq %d: %v", rank, m.Seq, err)
			}
			if f.CounterID != int64(m.Seq) || f.DPRank != int64(rank) || f.WorkerID != "worker-7" || f.Version != 1 {
				t.Fatalf("rank %d seq %d: %+v", rank, m.Seq, f)
			}
			if f.IsHeartbeat() || f.WallTime <= 0 {
				t.Fatalf("rank %d seq %d: empty FPM published: %+v", rank, m.Seq, f)
			}
			if enc := schemas.EncodeMsgpack(f); !bytes.Equal(enc, m.Payload()) {
				t.Fatalf("rank %d seq %d: payload is not the canonical msgspec encoding:\n got % x\nwant % x",
					rank, m.Seq, m.Payload(), enc)
			}
		}
	}
	if err := wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	for rank, sub := range subs {
		if m, err := sub.Recv(100 * time.Millisecond); err == nil {
			t.Errorf("rank %d: extra message seq %d after Count", rank, m.Seq)
		}
	}
	for _, st := range p.Stats() {
		want := producer.RankStats{Rank: st.Rank, Endpoint: p.Endpoints()[st.Rank], Generated: count, Sent: count, LastSeq: count - 1}
		if st != want {
			t.Errorf("stats %+v, want %+v", st, want)
		}
	}
}

// TestPublisherHeartbeats: an idle rank heartbeats after every interval without a publish, on the
// sequence it shares with FPMs. The k-th heartbeat cannot leave before StartDelay + k intervals (the
// interval restarts at each send, and the rank's sender starts after StartDelay), so none arrives
// earlier; how soon after that they come is timing, BenchmarkPublisherHeartbeatInterval measures it.
func TestPublisherHeartbeats(t *testing.T) {
	const interval = 100 * time.Millisecond
	p, subs := newPublisher(t, producer.Config{
		WorkerID: "hb", Count: 3, IdleAfterCount: true, HeartbeatInterval: interval, StartDelay: startDelay,
	}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := time.Now()
	wait := runAsync(t, ctx, p)
	sub := subs[0]
	for want := range uint64(3) {
		seq, f := sub.RecvFPM(t, recvTimeout)
		if seq != want || f.IsHeartbeat() {
			t.Fatalf("message %d: seq %d heartbeat %v", want, seq, f.IsHeartbeat())
		}
	}
	const heartbeats = 5
	for k := range heartbeats {
		want := uint64(3 + k)
		seq, f := sub.RecvFPM(t, recvTimeout)
		if seq != want {
			t.Fatalf("heartbeat seq %d, want %d (the sequence is shared with FPMs)", seq, want)
		}
		if !f.IsHeartbeat() || f.WallTime != 0 || f.Version != 1 || f.WorkerID != "hb" || f.DPRank != 0 || f.CounterID != int64(seq) {
			t.Fatalf("seq %d: not an all-zero heartbeat: %+v", seq, f)
		}
		if elapsed, least := time.Since(started), startDelay+time.Duration(k+1)*interval; elapsed < least {
			t.Errorf("heartbeat %d arrived %v after Run, before %v", k+1, elapsed, least)
		}
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	st := p.Stats()[0]
	if st.Generated != 3 || st.Heartbeats < 5 || st.Sent != st.Heartbeats+3 || st.LastSeq != int64(st.Sent)-1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPublisherIdleHeartbeatBeforeTraffic: a rank that never publishes still heartbeats from seq 0.
func TestPublisherIdleHeartbeatBeforeTraffic(t *testing.T) {
	p, subs := newPublisher(t, producer.Config{
		Rate: 0.001, Count: 1, HeartbeatInterval: 100 * time.Millisecond, StartDelay: startDelay,
	}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := runAsync(t, ctx, p)
	for want := range uint64(3) {
		seq, f := subs[0].RecvFPM(t, recvTimeout)
		if seq != want || !f.IsHeartbeat() {
			t.Fatalf("seq %d (want %d), heartbeat %v", seq, want, f.IsHeartbeat())
		}
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
}

func TestPublisherDeterministicPayloads(t *testing.T) {
	const count = 300
	run := func(seed int64) [][]byte {
		p, subs := newPublisher(t, producer.Config{DPSize: 2, Count: count, Seed: seed, StartDelay: startDelay}, 0)
		wait := runAsync(t, context.Background(), p)
		var payloads [][]byte
		for _, sub := range subs {
			for range count {
				m, err := sub.Recv(recvTimeout)
				if err != nil {
					t.Fatal(err)
				}
				payloads = append(payloads, m.Payload())
			}
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		return payloads
	}
	a, b := run(11), run(11)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed gave different payload sequences")
	}
	if reflect.DeepEqual(a, run(12)) {
		t.Fatal("different seeds gave the same payload sequence")
	}
}

func TestPublisherBindConflictNamesPortAndRank(t *testing.T) {
	base := producertest.FreeBasePort(t, "127.0.0.1", 2)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+1))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = producer.New(producer.Config{BasePort: base, DPSize: 2})
	want := "bind tcp://127.0.0.1:" + strconv.Itoa(base+1) + " (dp_rank 1): address already in use"
	if err == nil || err.Error() != want {
		t.Fatalf("New = %v, want %q", err, want)
	}
	var be *producer.BindError
	if !errors.As(err, &be) || be.Rank != 1 || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("error %#v: want a *BindError for rank 1 wrapping EADDRINUSE", err)
	}
	// Rank 0's socket was released: its port binds again.
	p, err := producer.New(producer.Config{BasePort: base})
	if err != nil {
		t.Fatalf("rank 0's port still taken after the failed New: %v", err)
	}
	p.Close()
}

// TestPublisherSendDrops: XPUB_NODROP, SNDHWM 1 and a subscriber that never reads make libzmq refuse
// sends with EAGAIN; each refused message is counted and still consumes its sequence number.
func TestPublisherSendDrops(t *testing.T) {
	p, _ := newPublisher(t, producer.Config{
		Count: 20_000, SendHWM: 1, NoDrop: true, Linger: -1, HeartbeatInterval: time.Hour, StartDelay: startDelay,
	}, 1)
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()[0]
	t.Logf("stats %+v", st)
	if st.SendDrops == 0 {
		t.Fatal("no EAGAIN drops counted")
	}
	if st.Generated != 20_000 || st.Sent+st.QueueDrops+st.SendDrops+st.SendErrors != st.Generated+st.Heartbeats ||
		st.LastSeq != int64(st.Sent+st.SendDrops+st.SendErrors)-1 {
		t.Fatalf("counters do not add up: %+v", st)
	}
}

// TestPublisherSlowSubscriberGaps shows how Dynamo's stream gets gaps: without NODROP a PUB never reports
// EAGAIN, it silently drops what a slow subscriber cannot take, and the subscriber sees sequence gaps.
func TestPublisherSlowSubscriberGaps(t *testing.T) {
	const count = 50_000
	p, subs := newPublisher(t, producer.Config{Count: count, SendHWM: 1, StartDelay: startDelay}, 1)
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()[0]
	if st.SendDrops != 0 || st.SendErrors != 0 {
		t.Fatalf("a lossy PUB reported drops: %+v", st)
	}
	var got, gaps int
	prev := int64(-1)
	for {
		m, err := subs[0].Recv(500 * time.Millisecond)
		if err != nil {
			break
		}
		if int64(m.Seq) <= prev {
			t.Fatalf("seq %d after %d", m.Seq, prev)
		}
		if int64(m.Seq) != prev+1 {
			gaps++
		}
		prev = int64(m.Seq)
		got++
	}
	t.Logf("sent %d, queue drops %d, received %d with %d gaps", st.Sent, st.QueueDrops, got, gaps)
	if gaps == 0 || got >= int(st.Sent) {
		t.Fatalf("expected silent drops: sent %d, received %d, gaps %d", st.Sent, got, gaps)
	}
}

func TestPublisherRatePacing(t *testing.T) {
	p, _ := newPublisher(t, producer.Config{Rate: 100, Count: 20}, 0)
	start := time.Now()
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < 150*time.Millisecond {
		t.Fatalf("20 forward passes at 100/s took %v", elapsed)
	}
}

func TestPublisherLifecycle(t *testing.T) {
	t.Run("Close before Run releases the ports and makes Run fail", func(t *testing.T) {
		base := producertest.FreeBasePort(t, "", 2)
		cfg := producer.Config{BasePort: base, DPSize: 2}
		p, err := producer.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := p.Run(context.Background()); !errors.Is(err, producer.ErrClosed) {
			t.Fatalf("Run after Close = %v, want ErrClosed", err)
		}
		p2, err := producer.New(cfg)
		if err != nil {
			t.Fatalf("ports not released: %v", err)
		}
		p2.Close()
	})
	t.Run("Close stops a running publisher", func(t *testing.T) {
		p, _ := newPublisher(t, producer.Config{Rate: 1000}, 0)
		wait := runAsync(t, context.Background(), p)
		select {
		case <-p.Ready():
		case <-time.After(recvTimeout):
			t.Fatal("never ready")
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := wait(); err != nil {
			t.Fatalf("Run = %v", err)
		}
		if err := p.Run(context.Background()); !errors.Is(err, producer.ErrClosed) {
			t.Fatalf("second Run = %v, want ErrClosed", err)
		}
	})
	t.Run("cancel during StartDelay", func(t *testing.T) {
		p, _ := newPublisher(t, producer.Config{StartDelay: time.Hour}, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := p.Run(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Ready():
			t.Fatal("Ready closed although nothing started")
		default:
		}
		if st := p.Stats()[0]; st.Sent != 0 || st.LastSeq != -1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// sentRecorder collects what OnSent reports, per rank: seq → payload, in call order.
type sentRecorder struct {
	mu    sync.Mutex
	seqs  map[int][]uint64
	bytes map[int]map[uint64][]byte
	hb    map[int]int
}

func newSentRecorder() *sentRecorder {
	return &sentRecorder{seqs: map[int][]uint64{}, bytes: map[int]map[uint64][]byte{}, hb: map[int]int{}}
}

func (r *sentRecorder) onSent(rank int, seq uint64, heartbeat bool, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seqs[rank] = append(r.seqs[rank], seq)
	if r.bytes[rank] == nil {
		r.bytes[rank] = map[uint64][]byte{}
	}
	r.bytes[rank][seq] = bytes.Clone(payload)
	if heartbeat {
		r.hb[rank]++
	}
}

// OnSent hears of every message libzmq accepted, once, in sequence order per rank, with the bytes the
// subscriber receives; heartbeats are flagged. A send libzmq refused is not reported: the numbers
// missing from what OnSent heard are exactly the refused ones.
func TestPublisherOnSentReportsEveryAcceptedSend(t *testing.T) {
	t.Run("every send", func(t *testing.T) {
		const count = 300
		rec := newSentRecorder()
		p, subs := newPublisher(t, producer.Config{DPSize: 2, WorkerID: "sent", Count: count, Seed: 9, StartDelay: startDelay, OnSent: rec.onSent}, 0)
		wait := runAsync(t, context.Background(), p)
		got := map[int]map[uint64][]byte{}
		for rank, sub := range subs {
			got[rank] = map[uint64][]byte{}
			for range count {
				m, err := sub.Recv(recvTimeout)
				if err != nil {
					t.Fatalf("rank %d: %v", rank, err)
				}
				got[rank][m.Seq] = bytes.Clone(m.Payload())
			}
		}
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		for rank := range subs {
			if n := len(rec.seqs[rank]); n != count {
				t.Fatalf("rank %d: OnSent heard %d sends, want %d", rank, n, count)
			}
			for i, seq := range rec.seqs[rank] {
				if seq != uint64(i) {
					t.Fatalf("rank %d: send %d reported as seq %d", rank, i, seq)
				}
				if !bytes.Equal(rec.bytes[rank][seq], got[rank][seq]) {
					t.Fatalf("rank %d seq %d: OnSent payload differs from the one received", rank, seq)
				}
			}
		}
	})
	t.Run("refused sends", func(t *testing.T) {
		rec := newSentRecorder()
		p, _ := newPublisher(t, producer.Config{
			Count: 5000, SendHWM: 1, NoDrop: true, Linger: -1, HeartbeatInterval: time.Hour, StartDelay: startDelay, OnSent: rec.onSent,
		}, 1)
		if err := p.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()[0]
		if st.SendDrops == 0 {
			t.Fatal("no EAGAIN drops: the case did not happen")
		}
		seqs := rec.seqs[0]
		if uint64(len(seqs)) != st.Sent {
			t.Fatalf("OnSent heard %d sends, stats say %d sent", len(seqs), st.Sent)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("seq %d reported after %d", seqs[i], seqs[i-1])
			}
		}
		if missing := uint64(st.LastSeq+1) - uint64(len(seqs)); missing != st.SendDrops+st.SendErrors {
			t.Fatalf("%d numbers not reported, %d sends refused", missing, st.SendDrops+st.SendErrors)
		}
	})
}
