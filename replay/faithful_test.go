package replay

import (
	"bytes"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// slowLink is a real TCP proxy in front of a server that delays every chunk by delay in each
// direction: a JetStream server at the end of a slow link. A publisher that waits for its acks is held
// back by it.
type slowLink struct {
	ln    net.Listener
	delay time.Duration
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newSlowLink(t *testing.T, upstream string, delay time.Duration) *slowLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &slowLink{ln: ln, delay: delay}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, u)
			l.mu.Unlock()
			l.wg.Add(2)
			go l.pipe(c, u)
			go l.pipe(u, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

// pipe copies src to dst, each chunk delivered delay after it was read, in order.
func (l *slowLink) pipe(src, dst net.Conn) {
	defer l.wg.Done()
	type chunk struct {
		at time.Time
		b  []byte
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now().Add(l.delay), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	for range q { // let the reader finish
	}
}

func (l *slowLink) url() string { return "nats://" + l.ln.Addr().String() }

// The faithfulness report is right: a replay held back by its target reports the lateness the target
// measured. The target is a real JetStream server behind a slow link, and the server stamps each stored
// message with its own receive time. The replay publishes with a window of one (MaxInFlight 1), and
// that window brackets each send between two of the server's stamps: the replay takes a record's send
// time before it publishes it, so the server stores the record later; and it takes it only once the
// ack of the record three before has come back (the window held that record, the next one waited to
// enter it), so after the server stored that one. The lateness the report gives for every record must
// lie between the server's lateness of that record and of the record three before, measured against
// the record's due time: the tolerance is what the server measured, however busy the host.
func TestReportedLatenessMatchesWhatTheTargetMeasured(t *testing.T) {
	const (
		n      = 400
		every  = 1 // ms between records: 1000/s scheduled, more than the link allows
		delay  = 3 * time.Millisecond
		window = 3 // a send comes after the server stored the record this many before it
		// clocks covers how the two clocks compared are read: the server's stamps are wall-clock
		// times, the replay's offsets monotonic ones from a wall-clock start (the two advance alike
		// unless the wall clock is stepped), written to the microsecond.
		clocks = time.Millisecond
	)
	env := natsservertest.Start(t)
	link := newSlowLink(t, env.Server.ClientURL()[len("nats://"):], delay)
	nc, err := nats.Connect(link.url(), nats.DontRandomize(), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	var ls []line
	for i := range n {
		ls = append(ls, line{producer: "w", observed: 1_782_777_600_000 + int64(i*every), fpm: fpmJSON(t, "w", 0, int64(i))})
	}
	plan, err := NewPlan(recordingOf(t, ls...), PlanConfig{Heartbeats: heartbeatsOff})
	if err != nil {
		t.Fatal(err)
	}
	var rows bytes.Buffer
	r, err := New(plan, Config{Target: TargetStream, Stream: streamConfig{Conn: nc, MaxInFlight: 1}}, WithRecordsCSV(&rows))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Overall.Replayed != n {
		t.Fatalf("replayed %d of %d: %+v", rep.Overall.Replayed, n, rep.Overall)
	}
	// The replay fell behind: the link allows far less than 1000/s.
	if rep.Overall.Lateness.MaxMs < 100 {
		t.Fatalf("the slow link did not hold the replay back: %+v", rep.Overall.Lateness)
	}

	stored := natsservertest.Messages(t, env.JS, streams.StreamFPM, "fpm.replay.>")
	if len(stored) != n {
		t.Fatalf("stored %d, want %d", len(stored), n)
	}
	// atServer[seq] is when the server stored the record of socket sequence seq, as an offset from the
	// replay's start.
	atServer := make([]time.Duration, n)
	for _, m := range stored {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq, err := strconv.ParseUint(m.Headers().Get(streams.HeaderSeq), 10, 64)
		if err != nil || seq >= n {
			t.Fatalf("stored message with sequence %q: %v", m.Headers().Get(streams.HeaderSeq), err)
		}
		atServer[seq] = md.Timestamp.Sub(rep.StartedAt)
	}
	sends := csvRows(t, rows.Bytes())
	if len(sends) != n {
		t.Fatalf("%d rows in the records CSV, want %d", len(sends), n)
	}
	// Per record (one socket: its sequence is its index): the server's lateness of the record (upper
	// bound) and of the record three before (lower bound), both against the record's due time.
	reported, lo, hi := make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, n)
	var repSum, loSum, hiSum, widest time.Duration
	for _, row := range sends {
		i := row.seq
		if row.index != int64(i) || row.outcome != "sent" {
			t.Fatalf("row %+v: want sent, index = sequence", row)
		}
		reported[i], hi[i] = row.late, atServer[i]-row.due
		if i >= window {
			lo[i] = atServer[i-window] - row.due
		}
		if reported[i] < lo[i]-clocks || reported[i] > hi[i]+clocks {
			t.Errorf("record %d: reported lateness %v, the server measured %v for it and %v for the record %d before (tolerance %v each way)",
				i, reported[i], hi[i], lo[i], window, clocks)
		}
		repSum, loSum, hiSum = repSum+reported[i], loSum+lo[i], hiSum+hi[i]
		widest = max(widest, hi[i]-lo[i])
	}
	// So the report's figures lie between the same figures of the two bounds.
	slices.Sort(lo)
	slices.Sort(hi)
	check := func(name string, got float64, low, high time.Duration) {
		t.Helper()
		if d := time.Duration(got * float64(time.Millisecond)); d < low-clocks || d > high+clocks {
			t.Errorf("%s: reported %.3fms, the server's measurements bound it to %v..%v (tolerance %v each way)", name, got, low, high, clocks)
		}
	}
	l := rep.Overall.Lateness
	check("mean", l.MeanMs, loSum/n, hiSum/n)
	check("p50", l.P50Ms, nearestRank(lo, 0.50), nearestRank(hi, 0.50))
	check("p90", l.P90Ms, nearestRank(lo, 0.90), nearestRank(hi, 0.90))
	check("p99", l.P99Ms, nearestRank(lo, 0.99), nearestRank(hi, 0.99))
	check("max", l.MaxMs, nearestRank(lo, 1), nearestRank(hi, 1))
	t.Logf("lateness reported %+v; the server measured p50 %v p99 %v max %v; mean reported %v in %v..%v; widest bracket %v",
		l, nearestRank(hi, 0.5), nearestRank(hi, 0.99), nearestRank(hi, 1), repSum/n, loSum/n, hiSum/n, widest)
}
