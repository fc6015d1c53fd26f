package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// fpmKey is the key of testFPM(worker, rank, _) under the default namespace and component.
func fpmKey(worker string, rank int) streams.Key {
	return streams.Key{Namespace: defaultNamespace, Component: defaultComponent, WorkerID: worker, DPRank: rank}
}

func hdrUint(t testing.TB, m storedMsg, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(m.Headers().Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s header %q: %v", name, m.Headers().Get(name), err)
	}
	return v
}

func TestHappyPathTwoRanks(t *testing.T) {
	t.Parallel()
	const perRank = 2000
	env := natsservertest.Start(t)
	// One worker id needs percent-encoding in the subject.
	workers := []string{"worker-a", "node.1/gpu:0"}
	pubs := []*testPub{newTestPub(t, "tcp://127.0.0.1:*"), newTestPub(t, "tcp://127.0.0.1:*")}
	eps := []Endpoint{{URL: pubs[0].URL, DPRank: 0}, {URL: pubs[1].URL, DPRank: 1}}
	reg := prometheus.NewRegistry()
	h := startBridge(t, env, eps, func(c *Config) { c.Registerer = reg })
	payloads := make([][][]byte, 2)
	for r, p := range pubs {
		p.waitSubscribed()
		for seq := uint64(0); seq < perRank; seq++ {
			pl := payload(workers[r], r, seq)
			payloads[r] = append(payloads[r], pl)
		}
	}
	var wg sync.WaitGroup
	for r, p := range pubs {
		wg.Go(func() {
			for seq, pl := range payloads[r] {
				p.send(uint64(seq), pl)
			}
		})
	}
	wg.Wait()
	h.waitStats(20*time.Second, "every FPM published", func(s stats) bool { return s.Total().Published == 2*perRank })

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != 2*perRank {
		t.Fatalf("stored %d messages, want %d", len(msgs), 2*perRank)
	}
	next := map[string]uint64{}
	epochs := map[string]string{}
	for _, m := range msgs {
		hd := m.Headers()
		rank, err := strconv.Atoi(hd.Get(streams.HeaderDPRank))
		if err != nil || rank < 0 || rank > 1 {
			t.Fatalf("dp rank header %q", hd.Get(streams.HeaderDPRank))
		}
		key := fpmKey(workers[rank], rank)
		if m.Subject() != streams.FPMSubject(key) {
			t.Fatalf("subject %q, want %q", m.Subject(), streams.FPMSubject(key))
		}
		seq := hdrUint(t, m, streams.HeaderSeq)
		if seq != next[m.Subject()] {
			t.Fatalf("%s: seq %d stored after %d: order or exactly-once broken", m.Subject(), seq, next[m.Subject()]-1)
		}
		next[m.Subject()]++
		want, err := schemas.DecodeFPM(payloads[rank][seq])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data(), want.JSON) {
			t.Fatalf("body %s\nwant %s", m.Data(), want.JSON)
		}
		epoch := hd.Get(streams.HeaderEpoch)
		if prev, ok := epochs[m.Subject()]; ok && prev != epoch {
			t.Fatalf("%s: epoch changed from %s to %s without a restart", m.Subject(), prev, epoch)
		}
		epochs[m.Subject()] = epoch
		epochMs, _ := strconv.ParseInt(epoch, 10, 64)
		wantHdr := map[string]string{
			streams.HeaderMsgID:     streams.FPMMsgID(key, seq, streams.PayloadDigest(payloads[rank][seq]), epochMs),
			streams.HeaderNamespace: "dynamo",
			streams.HeaderComponent: "backend",
			streams.HeaderProducer:  workers[rank],
			streams.HeaderWorkerID:  workers[rank],
			streams.HeaderEndpoint:  eps[rank].URL,
			streams.HeaderBridge:    "test-bridge",
		}
		for k, v := range wantHdr {
			if got := hd.Get(k); got != v {
				t.Fatalf("header %s = %q, want %q", k, got, v)
			}
		}
		if recv := hdrUint(t, m, streams.HeaderReceivedAt); int64(recv) < epochMs || time.Since(time.UnixMilli(int64(recv))) > time.Minute {
			t.Fatalf("received-at %d (epoch %d)", recv, epochMs)
		}
		if hd.Get(streams.HeaderSeqMismatch) != "" || hd.Get(streams.HeaderTopic) != "" {
			t.Fatalf("unexpected headers %v", hd)
		}
	}
	s := h.b.Stats()
	for r := 0; r < 2; r++ {
		rs := s.Ranks[r]
		// Duplicates may be non-zero on a loaded machine: a publish whose ack timed out is retried with
		// the same id and the server acks it as a duplicate. The stream check above is the invariant.
		if rs.Received != perRank || rs.Published != perRank || rs.Dropped != 0 || rs.Invalid != 0 || rs.SeqMismatches != 0 {
			t.Fatalf("rank %d stats %+v", r, rs)
		}
		if rs.Duplicates != 0 {
			t.Logf("rank %d: %d publishes retried and acked as duplicates", r, rs.Duplicates)
		}
		if got := counterValue(h.b.metrics.published.WithLabelValues(strconv.Itoa(r))); got != perRank {
			t.Fatalf("rank %d published metric %v", r, got)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"fpmbus_bridge_received_total", "fpmbus_bridge_published_total", "fpmbus_bridge_buffered_messages",
		"fpmbus_bridge_in_flight", "fpmbus_bridge_receive_to_ack_seconds"} {
		if !names[n] {
			t.Fatalf("metric %s not registered (have %v)", n, names)
		}
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Run returned %v on a graceful stop", err)
	}
}

