package replay

import (
	"bytes"
	"encoding/csv"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
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
// measured. The target is a real JetStream server behind a slow link, the replay publishes with a
// window of one (MaxInFlight 1: a publish waits for the ack of the one before last), and the server stamps each stored message with its own receive time; that time minus
// the record's due time is the lateness as the target saw it. It differs from the reported lateness by
// the link's one-way delay only.
func TestReportedLatenessMatchesWhatTheTargetMeasured(t *testing.T) {
	const (
		n     = 400
		every = 1 // ms between records: 1000/s scheduled, more than the link allows
		delay = 3 * time.Millisecond
	)
	env := streamstest.Start(t)
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
	plan, err := NewPlan(recordingOf(t, ls...), PlanConfig{Heartbeats: HeartbeatsOff})
	if err != nil {
		t.Fatal(err)
	}
	var rows bytes.Buffer
	r, err := New(plan, Config{Target: TargetStream, Stream: StreamConfig{Conn: nc, MaxInFlight: 1}}, WithRecordsCSV(&rows))
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

	stored := streamstest.Messages(t, env.JS, streams.StreamFPM, "fpm.replay.>")
	if len(stored) != n {
		t.Fatalf("stored %d, want %d", len(stored), n)
	}
	atServer := map[uint64]time.Time{}
	for _, m := range stored {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq, _ := strconv.ParseUint(m.Headers().Get(streams.HeaderSeq), 10, 64)
		atServer[seq] = md.Timestamp
	}
	recs, err := csv.NewReader(&rows).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var measured, reported []time.Duration
	var sum time.Duration
	for _, row := range recs[1:] {
		seq, _ := strconv.ParseUint(row[4], 10, 64)
		due, _ := strconv.ParseFloat(row[6], 64)
		late, _ := strconv.ParseFloat(row[8], 64)
		m := atServer[seq].Sub(rep.StartedAt) - time.Duration(due*float64(time.Millisecond))
		measured = append(measured, m)
		reported = append(reported, time.Duration(late*float64(time.Millisecond)))
		sum += m
	}
	slices.Sort(measured)
	// The report's figures against the target's, within the link's delay plus scheduling noise.
	tol := delay + 10*time.Millisecond
	check := func(name string, got float64, want time.Duration) {
		t.Helper()
		if d := time.Duration(got*float64(time.Millisecond)) - want; d > time.Millisecond || -d > tol {
			t.Errorf("%s: reported %.3fms, the server measured %v (tolerance -%v..+1ms)", name, got, want, tol)
		}
	}
	l := rep.Overall.Lateness
	check("mean", l.MeanMs, sum/time.Duration(n))
	check("p50", l.P50Ms, nearestRank(measured, 0.50))
	check("p90", l.P90Ms, nearestRank(measured, 0.90))
	check("p99", l.P99Ms, nearestRank(measured, 0.99))
	check("max", l.MaxMs, nearestRank(measured, 1))
	// Record by record too: all but a few (a scheduling hiccup of the link's goroutines on a busy host)
	// within twice the tolerance (one record may wait for the link's batch of several messages).
	var diffs []time.Duration
	for i, row := range recs[1:] {
		seq, _ := strconv.ParseUint(row[4], 10, 64)
		due, _ := strconv.ParseFloat(row[6], 64)
		m := atServer[seq].Sub(rep.StartedAt) - time.Duration(due*float64(time.Millisecond))
		diffs = append(diffs, time.Duration(math.Abs(float64(m-reported[i]))))
	}
	slices.Sort(diffs)
	if p99 := nearestRank(diffs, 0.99); p99 > 2*tol {
		t.Errorf("1%% of records' reported lateness differs from the server's by more than %v (tolerance %v)", p99, 2*tol)
	}
	worst := diffs[len(diffs)-1]
	t.Logf("lateness reported %+v; the server measured p50 %v p99 %v max %v; worst record difference %v",
		l, nearestRank(measured, 0.5), nearestRank(measured, 0.99), nearestRank(measured, 1), worst)
}
