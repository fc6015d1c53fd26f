package replay

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"math"
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

// collectUntil receives on sub until done says the messages so far are all (or nothing came for ten
// seconds: a generous bound on a loaded host, the senders' own pace decides when each comes); it owns
// sub.
func collectUntil(tb testing.TB, sub *producertest.Subscriber, done func([]got) bool) <-chan []got {
	out := make(chan []got, 1)
	go func() {
		var gs []got
		for len(gs) == 0 || !done(gs) {
			m, err := sub.Recv(10 * time.Second)
			if err != nil {
				break
			}
			at := time.Now()
			if !m.Wellformed || len(m.Frames[0]) != 0 {
				tb.Errorf("not Dynamo's three frames: %d frames", len(m.Frames))
				break
			}
			f, err := schemas.DecodeFPM(m.Payload())
			if err != nil {
				tb.Errorf("seq %d: %v", m.Seq, err)
				break
			}
			gs = append(gs, got{m.Seq, f, at})
		}
		out <- gs
	}()
	return out
}

// csvRow is one records CSV row: a record's send as the replay reported it.
type csvRow struct {
	rank, pass, index int64
	seq               uint64
	counter           int64
	due, sent, late   time.Duration
	outcome           string
}

// csvRows parses the rows of a records CSV in the order they were written: the order the sends were
// settled (for the ZMQ target, the order they were made).
func csvRows(t *testing.T, b []byte) []csvRow {
	t.Helper()
	recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil || len(recs) == 0 {
		t.Fatalf("records CSV: %v\n%s", err, b)
	}
	ms := func(s string) time.Duration {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("records CSV: %q: %v", s, err)
		}
		return time.Duration(math.Round(v*1e3)) * time.Microsecond // written to the microsecond
	}
	var out []csvRow
	for _, r := range recs[1:] {
		var row csvRow
		row.rank, _ = strconv.ParseInt(r[1], 10, 64)
		row.pass, _ = strconv.ParseInt(r[2], 10, 64)
		row.index, _ = strconv.ParseInt(r[3], 10, 64)
		row.seq, _ = strconv.ParseUint(r[4], 10, 64)
		row.counter, _ = strconv.ParseInt(r[5], 10, 64)
		row.due, row.sent, row.late, row.outcome = ms(r[6]), ms(r[7]), ms(r[8]), r[9]
		out = append(out, row)
	}
	return out
}

// runReplay runs r to the end and returns its report.
func runReplay(t *testing.T, r *replayer) *Report {
	t.Helper()
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// The ZMQ target is Dynamo's publisher: one PUB socket per producer and rank on base + rank, three
// frames, sequences from 0 per socket, each payload the recorded fpm (counter ids kept or renumbered,
// worker ids mapped), on the recorded schedule. The schedule is checked where it is decided, in the
// replay's own record of its sends: each record due at its recorded offset, sent in that order across
// the sockets, never before it is due. How late sends and arrivals are on a given host is timing, which
// BenchmarkLateness10kPerSecond8Ranks and BenchmarkZMQArrivalLateness measure.
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
			var rows bytes.Buffer
			r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1, StartDelay: 50 * time.Millisecond}}, WithRecordsCSV(&rows))
			if err != nil {
				t.Fatal(err)
			}
			var outs []<-chan []got
			for rank := range 2 {
				sub := producertest.NewSubscriber(t, "tcp://127.0.0.1:"+strconv.Itoa(base+rank), 0)
				outs = append(outs, collectUntil(t, sub, func(gs []got) bool { return len(gs) == perRank }))
			}
			rep := runReplay(t, r)
			if rep.Overall.Replayed != 2*perRank || rep.Overall.Failed != 0 || rep.Overall.Heartbeats != 0 {
				t.Fatalf("report %+v", rep.Overall)
			}
			// The sends, in the order the replay made them: the recording's, the two sockets interleaved
			// (rank 0's record i due 5i ms after the start, rank 1's 2 ms later), none early.
			sends := csvRows(t, rows.Bytes())
			if len(sends) != 2*perRank {
				t.Fatalf("%d sends in the records CSV, want %d", len(sends), 2*perRank)
			}
			sentAt := [2][]time.Duration{}
			for k, row := range sends {
				i, rank := k/2, k%2
				counter := int64(1000 + i)
				if pcfg.CounterIDs == CounterRenumber {
					counter = int64(i)
				}
				due := time.Duration(i*5+rank*2) * time.Millisecond
				if row.rank != int64(rank) || row.seq != uint64(i) || row.counter != counter || row.due != due || row.outcome != "sent" {
					t.Fatalf("send %d: %+v, want rank %d seq %d counter_id %d due %v, sent", k, row, rank, i, counter, due)
				}
				if row.sent < row.due || (row.late-(row.sent-row.due)).Abs() > time.Microsecond {
					t.Fatalf("send %d: due %v, sent %v, lateness %v: sent early, or the lateness is not the delay", k, row.due, row.sent, row.late)
				}
				sentAt[rank] = append(sentAt[rank], row.sent)
			}
			var arrivedLate time.Duration
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
					// The subscriber's own clock agrees: nothing arrives before the replay says it sent it,
					// so nothing before its due time (the CSV rounds to the microsecond).
					at := g.at.Sub(rep.StartedAt)
					if at < sentAt[rank][i]-time.Microsecond {
						t.Fatalf("rank %d message %d arrived %v after the start, before it was sent (%v)", rank, i, at, sentAt[rank][i])
					}
					arrivedLate = max(arrivedLate, at-time.Duration(i*5+rank*2)*time.Millisecond)
				}
			}
			if rep.Ranks[1].Endpoint != "tcp://127.0.0.1:"+strconv.Itoa(base+1) || rep.Ranks[1].Replayed != perRank {
				t.Fatalf("rank report %+v", rep.Ranks[1])
			}
			t.Logf("lateness reported p99 %.3f ms, max %.3f ms; latest arrival %v after its due time", rep.Overall.Lateness.P99Ms, rep.Overall.Lateness.MaxMs, arrivedLate)
		})
	}
}