// missingField is a valid payload without its last field (queued_requests).
func missingField() []byte {
	p := payload("w", 0, 0)
	i := bytes.Index(p, append([]byte{0xa0 | 15}, "queued_requests"...))
	out := append([]byte{0x86}, p[1:i]...)
	return out
}

// withExtraField appends an unknown string field of n bytes to a msgpack FPM (a fixmap of 7 fields):
// the FPM rules keep unknown fields, so it stays valid and its canonical JSON grows by about n.
func withExtraField(p []byte, n int) []byte {
	if p[0] != 0x87 {
		panic("not a 7-field fixmap")
	}
	out := append([]byte{0x88}, p[1:]...)
	out = append(out, 0xa5, 'e', 'x', 't', 'r', 'a', 0xdb, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(out, bytes.Repeat([]byte{'x'}, n)...)
}

func TestBadInputIsDeadLettered(t *testing.T) {
	t.Parallel()
	valid := func(f func(*schemas.FPM)) []byte {
		fpm := testFPM("w", 0, 0)
		f(fpm)
		return schemas.EncodeMsgpack(fpm)
	}
	big := withExtraField(payload("w", 0, 9), 100<<10)
	tests := map[string]struct {
		frames    [][]byte
		stage     string
		contains  []string
		seq       string // Fpm-Seq header, "" = absent
		truncated bool
	}{
		"one frame": {frames: [][]byte{payload("w", 0, 0)}, stage: streams.StageFrames,
			contains: []string{"got 1 frames, want 3"}},
		"two frames": {frames: [][]byte{nil, seqFrame(0)}, stage: streams.StageFrames,
			contains: []string{"got 2 frames, want 3 (topic, sequence, payload)"}},
		"four frames": {frames: [][]byte{nil, seqFrame(0), payload("w", 0, 0), []byte("extra")}, stage: streams.StageFrames,
			contains: []string{"got 4 frames, want 3"}},
		"7-byte sequence": {frames: [][]byte{nil, seqFrame(0)[1:], payload("w", 0, 0)}, stage: streams.StageFrames,
			contains: []string{"sequence frame is 7 bytes, want 8"}},
		"bytes that are not msgpack": {frames: [][]byte{nil, seqFrame(3), {0xc1, 0x00, 0x01}}, stage: streams.StageDecode, seq: "3",
			contains: []string{"schemas: msgpack at byte 0", "reserved marker 0xc1"}},
		"text that is not msgpack": {frames: [][]byte{nil, seqFrame(3), []byte("hello")}, stage: streams.StageDecode, seq: "3",
			contains: []string{"want a map"}},
		"a msgpack array": {frames: [][]byte{nil, seqFrame(4), {0x93, 0x01, 0x02, 0x03}}, stage: streams.StageDecode, seq: "4",
			contains: []string{"array", "want a map"}},
		"version 2": {frames: [][]byte{nil, seqFrame(0), valid(func(f *schemas.FPM) { f.Version = 2 })}, stage: streams.StageValidate, seq: "0",
			contains: []string{"schemas: invalid FPM: version"}},
		"a negative count": {frames: [][]byte{nil, seqFrame(0), valid(func(f *schemas.FPM) { f.Scheduled.NumDecodeRequests = -1 })},
			stage: streams.StageValidate, seq: "0", contains: []string{"scheduled_requests.num_decode_requests", "-1"}},
		"a NaN wall_time": {frames: [][]byte{nil, seqFrame(0), valid(func(f *schemas.FPM) { f.WallTime = nan() })},
			stage: streams.StageValidate, seq: "0", contains: []string{"wall_time", "NaN"}},
		"a missing field": {frames: [][]byte{nil, seqFrame(0), missingField()}, stage: streams.StageValidate, seq: "0",
			contains: []string{"queued_requests", "missing"}},
		// A payload over MaxPayload never reaches the bridge any more (libzmq refuses the frame unread:
		// TestOversizedFrameIsRefusedUnread); under a small server max_payload a large valid FPM is still
		// cut to fit, like any dead letter.
		"an FPM over the server's max_payload": {frames: [][]byte{nil, seqFrame(9), big}, stage: streams.StageSize, seq: "9", truncated: true,
			contains: []string{"bytes plus headers) exceeds the server's 65536-byte max_payload"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			env := startEnvMaxPayload(t, 64<<10)
			pub := newTestPub(t, "tcp://127.0.0.1:*")
			h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, nil)
			pub.waitSubscribed()
			pub.sendFrames(tc.frames...)
			pub.send(1, payload("w", 0, 1)) // the bridge keeps going
			h.waitStats(15*time.Second, "dead letter and the valid FPM", func(s stats) bool {
				return s.Ranks[0].DeadLettered == 1 && s.Ranks[0].Published == 1
			})
			if fpms := messages(t, env.JS, streams.StreamFPM, ">"); len(fpms) != 1 || fpms[0].Headers().Get(streams.HeaderSeq) != "1" {
				t.Fatalf("stored FPMs %d, want the one valid message", len(fpms))
			}
			dls := messages(t, env.JS, streams.StreamEvents, streams.DeadLetterWildcard)
			if len(dls) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dls))
			}
			dl := dls[0]
			hd := dl.Headers()
			if dl.Subject() != "fpmevents.deadletter.dynamo.backend.0" {
				t.Fatalf("subject %q", dl.Subject())
			}
			if got := hd.Get(streams.HeaderErrorStage); got != tc.stage {
				t.Fatalf("stage %q, want %q (error %q)", got, tc.stage, hd.Get(streams.HeaderError))
			}
			for _, want := range tc.contains {
				if !strings.Contains(hd.Get(streams.HeaderError), want) {
					t.Fatalf("Fpm-Error %q does not contain %q", hd.Get(streams.HeaderError), want)
				}
			}
			if got := hd.Get(streams.HeaderSeq); got != tc.seq {
				t.Fatalf("Fpm-Seq %q, want %q", got, tc.seq)
			}
			var raw []byte
			sizes := make([]string, len(tc.frames))
			for i, f := range tc.frames {
				raw = append(raw, f...)
				sizes[i] = strconv.Itoa(len(f))
			}
			if got := hd.Get(streams.HeaderFrameSizes); got != strings.Join(sizes, ",") {
				t.Fatalf("frame sizes %q, want %q", got, strings.Join(sizes, ","))
			}
			if tc.truncated {
				if got := hd.Get(streams.HeaderOriginalSize); got != strconv.Itoa(len(raw)) {
					t.Fatalf("original size %q, want %d", got, len(raw))
				}
				if len(dl.Data()) == 0 || len(dl.Data()) >= len(raw) || int64(len(dl.Data())) > h.nc.MaxPayload() || !bytes.Equal(dl.Data(), raw[:len(dl.Data())]) {
					t.Fatalf("truncated body of %d bytes is not a prefix of the %d raw bytes within max_payload", len(dl.Data()), len(raw))
				}
			} else {
				if hd.Get(streams.HeaderOriginalSize) != "" || !bytes.Equal(dl.Data(), raw) {
					t.Fatalf("body %x, want the raw frames %x", dl.Data(), raw)
				}
			}
			for _, k := range []string{streams.HeaderMsgID, streams.HeaderEndpoint, streams.HeaderReceivedAt} {
				if hd.Get(k) == "" {
					t.Fatalf("header %s missing", k)
				}
			}
			if hd.Get(streams.HeaderDPRank) != "0" || !strings.HasPrefix(hd.Get(streams.HeaderMsgID), "deadletter:test-bridge:0:") {
				t.Fatalf("headers %v", hd)
			}
			s := h.b.Stats().Ranks[0]
			if s.Received != 2 || s.Invalid != 1 || s.Published != 1 || s.Dropped != 0 {
				t.Fatalf("stats %+v", s)
			}
			if got := counterValue(h.b.metrics.invalid.WithLabelValues("0", tc.stage)); got != 1 {
				t.Fatalf("invalid{stage=%s} = %v", tc.stage, got)
			}
		})
	}
}

