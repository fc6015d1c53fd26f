package bridge

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// startEnvMaxPayload runs the embedded server with a max_payload of n bytes, fpmbus's streams applied.
func startEnvMaxPayload(t testing.TB, n int32) *natsservertest.Env {
	t.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), MaxPayload: n})
	if err != nil {
		t.Fatal(err)
	}
	env := &natsservertest.Env{Server: srv}
	t.Cleanup(env.Stop)
	if env.NC, err = nats.Connect(srv.ClientURL()); err != nil {
		t.Fatal(err)
	}
	if env.JS, err = jetstream.New(env.NC); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Apply(ctx, env.JS, streams.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	return env
}

// rawServer is a nats-server with settings natsserver.StartServer does not expose (a max_control_line,
// users with permissions). js is an unrestricted client on it.
type rawServer struct {
	url string
	js  jetstream.JetStream
}

const adminUser, adminPass = "admin", "admin-pass"

// startRawServer starts a JetStream server on loopback configured by configure; when configure adds
// users it must include adminUser, which the test's own client uses.
func startRawServer(t testing.TB, configure func(*server.Options)) rawServer {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true}
	configure(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	var copts []nats.Option
	if len(opts.Users) > 0 {
		copts = append(copts, nats.UserInfo(adminUser, adminPass))
	}
	nc, err := nats.Connect(ns.ClientURL(), copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Apply(ctx, js, streams.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	return rawServer{url: ns.ClientURL(), js: js}
}

// A frame over MaxPayload is refused by libzmq before it is read; libzmq then drops the connection
// and would never reconnect it. The bridge reconnects, counts the refusal on the rank and dead-letters
// it naming the limit; the other rank is untouched and the refused rank flows again.
func TestOversizedFrameIsRefusedUnread(t *testing.T) {
	t.Parallel()
	const maxPayload, refusals = 64 << 10, 3
	env := natsservertest.Start(t)
	pubs := []*testPub{newTestPub(t, "tcp://127.0.0.1:*"), newTestPub(t, "tcp://127.0.0.1:*")}
	reg := prometheus.NewRegistry()
	h := startBridge(t, env, []Endpoint{{URL: pubs[0].URL, DPRank: 0}, {URL: pubs[1].URL, DPRank: 1}}, func(c *Config) {
		c.MaxPayload = maxPayload
		c.Registerer = reg
	})
	for _, p := range pubs {
		p.waitSubscribed()
	}
	huge := bytes.Repeat([]byte{0x90}, 8<<20)
	var seq1 uint64
	for i := range refusals {
		pubs[0].send(uint64(i), huge)
		h.waitStats(15*time.Second, "a refused frame", func(s stats) bool { return s.Ranks[0].OversizedFrames == uint64(i+1) })
		pubs[1].send(seq1, payload("other", 1, seq1)) // rank 1 keeps flowing meanwhile
		seq1++
		pubs[0].waitSubscribed() // the bridge reconnected: its subscription arrives again
	}
	pubs[0].send(refusals, payload("w", 0, refusals))
	s := h.waitStats(15*time.Second, "rank 0 flowing again", func(s stats) bool {
		return s.Ranks[0].Published == 1 && s.Ranks[0].DeadLettered == refusals && s.Ranks[1].Published == seq1
	})
	r0 := s.Ranks[0]
	if r0.Received != r0.Published+r0.Dropped+r0.Invalid || r0.Invalid != refusals || r0.Dropped != 0 || s.Ranks[1].Invalid != 0 {
		t.Fatalf("stats %s", fmtStats(s))
	}
	if got := counterValue(h.b.metrics.oversized.WithLabelValues("0")); got != refusals {
		t.Fatalf("oversized{rank=0} = %v", got)
	}
	if got := counterValue(h.b.metrics.oversized.WithLabelValues("1")); got != 0 {
		t.Fatalf("oversized{rank=1} = %v", got)
	}
	dls := messages(t, env.JS, streams.StreamEvents, streams.DeadLetterWildcard)
	if len(dls) != refusals {
		t.Fatalf("%d dead letters, want %d", len(dls), refusals)
	}
	for _, dl := range dls {
		hd := dl.Headers()
		if dl.Subject() != "fpmevents.deadletter.dynamo.backend.0" || hd.Get(streams.HeaderErrorStage) != streams.StageSize ||
			hd.Get(streams.HeaderErrorLimit) != strconv.Itoa(maxPayload) || hd.Get(streams.HeaderErrorSize) != "" ||
			!strings.Contains(hd.Get(streams.HeaderError), "larger than the 65536-byte limit") ||
			hd.Get(streams.HeaderFrameSizes) != "" || len(dl.Data()) != 0 {
			t.Fatalf("dead letter %s %v body %d bytes", dl.Subject(), hd, len(dl.Data()))
		}
	}
}

// An FPM whose worker_id makes its subject too long for the server's max_control_line would make the
// server close the connection, and nats.go close it for good. The bridge dead-letters exactly that FPM
// (naming the subject's size and the room left), keeps the connection, and stores everything else,
// including a long worker_id that fits. The limit follows Config.MaxControlLine.
func TestWorkerIDTooLongForControlLine(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		serverLine, bridgeLine int // 0: the defaults
		long                   int // worker_id bytes that cannot fit
	}{
		"server default":    {long: 4100},
		"configured 1 KiB":  {serverLine: 1024, bridgeLine: 1024, long: 1000},
		"percent-encoded":   {long: 1400}, // '/' is encoded as %2F: 4200 bytes in the subject
		"just over the top": {long: defaultMaxControlLine - 100},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			srv := startRawServer(t, func(o *server.Options) {
				if tc.serverLine > 0 {
					o.MaxControlLine = int32(tc.serverLine)
				}
			})
			pub := newTestPub(t, "tcp://127.0.0.1:*")
			h := startBridgeAt(t, natsconn.ConnConfig{URL: srv.url}, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) {
				c.MaxControlLine = tc.bridgeLine
			})
			pub.waitSubscribed()
			long := strings.Repeat("w", tc.long)
			if name == "percent-encoded" {
				long = strings.Repeat("/", tc.long)
			}
			medium := strings.Repeat("m", 300)
			workers := []string{"a", long, medium, "b", long, "a"}
			for seq, w := range workers {
				pub.send(uint64(seq), payload(w, 0, uint64(seq)))
			}
			h.waitStats(15*time.Second, "every FPM stored or dead-lettered", func(s stats) bool {
				r := s.Ranks[0]
				return r.Received == uint64(len(workers)) && r.Published == 4 && r.DeadLettered == 2
			})
			if !h.nc.IsConnected() {
				t.Fatalf("connection %v: %v", h.nc.Status(), h.nc.LastError())
			}
			// Still publishing after the bad ones.
			pub.send(uint64(len(workers)), payload("a", 0, uint64(len(workers))))
			s := h.waitStats(15*time.Second, "the next FPM stored", func(s stats) bool { return s.Ranks[0].Published == 5 })
			if r := s.Ranks[0]; r.Dropped != 0 || r.Invalid != 2 {
				t.Fatalf("stats %s", fmtStats(s))
			}
			stored := messages(t, srv.js, streams.StreamFPM, ">")
			if len(stored) != 5 {
				t.Fatalf("%d FPMs stored, want 5", len(stored))
			}
			for _, m := range stored {
				if m.Headers().Get(streams.HeaderWorkerID) == long {
					t.Fatal("the FPM with the too-long worker_id was stored")
				}
			}
			key := fpmKey(long, 0)
			wantSize := strconv.Itoa(len(streams.DropMarkerSubject(key)))
			wantLimit := strconv.Itoa(h.b.maxSubject())
			dls := messages(t, srv.js, streams.StreamEvents, streams.DeadLetterWildcard)
			if len(dls) != 2 {
				t.Fatalf("%d dead letters, want 2", len(dls))
			}
			for i, dl := range dls {
				hd := dl.Headers()
				if hd.Get(streams.HeaderErrorStage) != streams.StageSize || hd.Get(streams.HeaderErrorSize) != wantSize || hd.Get(streams.HeaderErrorLimit) != wantLimit ||
					!strings.Contains(hd.Get(streams.HeaderError), "worker_id of "+strconv.Itoa(len(long))+" bytes") {
					t.Fatalf("dead letter %d headers %v, want size %s limit %s", i, hd, wantSize, wantLimit)
				}
				if want := []string{"1", "4"}[i]; hd.Get(streams.HeaderSeq) != want {
					t.Fatalf("dead letter %d is seq %s, want %s", i, hd.Get(streams.HeaderSeq), want)
				}
				if !bytes.Contains(dl.Data(), []byte(long)) {
					t.Fatal("the dead letter does not carry the raw payload")
				}
				for k, vs := range hd {
					if len(vs[0]) > maxHeaderValue {
						t.Fatalf("dead letter header %s has %d bytes", k, len(vs[0]))
					}
				}
			}
		})
	}
}