// A sampled trace leaves the worker's idle heartbeats out; the replay sends them as Dynamo does: after
// the interval without a publish, an all-zero FPM with the socket's worker_id and dp_rank, counter_id
// its sequence number, the sequence shared with the records. The k-th heartbeat of a silence goes no
// sooner than k intervals after the record before it, so at most nine fit in a second's silence at
// 100 ms: nine when the host wakes the replay on time, fewer when it wakes it late (the count is
// timing, BenchmarkZMQArrivalLateness reports it); the silence is long enough that a host waking it
// hundreds of milliseconds late still sends some.
func TestZMQReplaySendsHeartbeatsWhereTheRecordingHasNone(t *testing.T) {
	const (
		interval = 100 * time.Millisecond
		silence  = time.Second
		most     = int(silence/interval) - 1
	)
	rec := recordingOf(t,
		line{producer: "w", mode: schemas.CaptureSampled, observed: t0, fpm: fpmJSON(t, "w", 3, 500)},
		line{producer: "w", mode: schemas.CaptureSampled, observed: t0 + silence.Milliseconds(), fpm: fpmJSON(t, "w", 3, 900)},
	)
	plan, err := NewPlan(rec, PlanConfig{HeartbeatInterval: interval, MapWorker: map[string]string{"w": "m"}})
	if err != nil {
		t.Fatal(err)
	}
	base := producertest.FreeBasePort(t, "", 4)
	r, err := New(plan, Config{ZMQ: ZMQConfig{BasePort: base, WaitSubscribers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	sub := producertest.NewSubscriber(t, "tcp://127.0.0.1:"+strconv.Itoa(base+3), 0)
	out := collectUntil(t, sub, func(gs []got) bool { last := gs[len(gs)-1].fpm; return !last.IsHeartbeat() && last.CounterID == 900 })
	rep := runReplay(t, r)
	gs := <-out
	n := len(gs) - 2 // the heartbeats between the two records
	if n < 1 || n > most || rep.Overall.Heartbeats != n || rep.Overall.Replayed != 2 {
		t.Fatalf("received %d (%d heartbeats, want 1 to %d), report %+v", len(gs), n, most, rep.Overall)
	}
	for i, g := range gs {
		hb := i >= 1 && i <= n
		if g.seq != uint64(i) || g.fpm.IsHeartbeat() != hb || g.fpm.WorkerID != "m" || g.fpm.DPRank != 3 {
			t.Fatalf("message %d: seq %d %s", i, g.seq, g.fpm.JSON)
		}
		wantCounter := int64(i)
		switch i {
		case 0:
			wantCounter = 500
		case n + 1:
			wantCounter = 900
		}
		if g.fpm.CounterID != wantCounter {
			t.Fatalf("message %d: counter_id %d, want %d", i, g.fpm.CounterID, wantCounter)
		}
		// Never early, by the subscriber's clock: the k-th heartbeat no sooner than k intervals after
		// the start, the second record no sooner than its due time.
		least := time.Duration(i) * interval
		if i == n+1 {
			least = silence
		}
		if at := g.at.Sub(rep.StartedAt); at < least {
			t.Fatalf("message %d (heartbeat %v) arrived %v after the start, before %v", i, hb, at, least)
		}
	}
	t.Logf("%d heartbeats in a %v silence at %v", n, silence, interval)
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
	if _, err := r.Run(t.Context()); !errors.Is(err, errAlreadyRun) {
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