func TestSeqMismatchIsStoredAndFlagged(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, nil)
	pub.waitSubscribed()
	pub.send(0, payload("w", 0, 0))
	pub.send(1, payload("w", 0, 77)) // counter_id 77 in the payload, 1 in the sequence frame
	pub.sendFrames([]byte("custom-topic"), seqFrame(2), payload("w", 0, 2))
	h.waitStats(10*time.Second, "3 published", func(s stats) bool { return s.Ranks[0].Published == 3 })
	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != 3 {
		t.Fatalf("stored %d", len(msgs))
	}
	if got := msgs[1].Headers().Get(streams.HeaderSeqMismatch); got != "77" || msgs[1].Headers().Get(streams.HeaderSeq) != "1" {
		t.Fatalf("mismatch header %q seq %q", got, msgs[1].Headers().Get(streams.HeaderSeq))
	}
	if msgs[0].Headers().Get(streams.HeaderSeqMismatch) != "" || msgs[2].Headers().Get(streams.HeaderSeqMismatch) != "" {
		t.Fatal("mismatch flagged on a matching message")
	}
	if got := msgs[2].Headers().Get(streams.HeaderTopic); got != "custom-topic" {
		t.Fatalf("topic header %q", got)
	}
	if s := h.b.Stats().Ranks[0]; s.SeqMismatches != 1 || s.Dropped != 0 {
		t.Fatalf("stats %+v", s)
	}
	if got := counterValue(h.b.metrics.seqMismatch.WithLabelValues("0")); got != 1 {
		t.Fatalf("seq mismatch metric %v", got)
	}
}