// An FPM that alone gets no ack (here the bridge's user may not publish on its subject: the server
// only reports a permissions violation) is retried maxRejects times while later FPMs are acknowledged,
// then dead-lettered: never retried forever, never counted as dropped, never a reason to stop.
func TestFPMFailingAloneIsDeadLettered(t *testing.T) {
	t.Parallel()
	const bridgeUser, bridgePass = "bridge", "bridge-pass"
	srv := startRawServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: adminUser, Password: adminPass},
			{Username: bridgeUser, Password: bridgePass, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"fpm.dynamo.backend.denied.>"}},
			}},
		}
	})
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	h := startBridgeAt(t, natsconn.ConnConfig{URL: srv.url, User: bridgeUser, Pass: bridgePass}, []Endpoint{{URL: pub.URL, DPRank: 0}},
		func(c *Config) { c.AckTimeout = 300 * time.Millisecond })
	pub.waitSubscribed()
	seq := uint64(0)
	send := func(w string) {
		pub.send(seq, payload(w, 0, seq))
		seq++
	}
	send("ok")
	send("denied")
	send("ok")
	deadline := time.Now().Add(30 * time.Second)
	for h.b.Stats().Ranks[0].DeadLettered < 1 && time.Now().Before(deadline) {
		send("ok") // traffic that proves the connection works
		time.Sleep(20 * time.Millisecond)
	}
	s := h.waitStats(15*time.Second, "every FPM resolved", func(s stats) bool {
		r := s.Ranks[0]
		return r.DeadLettered == 1 && r.Published == seq-1 && s.InFlight == 0
	})
	if r := s.Ranks[0]; r.Dropped != 0 || r.Invalid != 1 || r.Received != seq {
		t.Fatalf("stats %s", fmtStats(s))
	}
	if !h.nc.IsConnected() {
		t.Fatalf("connection %v", h.nc.Status())
	}
	dls := messages(t, srv.js, streams.StreamEvents, streams.DeadLetterWildcard)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters", len(dls))
	}
	hd := dls[0].Headers()
	if hd.Get(streams.HeaderErrorStage) != streams.StagePublish || hd.Get(streams.HeaderSeq) != "1" || hd.Get(streams.HeaderWorkerID) != "denied" ||
		!strings.Contains(hd.Get(streams.HeaderError), "timeout") || !bytes.Contains(dls[0].Data(), []byte(`"worker_id":"denied"`)) {
		t.Fatalf("dead letter %v %s", hd, dls[0].Data())
	}
	if got := counterValue(h.b.metrics.invalid.WithLabelValues("0", streams.StagePublish)); got != 1 {
		t.Fatalf("invalid{stage=publish} = %v", got)
	}
}

