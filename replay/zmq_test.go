package replay

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
)

// got is one message a subscriber received.
type got struct {
	seq uint64
	fpm *schemas.FPM
	at  time.Time
}

// collect receives on sub until it has seen n messages or nothing came for a second; it owns sub.
func collect(t *testing.T, sub *producertest.Subscriber, n int) <-chan []got {
	out := make(chan []got, 1)
	go func() {
		var gs []got
		for len(gs) < n {
			m, err := sub.Recv(time.Second)
			if err != nil {
				break
			}
			at := time.Now()
			if !m.Wellformed || len(m.Frames[0]) != 0 {
				t.Errorf("not Dynamo's three frames: %d frames", len(m.Frames))
				break
			}
			f, err := schemas.DecodeFPM(m.Payload())
			if err != nil {
				t.Errorf("seq %d: %v", m.Seq, err)
				break
			}
			gs = append(gs, got{m.Seq, f, at})
		}
		out <- gs
	}()
	return out
}

// runReplay runs r to the end and returns its report.
func runReplay(t *testing.T, r *Replayer) *Report {
	t.Helper()
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// The ZMQ target is Dynamo's publisher: one PUB socket per producer and rank on base + rank, three
// frames, sequences from 0 per socket, each payload the recorded fpm (counter ids kept or renumbered,
// worker ids mapped), at the recorded pace.
func TestZMQReplayIsDynamosPublisher(t *testing.T) {
	const perRank = 20
	var ls []line
	for i := range perRank {
		for rank := range 2 {
			// 5 ms apart, the ranks 2 ms apart; counters start at 1000 (a trace that began mid-run).
			ls = append(ls, line{producer: "w", observed: t0 + int64(i*5+rank*2), fpm: fpmJSON(t, "w", rank, int64(1000+i))})
		}
	}
	rec := recordingOf(t, ls...)
	cases := map[string]PlanConfig{
		"counter ids kept":                   {},
		"counter ids renumbered, worker map": {CounterIDs: CounterRenumber, MapWorker: map[string]string{"w": "replayed"}},
	}
	for name, pcfg := range cases {
		t.Run(name, func(t *testing.T) {
			plan, err := NewPlan(rec, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			base := producertest.FreeBasePort(t, "", 2)
			r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1, StartDelay: 50 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			var outs []<-chan []got
			for rank := range 2 {
				sub := producertest.NewSubscriber(t, "tcp://127.0.0.1:"+strconv.Itoa(base+rank), 0)
				outs = append(outs, collect(t, sub, perRank))
			}
			rep := runReplay(t, r)
			if rep.Overall.Replayed != 2*perRank || rep.Overall.Failed != 0 || rep.Overall.Heartbeats != 0 {
				t.Fatalf("report %+v", rep.Overall)
			}
			for rank, out := range outs {
				gs := <-out
				if len(gs) != perRank {
					t.Fatalf("rank %d: received %d of %d", rank, len(gs), perRank)
				}
				for i, g := range gs {
					want := fpmJSON(t, "w", rank, int64(1000+i))
					if pcfg.CounterIDs == CounterRenumber {
						want = bytes.Replace(want, []byte(`"counter_id":`+strconv.Itoa(1000+i)), []byte(`"counter_id":`+strconv.Itoa(i)), 1)
						want = bytes.Replace(want, []byte(`"worker_id":"w"`), []byte(`"worker_id":"replayed"`), 1)
					}
					if g.seq != uint64(i) || !bytes.Equal(g.fpm.JSON, want) {
						t.Fatalf("rank %d message %d: seq %d\n%s\nwant\n%s", rank, i, g.seq, g.fpm.JSON, want)
					}
					// At the recorded pace: 5 ms apart, within the host's scheduling noise.
					if off, want := g.at.Sub(gs[0].at), time.Duration(i)*5*time.Millisecond; off < want-20*time.Millisecond || off > want+20*time.Millisecond {
						t.Errorf("rank %d message %d arrived %v after the first, want about %v", rank, i, off, want)
					}
				}
			}
			if rep.Ranks[1].Endpoint != "tcp://127.0.0.1:"+strconv.Itoa(base+1) || rep.Ranks[1].Replayed != perRank {
				t.Fatalf("rank report %+v", rep.Ranks[1])
			}
		})
	}
}

// A sampled trace leaves the worker's idle heartbeats out; the replay sends them as Dynamo does: after
// the interval without a publish, an all-zero FPM with the socket's worker_id and dp_rank, counter_id
// its sequence number, the sequence shared with the records.
func TestZMQReplaySendsHeartbeatsWhereTheRecordingHasNone(t *testing.T) {
	rec := recordingOf(t,
		line{producer: "w", mode: schemas.CaptureSampled, observed: t0, fpm: fpmJSON(t, "w", 3, 500)},
		line{producer: "w", mode: schemas.CaptureSampled, observed: t0 + 450, fpm: fpmJSON(t, "w", 3, 900)},
	)
	plan, err := NewPlan(rec, PlanConfig{HeartbeatInterval: 100 * time.Millisecond, MapWorker: map[string]string{"w": "m"}})
	if err != nil {
		t.Fatal(err)
	}
	base := producertest.FreeBasePort(t, "", 4)
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	sub := producertest.NewSubscriber(t, "tcp://127.0.0.1:"+strconv.Itoa(base+3), 0)
	out := collect(t, sub, 6)
	rep := runReplay(t, r)
	gs := <-out
	if len(gs) != 6 || rep.Overall.Heartbeats != 4 || rep.Overall.Replayed != 2 {
		t.Fatalf("received %d, report %+v", len(gs), rep.Overall)
	}
	for i, g := range gs {
		hb := i >= 1 && i <= 4
		if g.seq != uint64(i) || g.fpm.IsHeartbeat() != hb || g.fpm.WorkerID != "m" || g.fpm.DPRank != 3 {
			t.Fatalf("message %d: seq %d %s", i, g.seq, g.fpm.JSON)
		}
		if hb && g.fpm.CounterID != int64(i) || !hb && g.fpm.CounterID != []int64{500, 0, 0, 0, 0, 900}[i] {
			t.Fatalf("message %d: counter_id %d", i, g.fpm.CounterID)
		}
		if hb {
			if off, want := g.at.Sub(gs[0].at), time.Duration(i)*100*time.Millisecond; off < want-10*time.Millisecond || off > want+40*time.Millisecond {
				t.Errorf("heartbeat %d came %v after the first record, want about %v", i, off, want)
			}
		}
	}
}

// Stopping a replay (Ctrl-C) ends it at once, closes its sockets and reports what was sent.
func TestZMQReplayStopsWhenItsContextEnds(t *testing.T) {
	rec := recordingOf(t,
		line{producer: "w", observed: t0, fpm: fpmJSON(t, "w", 0, 1)},
		line{producer: "w", observed: t0 + 60_000, fpm: fpmJSON(t, "w", 0, 2)},
	)
	plan, err := NewPlan(rec, PlanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	base := producertest.FreeBasePort(t, "", 1)
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-r.Ready()
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	rep, err := r.Run(ctx)
	// Nobody subscribed: the one record sent is reported undelivered, not replayed.
	if err != nil || !rep.Interrupted || rep.Overall.Replayed != 0 || rep.Overall.Undelivered != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("err %v, report %+v after %v", err, rep, time.Since(start))
	}
	if _, err := r.Run(t.Context()); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("second run: %v", err)
	}
	// The port is free again.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base))
	if err != nil {
		t.Fatalf("port still bound: %v", err)
	}
	l.Close()
}

// A port already taken is an error naming the rank and the endpoint.
func TestZMQReplayBindErrorNamesTheRank(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	plan, err := NewPlan(recordingOf(t, line{producer: "w", observed: t0, fpm: fpmJSON(t, "w", 0, 1)}), PlanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: port}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Run(t.Context())
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "w/0") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("got %v", err)
	}
}