// A restarted publisher reuses its sequence numbers inside the duplicate window: both runs are stored.
// A busy FPM of the new run differs from the old run's at the same seq by its measurements; an idle
// heartbeat does not differ at all, and is told apart by the run's epoch in its id.
func TestPublisherRestartKeepsBothRuns(t *testing.T) {
	t.Parallel()
	const n = 1000
	busy := func(run int) func(uint64) []byte {
		return func(seq uint64) []byte {
			f := testFPM("w", 0, seq)
			f.WallTime += float64(run) * 0.001 // another run measures other forward passes
			return schemas.EncodeMsgpack(f)
		}
	}
	idle := func(int) func(uint64) []byte {
		return func(seq uint64) []byte {
			return schemas.EncodeMsgpack(&schemas.FPM{Version: 1, WorkerID: "w", CounterID: int64(seq)})
		}
	}
	for name, payloads := range map[string]func(run int) func(uint64) []byte{"busy FPMs": busy, "idle heartbeats": idle} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			pub := newTestPub(t, "tcp://127.0.0.1:*")
			h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, nil)
			pub.waitSubscribed()
			first := payloads(0)
			for seq := uint64(0); seq < n; seq++ {
				pub.send(seq, first(seq))
			}
			h.waitStats(15*time.Second, "first run published", func(s stats) bool { return s.Ranks[0].Published == n })

			// The worker restarts: its socket goes away, a new one binds the same port and counts from 0
			// again, well inside the duplicate window.
			url := pub.URL
			pub.Close()
			pub = newTestPub(t, url)
			pub.waitSubscribed()
			second := payloads(1)
			for seq := uint64(0); seq < n; seq++ {
				pub.send(seq, second(seq))
			}
			h.waitStats(15*time.Second, "second run published", func(s stats) bool { return s.Ranks[0].Published == 2*n })

			msgs := messages(t, env.JS, streams.StreamFPM, ">")
			if len(msgs) != 2*n {
				t.Fatalf("stored %d, want %d: the restart was deduplicated away", len(msgs), 2*n)
			}
			epochs := map[string]int{}
			var order []string
			for _, m := range msgs {
				e := m.Headers().Get(streams.HeaderEpoch)
				if epochs[e] == 0 {
					order = append(order, e)
				}
				epochs[e]++
			}
			if len(epochs) != 2 || epochs[order[0]] != n || epochs[order[1]] != n {
				t.Fatalf("epochs %v, want two of %d messages", epochs, n)
			}
			if order[0] >= order[1] && len(order[0]) == len(order[1]) {
				t.Fatalf("epochs not increasing: %v", order)
			}
			if s := h.b.Stats().Ranks[0]; s.Duplicates != 0 || s.Dropped != 0 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// sender publishes seq 0,1,2,... of one key at a fixed rate until stopped.