func TestBoundHeader(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		in        string
		truncated bool
	}{
		"short":           {in: "payload of 10 bytes"},
		"at the bound":    {in: strings.Repeat("x", maxHeaderValue)},
		"over the bound":  {in: strings.Repeat("x", 5000), truncated: true},
		"multibyte runes": {in: strings.Repeat("é", 3000), truncated: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := boundHeader(tc.in)
			if !tc.truncated {
				if got != tc.in {
					t.Fatalf("changed %q", got)
				}
				return
			}
			note := "...[truncated from " + strconv.Itoa(len(tc.in)) + " bytes]"
			if len(got) > maxHeaderValue || !strings.HasSuffix(got, note) || !strings.HasPrefix(tc.in, strings.TrimSuffix(got, note)) ||
				!utf8.ValidString(got) {
				t.Fatalf("bounded %d bytes: %q", len(got), got[max(0, len(got)-80):])
			}
		})
	}
}

// Dead letters built from hostile input stay publishable: every copied header is bounded, the body is
// cut to leave room for them, and the protocol line fits.
func TestDeadLetterFitsTheServer(t *testing.T) {
	t.Parallel()
	b := offlineBridge(1 << 20)
	b.pub.serverMax.Store(16 << 10)
	manyFrames := make([][]byte, 20000)
	for i := range manyFrames {
		manyFrames[i] = []byte{byte(i)}
	}
	tests := map[string][][]byte{
		"20000 frames":            manyFrames,
		"a 1 MiB payload":         {nil, seqFrame(1), bytes.Repeat([]byte{0xc1}, 1<<20)},
		"an FPM over max_payload": {nil, seqFrame(2), withExtraField(payload("w", 3, 2), 32<<10)},
		"a long worker_id":        {nil, seqFrame(3), payload(strings.Repeat("%", 2000), 3, 3)},
	}
	for name, frames := range tests {
		t.Run(name, func(t *testing.T) {
			now := time.Now()
			it := b.process(0, frames, now, now)
			if it.kind != kindDeadLetter {
				t.Fatalf("kind %v", it.kind)
			}
			if n := encodedSize(it.msg); int64(n) > b.serverMaxPayload() {
				t.Fatalf("dead letter of %d bytes over max_payload %d", n, b.serverMaxPayload())
			}
			if err := b.checkLine(it.msg); err != nil {
				t.Fatal(err)
			}
			for k, vs := range it.msg.Header {
				if len(vs[0]) > maxHeaderValue {
					t.Fatalf("header %s: %d bytes", k, len(vs[0]))
				}
			}
		})
	}
}