// signalWriter closes first when the first line is written to it (a progress line per record).
type signalWriter struct {
	first chan struct{}
	once  sync.Once
}

func (w *signalWriter) Write(b []byte) (int, error) {
	w.once.Do(func() { close(w.first) })
	return len(b), nil
}

// What a socket sends while it has no subscriber is not delivered (libzmq drops it) and the report
// says so per rank: a socket nobody subscribes to has every record undelivered; on one whose
// subscriber joins after the first record, the first is undelivered and what the subscriber received
// is what the report calls replayed (give or take the one record sent as it joined).
func TestZMQReplayReportsWhatNoSubscriberReceived(t *testing.T) {
	var ls []line
	for i := range 12 {
		off := int64(i * 10)
		if i >= 3 {
			off = 500 + int64(i*10) // half a second, for the subscriber to join in
		}
		for rank := range 2 {
			ls = append(ls, line{producer: "w", observed: t0 + off, fpm: fpmJSON(t, "w", rank, int64(i))})
		}
	}
	plan, err := NewPlan(recordingOf(t, ls...), PlanConfig{})
	if err != nil {
		t.Fatal(err)
	}
	base := producertest.FreeBasePort(t, "", 2)
	progress := &signalWriter{first: make(chan struct{})}
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base}}, WithProgress(progress, 1))
	if err != nil {
		t.Fatal(err)
	}
	received := make(chan []got, 1)
	go func() {
		<-progress.first // rank 0's first record has been sent, with no subscriber
		sub := producertest.NewSubscriber(t, "tcp://127.0.0.1:"+strconv.Itoa(base), 0)
		received <- <-collect(t, sub, 12)
	}()
	rep := runReplay(t, r)
	gs := <-received
	r0, r1 := rep.Ranks[0], rep.Ranks[1]
	if r1.Replayed != 0 || r1.Undelivered != 12 || r0.Undelivered < 1 || r0.Replayed+r0.Undelivered != 12 ||
		rep.Overall.Undelivered != r0.Undelivered+12 || rep.Overall.Replayed != r0.Replayed {
		t.Fatalf("report: rank 0 %+v, rank 1 %+v, overall %+v", r0, r1, rep.Overall)
	}
	if len(gs) < r0.Replayed || len(gs) > r0.Replayed+1 {
		t.Fatalf("the subscriber received %d, the report says %d replayed on its socket", len(gs), r0.Replayed)
	}
	if ns := rep.NoSubscriber(); len(ns) != 2 || ns[1].Rank != "w/1" {
		t.Fatalf("sockets without a subscriber %+v", ns)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	want := "no subscriber: w/1 (tcp://127.0.0.1:" + strconv.Itoa(base+1) + "): 12 records and 0 heartbeats not delivered"
	if !strings.Contains(text.String(), want) || !strings.Contains(text.String(), "NOT DELIVERED") {
		t.Fatalf("report text lacks %q:\n%s", want, text.String())
	}
	t.Logf("rank 0: %d undelivered before the subscriber joined, %d replayed, %d received", r0.Undelivered, r0.Replayed, len(gs))
}