type sender struct {
	pub  *testPub
	quit chan struct{}
	done chan struct{}
	sent uint64
}

func startSender(pub *testPub, perTick int, every time.Duration) *sender {
	s := &sender{pub: pub, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
			for i := 0; i < perTick; i++ {
				s.pub.send(s.sent, payload("w", 0, s.sent))
				s.sent++
			}
		}
	}()
	return s
}

func (s *sender) stop() uint64 {
	close(s.quit)
	<-s.done
	return s.sent
}

func TestBrokerOutageDropsWithExactAccounting(t *testing.T) {
	t.Parallel()
	const maxBuffer = 500
	env := natsservertest.Start(t)
	addr, store := listenAddr(t, env.Server), env.StoreDir
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) {
		c.MaxBuffer = maxBuffer
		c.AckTimeout = time.Second
	})
	pub.waitSubscribed()

	snd := startSender(pub, 10, 5*time.Millisecond) // 2000 FPM/s
	var high int
	watch := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			s := h.b.Stats()
			high = max(high, s.Buffered)
			if s.Buffered > maxBuffer {
				t.Fatalf("buffer holds %d > MaxBuffer %d", s.Buffered, maxBuffer)
			}
		}
	}
	watch(time.Second)
	env.Stop() // the broker goes away
	watch(2500 * time.Millisecond)
	env2 := natsservertest.StartAt(t, addr, store)
	watch(1500 * time.Millisecond)
	sent := snd.stop()

	s := h.waitStats(30*time.Second, "every message accounted for", func(s stats) bool {
		r := s.Ranks[0]
		return r.Received == sent && r.Published+r.Dropped == sent && s.Buffered == 0 && s.InFlight == 0
	})
	r := s.Ranks[0]
	if r.Dropped == 0 {
		t.Fatalf("nothing dropped during a 2.5 s outage at 2000/s with a 500-message buffer: %s", fmtStats(s))
	}
	if s.BufferedHigh > maxBuffer || high > maxBuffer {
		t.Fatalf("buffer high-water mark %d (watched %d) above %d", s.BufferedHigh, high, maxBuffer)
	}
	stored := map[uint64]bool{}
	for _, m := range messages(t, env2.JS, streams.StreamFPM, ">") {
		seq := hdrUint(t, m, streams.HeaderSeq)
		if stored[seq] {
			t.Fatalf("seq %d stored twice", seq)
		}
		stored[seq] = true
	}
	if uint64(len(stored))+r.Dropped != sent {
		t.Fatalf("stored %d + dropped %d != sent %d", len(stored), r.Dropped, sent)
	}

	// The drop markers cover exactly the missing sequences.
	var markers []streams.DropMarker
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		markers = markers[:0]
		var covered uint64
		for _, m := range messages(t, env2.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
			var dm streams.DropMarker
			if err := jsonUnmarshal(m.Data(), &dm); err != nil {
				return err
			}
			if m.Headers().Get(streams.HeaderEventType) != streams.DropMarkerEvent || m.Subject() != streams.DropMarkerSubject(fpmKey("w", 0)) {
				return fmt.Errorf("marker subject %q headers %v", m.Subject(), m.Headers())
			}
			markers = append(markers, dm)
			covered += dm.Count
		}
		if covered != r.Dropped {
			return fmt.Errorf("markers cover %d of %d dropped", covered, r.Dropped)
		}
		return nil
	})
	dropped := map[uint64]bool{}
	for _, dm := range markers {
		if dm.Reason != reasonBufferFull || dm.Type != "drop_marker" || dm.Bridge != "test-bridge" || dm.Count != dm.LastSeq-dm.FirstSeq+1 ||
			dm.Key != (streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 0}) || dm.FirstReceivedAtMs > dm.LastReceivedAtMs {
			t.Fatalf("marker %+v", dm)
		}
		for seq := dm.FirstSeq; seq <= dm.LastSeq; seq++ {
			if dropped[seq] || stored[seq] {
				t.Fatalf("seq %d in a marker is also stored or in another marker", seq)
			}
			dropped[seq] = true
		}
	}
	for seq := uint64(0); seq < sent; seq++ {
		if !stored[seq] && !dropped[seq] {
			t.Fatalf("seq %d neither stored nor in a drop marker", seq)
		}
	}
	t.Logf("sent %d, stored %d, dropped %d in %d marker(s), duplicates %d, buffer high %d",
		sent, len(stored), r.Dropped, len(markers), r.Duplicates, s.BufferedHigh)
}