// keySubjectLen's fast bound never lets a subject through that is too long, whatever the worker_id.
func TestKeySubjectLen(t *testing.T) {
	t.Parallel()
	b := offlineBridge(1 << 20)
	for _, w := range []string{"", "w", strings.Repeat("w", 3900), strings.Repeat("w", 4000), strings.Repeat(".", 1300),
		strings.Repeat(".", 1400), strings.Repeat("é", 700)} {
		k := fpmKey(w, 1<<40)
		exact := len(streams.DropMarkerSubject(k))
		got := b.keySubjectLen(k)
		if got < exact || (got > b.maxSubject()) != (exact > b.maxSubject()) {
			t.Fatalf("worker_id of %d bytes: keySubjectLen %d, exact %d, room %d", len(w), got, exact, b.maxSubject())
		}
	}
}

// The size an item is charged with (its encoded headers and body plus itemOverhead) covers what it
// really holds on the heap, so MaxBufferBytes bounds memory, not just payload bytes.
func TestChargedSizeCoversItemMemory(t *testing.T) {
	const n = 20000
	tests := map[string][]byte{
		"a typical FPM":          payload("worker-a", 3, 0),
		"a 300-byte worker_id":   payload(strings.Repeat("w", 300), 3, 0),
		"a dead letter":          {0xc1, 0x00, 0x01},
		"an FPM with 4 KiB more": withExtraField(payload("w", 3, 0), 4<<10),
	}
	for name, pl := range tests {
		t.Run(name, func(t *testing.T) {
			b := offlineBridge(1 << 20)
			items := make([]*item, 0, n)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var charged int64
			now := time.Now()
			for seq := range uint64(n) {
				it := b.process(0, [][]byte{nil, seqFrame(seq), pl}, now, now)
				charged += it.size
				items = append(items, it)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := int64(after.HeapAlloc) - int64(before.HeapAlloc) - int64(cap(items))*8
			t.Logf("%s: %d B/item on the heap, %d B/item charged", name, held/n, charged/n)
			if held > charged {
				t.Fatalf("items hold %d bytes on the heap but are charged %d", held, charged)
			}
			runtime.KeepAlive(items)
		})
	}
}

// An FPM the client or server refuses for good becomes a dead letter carrying its JSON and identity,
// counted as invalid (never as dropped: it was not stored), of stage size when it was too large.
func TestRejectedFPMBecomesADeadLetter(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		cause error
		stage string
		size  bool // Fpm-Error-Size and Fpm-Error-Limit set
	}{
		"over max_payload":   {cause: nats.ErrMaxPayload, stage: streams.StageSize, size: true},
		"subject too long":   {cause: errSubjectTooLong, stage: streams.StageSize, size: true},
		"refused by server":  {cause: &jetstream.APIError{Code: 400, ErrorCode: 10054, Description: "message size exceeds maximum allowed"}, stage: streams.StagePublish},
		"no ack, later acks": {cause: jetstream.ErrAsyncPublishTimeout, stage: streams.StagePublish},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := offlineBridge(1 << 20)
			now := time.Now()
			fpm := b.process(0, [][]byte{nil, seqFrame(42), payload("w", 3, 42)}, now, now)
			if fpm.kind != kindFPM {
				t.Fatal("not an FPM")
			}
			b.pub.reject(fpm, tc.cause)
			if len(b.pub.dlq) != 1 {
				t.Fatalf("%d dead letters queued", len(b.pub.dlq))
			}
			dl := b.pub.dlq[0]
			h := dl.msg.Header
			if dl.kind != kindDeadLetter || dl.size != fpm.size || h.Get(streams.HeaderErrorStage) != tc.stage ||
				h.Get(streams.HeaderSeq) != "42" || h.Get(streams.HeaderWorkerID) != "w" || h.Get(streams.HeaderEpoch) != strconv.FormatInt(fpm.epoch, 10) ||
				!strings.Contains(h.Get(streams.HeaderError), tc.cause.Error()) || !bytes.Equal(dl.msg.Data, fpm.msg.Data) ||
				dl.msg.Subject != "fpmevents.deadletter.dynamo.backend.3" {
				t.Fatalf("dead letter %s %v %s", dl.msg.Subject, h, dl.msg.Data)
			}
			if (h.Get(streams.HeaderErrorSize) != "" && h.Get(streams.HeaderErrorLimit) != "") != tc.size {
				t.Fatalf("size headers %v", h)
			}
			s := b.ranks[0].snapshot()
			if s.Invalid != 1 || s.Dropped != 0 || counterValue(b.metrics.invalid.WithLabelValues("3", tc.stage)) != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// Answers in which the stream did not decide on the publish are retried like an outage, never counted
// towards giving the FPM up; refusals of the message itself are.
func TestUndecidedAnswers(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		err  jetstream.APIError
		want bool
	}{
		"same id being stored by another publish": {jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}, true},
		"replica is not the leader":               {jetstream.APIError{Code: 500, ErrorCode: 10009, Description: "JetStream cluster can not handle request"}, true},
		"message over the stream's maximum":       {jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, false},
		"wrong last sequence":                     {jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		"stream not found":                        {jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}, false},
	}
	for name, tc := range tests {
		if got := undecided(&tc.err); got != tc.want {
			t.Errorf("%s: undecided = %v, want %v", name, got, tc.want)
		}
	}
}