func TestGracefulStopPublishesTheBuffer(t *testing.T) {
	t.Parallel()
	const n = 300
	env := natsservertest.Start(t)
	addr, store := listenAddr(t, env.Server), env.StoreDir
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.StopTimeout = 20 * time.Second })
	pub.waitSubscribed()
	env.Stop() // hold everything in the buffer
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(10*time.Second, "all received and held", func(s stats) bool { return s.Ranks[0].Received == n })
	if s := h.b.Stats(); s.Ranks[0].Published != 0 {
		t.Fatalf("published with the broker down: %s", fmtStats(s))
	}
	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	time.Sleep(300 * time.Millisecond) // the stop has begun; the broker comes back during it
	env2 := natsservertest.StartAt(t, addr, store)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("stop did not finish")
	}
	s := h.b.Stats().Ranks[0]
	if s.Published != n || s.Dropped != 0 {
		t.Fatalf("after a graceful stop: %+v", s)
	}
	if got := len(messages(t, env2.JS, streams.StreamFPM, ">")); got != n {
		t.Fatalf("stored %d, want %d", got, n)
	}
}

func TestStopTimeoutReportsShutdownDrops(t *testing.T) {
	t.Parallel()
	const n = 50
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.StopTimeout = 500 * time.Millisecond })
	pub.waitSubscribed()
	env.Stop()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	pub.sendFrames([]byte("x")) // one dead letter, lost with the rest
	h.waitStats(10*time.Second, "all received", func(s stats) bool { return s.Ranks[0].Received == n+1 })
	start := time.Now()
	if err := h.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("stop took %v with a 500ms StopTimeout", took)
	}
	s := h.b.Stats().Ranks[0]
	if s.Dropped != n || s.Published != 0 || s.Invalid != 1 || s.DeadLettersLost != 1 {
		t.Fatalf("stats %+v", s)
	}
	if got := counterValue(h.b.metrics.dropped.WithLabelValues("0", reasonShutdown)); got != n {
		t.Fatalf("dropped{reason=shutdown} = %v", got)
	}
}

func TestRunTwiceAndNewErrors(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil conn: %v", err)
	}
	env := natsservertest.Start(t)
	if _, err := New(Config{}, env.NC); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("empty config: %v", err)
	}
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL}}, nil)
	if err := h.b.Run(context.Background()); !errors.Is(err, errAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Endpoints: []Endpoint{{URL: pub.URL}}, Registerer: reg}, env.NC); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Endpoints: []Endpoint{{URL: pub.URL}}, Registerer: reg}, env.NC); err == nil {
		t.Fatal("registering the same metrics twice must fail")
	}
}

func TestBadEndpointFailsRun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	nc := env.NC
	b, err := New(Config{Endpoints: []Endpoint{{URL: "bogus://nowhere"}}, Logger: testLogger()}, nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Run(ctx); err == nil || !strings.Contains(err.Error(), "bogus://nowhere") {
		t.Fatalf("Run with a bad endpoint: %v", err)
	}
}

func TestStopTimeoutPublishesShutdownMarkers(t *testing.T) {
	t.Parallel()
	const n, maxInFlight = 20000, 1
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	// One publish in flight at a time makes the backlog drain slowly; the stop gives it 1 ms.
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) {
		c.MaxInFlight = maxInFlight
		c.StopTimeout = time.Millisecond
	})
	pub.waitSubscribed()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(10*time.Second, "all received", func(s stats) bool { return s.Ranks[0].Received == n })
	if err := h.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	s := h.b.Stats()
	r := s.Ranks[0]
	if r.Dropped == 0 || r.Published+r.Dropped != n || s.MarkersPublished == 0 {
		t.Fatalf("stats %s", fmtStats(s))
	}
	stored := map[uint64]bool{}
	for _, m := range messages(t, env.JS, streams.StreamFPM, ">") {
		stored[hdrUint(t, m, streams.HeaderSeq)] = true
	}
	covered := map[uint64]bool{}
	for _, m := range messages(t, env.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
		var dm streams.DropMarker
		if err := jsonUnmarshal(m.Data(), &dm); err != nil {
			t.Fatal(err)
		}
		if dm.Reason != reasonShutdown || dm.RunStart != "" { // the bridge's first run of the publisher
			t.Fatalf("marker %+v", dm)
		}
		for seq := dm.FirstSeq; seq <= dm.LastSeq; seq++ {
			covered[seq] = true
		}
	}
	if uint64(len(covered)) != r.Dropped {
		t.Fatalf("markers cover %d sequences, %d dropped", len(covered), r.Dropped)
	}
	// A message in flight at the deadline is reported dropped but may have been stored: at most
	// MaxInFlight sequences may be both.
	both := 0
	for seq := uint64(0); seq < n; seq++ {
		switch {
		case stored[seq] && covered[seq]:
			both++
		case !stored[seq] && !covered[seq]:
			t.Fatalf("seq %d neither stored nor in a drop marker", seq)
		}
	}
	if both > maxInFlight {
		t.Fatalf("%d sequences both stored and reported dropped", both)
	}
	t.Logf("published %d, dropped %d (shutdown) in %d marker(s), %d both", r.Published, r.Dropped, s.MarkersPublished, both)
}

// A drop marker says how its run began (run_start): where it is all that is stored of a run, that is
// what tells the gap detector a run the bridge saw the publisher restart into from the run before
// going on. Here the worker restarts and the bridge, stopped with the new run's backlog unsent,
// publishes shutdown markers of it.
func TestDropMarkerCarriesItsRunsStart(t *testing.T) {
	t.Parallel()
	const n = 20000 // a backlog the 1 ms stop cannot publish, as TestStopTimeoutPublishesShutdownMarkers
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) {
		c.MaxInFlight = 1
		c.StopTimeout = time.Millisecond
	})
	pub.waitSubscribed()
	for seq := uint64(0); seq < 100; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(15*time.Second, "first run published", func(s stats) bool { return s.Ranks[0].Published == 100 })
	url := pub.URL
	pub.Close()
	pub = newTestPub(t, url)
	pub.waitSubscribed()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq+1_000_000))
	}
	h.waitStats(15*time.Second, "second run received", func(s stats) bool { return s.Ranks[0].Received == 100+n })
	if err := h.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if r := h.b.Stats().Ranks[0]; r.Dropped == 0 {
		t.Fatalf("nothing dropped at the stop: %+v", r)
	}
	second := ""
	for _, m := range messages(t, env.JS, streams.StreamFPM, ">") {
		if hdrUint(t, m, streams.HeaderSeq) == 0 && m.Headers().Get(streams.HeaderRunStart) != "" {
			second = m.Headers().Get(streams.HeaderEpoch)
		}
	}
	markers := 0
	for _, m := range messages(t, env.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
		dm, err := streams.ParseDropMarker(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if dm.RunStart != streams.RunStartRestart || strconv.FormatInt(dm.Epoch, 10) != second && second != "" {
			t.Fatalf("marker %+v of the restarted run (epoch %s): run_start %q, want %q", dm, second, dm.RunStart, streams.RunStartRestart)
		}
		markers++
	}
	if markers == 0 {
		t.Fatal("no drop marker stored")
	}
}
