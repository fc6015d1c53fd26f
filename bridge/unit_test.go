package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

func TestParseFrames(t *testing.T) {
	t.Parallel()
	payload := []byte{0x80}
	tests := map[string]struct {
		frames  [][]byte
		seq     uint64
		reason  string // "" = valid
		nFrames int
		sizes   []int
	}{
		"dynamo multipart with an empty topic": {frames: [][]byte{nil, seqFrame(42), payload}, seq: 42},
		"a topic is accepted":                  {frames: [][]byte{[]byte("fpm"), seqFrame(7), payload}, seq: 7},
		"largest sequence":                     {frames: [][]byte{nil, seqFrame(^uint64(0)), payload}, seq: ^uint64(0)},
		"empty payload parses (decode rejects it)": {
			frames: [][]byte{nil, seqFrame(1), {}}, seq: 1,
		},
		"no frames": {frames: nil, reason: "got 0 frames, want 3 (topic, sequence, payload)", sizes: []int{}},
		"one frame": {frames: [][]byte{payload}, reason: "got 1 frames, want 3 (topic, sequence, payload)", nFrames: 1, sizes: []int{1}},
		"two frames": {
			frames: [][]byte{nil, seqFrame(1)}, reason: "got 2 frames, want 3 (topic, sequence, payload)", nFrames: 2, sizes: []int{0, 8},
		},
		"four frames": {
			frames: [][]byte{nil, seqFrame(1), payload, payload}, reason: "got 4 frames, want 3 (topic, sequence, payload)",
			nFrames: 4, sizes: []int{0, 8, 1, 1},
		},
		"seven-byte sequence": {
			frames: [][]byte{nil, make([]byte, 7), payload}, reason: "sequence frame is 7 bytes, want 8", nFrames: 3, sizes: []int{0, 7, 1},
		},
		"nine-byte sequence": {
			frames: [][]byte{nil, make([]byte, 9), payload}, reason: "sequence frame is 9 bytes, want 8", nFrames: 3, sizes: []int{0, 9, 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			seq, p, err := parseFrames(tc.frames)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				if seq != tc.seq || !bytes.Equal(p, tc.frames[2]) {
					t.Fatalf("got seq %d payload %x", seq, p)
				}
				return
			}
			if !errors.Is(err, errBadFrames) {
				t.Fatalf("error %v does not match ErrBadFrames", err)
			}
			var fe *frameError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not a *FrameError", err)
			}
			if fe.Reason != tc.reason || fe.Frames != tc.nFrames || !reflect.DeepEqual(fe.Sizes, tc.sizes) {
				t.Fatalf("got %+v, want reason %q frames %d sizes %v", fe, tc.reason, tc.nFrames, tc.sizes)
			}
			if want := "bridge: malformed multipart: " + tc.reason; err.Error() != want {
				t.Fatalf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}

func TestCheckEphemeralPorts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	linux := write("linux", "32768\t60999\n")
	low := write("low", "20000 30000\n")
	edge := write("edge", "20384\t60999\n")
	tests := map[string]struct {
		base, dpSize int
		path         string
		want         string
	}{
		"default port below the usual range": {base: 20380, dpSize: 4, path: linux},
		"port inside the range, dp_size 1": {base: 40000, dpSize: 1, path: linux,
			want: "FPM ports 40000-40000 overlap this host's ephemeral port range 32768-60999; an outbound connection can take one of them first and the publisher bind then fails intermittently. Set DYN_FORWARDPASS_METRIC_PORT to a base below 32768."},
		"dp_size 1 is the base port alone": {base: 20383, dpSize: 1, path: edge},
		"dp_size 0 is the base port alone": {base: 20383, dpSize: 0, path: edge},
		"dp_size 4 reaches base+4 (the synchronizer port)": {base: 20380, dpSize: 4, path: edge,
			want: "FPM ports 20380-20384 overlap this host's ephemeral port range 20384-60999; an outbound connection can take one of them first and the publisher bind then fails intermittently. Set DYN_FORWARDPASS_METRIC_PORT to a base below 20384."},
		"dp_size 3 stops short of the range": {base: 20380, dpSize: 3, path: edge},
		"default port inside a low range": {base: 20380, dpSize: 2, path: low,
			want: "FPM ports 20380-20382 overlap this host's ephemeral port range 20000-30000; an outbound connection can take one of them first and the publisher bind then fails intermittently. Set DYN_FORWARDPASS_METRIC_PORT to a base below 20000."},
		"block above the range":       {base: 61000, dpSize: 8, path: linux},
		"unreadable file is silent":   {base: 40000, dpSize: 1, path: filepath.Join(dir, "missing")},
		"garbage file is silent":      {base: 40000, dpSize: 1, path: write("garbage", "not numbers\n")},
		"three fields is silent":      {base: 40000, dpSize: 1, path: write("three", "1 2 3\n")},
		"inverted range is silent":    {base: 40000, dpSize: 1, path: write("inverted", "60999 32768\n")},
		"empty file is silent":        {base: 40000, dpSize: 1, path: write("empty", "")},
		"a directory is silent":       {base: 40000, dpSize: 1, path: dir},
		"range of one port, overlaps": {base: 5000, dpSize: 1, path: write("one", "5000 5000"), want: "FPM ports 5000-5000 overlap this host's ephemeral port range 5000-5000; an outbound connection can take one of them first and the publisher bind then fails intermittently. Set DYN_FORWARDPASS_METRIC_PORT to a base below 5000."},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := checkEphemeralPorts(tc.base, tc.dpSize, tc.path); got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := endpointsFor("127.0.0.1", 20380, 2)
	tests := map[string]struct {
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		"defaults are valid":        {cfg: Config{Endpoints: ok}},
		"no endpoints":              {cfg: Config{}, want: "no ZMQ endpoints"},
		"endpoint without a scheme": {cfg: Config{Endpoints: []Endpoint{{URL: "127.0.0.1:20380"}}}, want: "is not a ZMQ endpoint"},
		"negative rank":             {cfg: Config{Endpoints: []Endpoint{{URL: "tcp://a:1", DPRank: -1}}}, want: "negative"},
		"duplicate url":             {cfg: Config{Endpoints: []Endpoint{{URL: "tcp://a:1"}, {URL: "tcp://a:1", DPRank: 1}}}, want: "listed twice"},
		"duplicate rank":            {cfg: Config{Endpoints: []Endpoint{{URL: "tcp://a:1"}, {URL: "tcp://a:2"}}}, want: "two endpoints"},
		"negative buffer":           {cfg: Config{Endpoints: ok, MaxBuffer: -1}, want: "max buffer"},
		"negative payload":          {cfg: Config{Endpoints: ok, MaxPayload: -1}, want: "max payload"},
		"negative in flight":        {cfg: Config{Endpoints: ok, MaxInFlight: -5}, want: "max in flight"},
		"negative stop timeout":     {cfg: Config{Endpoints: ok, StopTimeout: -time.Second}, want: "stop timeout"},
		"bad base port":             {cfg: Config{Endpoints: ok, BasePort: 70000}, want: "base port"},
		"bad streams": {cfg: Config{Endpoints: ok, Streams: func() streams.Config {
			c := streams.DefaultConfig()
			c.Replicas = 9
			return c
		}()}, want: "replicas"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidConfig containing %q", err, tc.want)
			}
		})
	}
}

func TestEndpointsFor(t *testing.T) {
	t.Parallel()
	got := endpointsFor("10.0.0.5", 20380, 3)
	want := []Endpoint{{"tcp://10.0.0.5:20380", 0}, {"tcp://10.0.0.5:20381", 1}, {"tcp://10.0.0.5:20382", 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
	if got := endpointsFor("::1", 20380, 0); len(got) != 1 || got[0].URL != "tcp://[::1]:20380" {
		t.Fatalf("ipv6/dp_size 0: got %v", got)
	}
}

func TestEpochs(t *testing.T) {
	t.Parallel()
	e := newEpochs()
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 0}
	steps := []struct {
		seq      uint64
		now      int64
		session  uint64
		epoch    int64
		newEpoch bool
		kind     runKind
	}{
		{seq: 5, now: 1000, session: 1<<32 | 1, epoch: 1000, newEpoch: true, kind: runStart}, // first message seen: a new run
		{seq: 6, now: 1001, session: 1<<32 | 1, epoch: 1000},
		{seq: 9, now: 1002, session: 1<<32 | 1, epoch: 1000},                                      // a gap is not a restart
		{seq: 0, now: 1002, session: 1<<32 | 1, epoch: 1002, newEpoch: true, kind: runRestart},    // restart
		{seq: 0, now: 1002, session: 1<<32 | 1, epoch: 1003, newEpoch: true, kind: runRestart},    // restart in the same ms: still strictly increasing
		{seq: 1, now: 900, session: 1<<32 | 1, epoch: 1003},                                       // clock went back: the epoch does not
		{seq: 1, now: 900, session: 1<<32 | 1, epoch: 1004, newEpoch: true, kind: runRestart},     // a repeated sequence is a restart too
		{seq: 40, now: 1100, session: 2<<32 | 2, epoch: 1100, newEpoch: true, kind: runReconnect}, // a new connection, further on: perhaps a new run
		{seq: 41, now: 1101, session: 2<<32 | 2, epoch: 1100},
		{seq: 42, now: 1102, session: 2<<32 | 3, epoch: 1102, newEpoch: true, kind: runResume},    // after a stall, on the same connection
		{seq: 44, now: 1103, session: 2<<32 | 5, epoch: 1103, newEpoch: true, kind: runResume},    // two stalls in between
		{seq: 45, now: 1104, session: 4<<32 | 6, epoch: 1104, newEpoch: true, kind: runReconnect}, // a stall and a reconnect in between: a reconnect
		{seq: 3, now: 1200, session: 5<<32 | 7, epoch: 1200, newEpoch: true, kind: runRestart},    // a new connection, back: a restart
	}
	d := streams.PayloadDigest([]byte("d"))
	var prev *run
	for i, s := range steps {
		r, isNew := e.observe(k, s.seq, s.now, d, 0, s.session)
		epoch := r.local
		if epoch != s.epoch || isNew != s.newEpoch || (isNew && r.kind != s.kind) {
			t.Fatalf("step %d (seq %d at %d, session %d): got epoch %d new %v kind %v, want %d %v %v", i, s.seq, s.now, s.session, epoch, isNew, r.kind, s.epoch, s.newEpoch, s.kind)
		}
		if isNew && prev != nil && (!prev.ended || r.prev != prev) {
			t.Fatalf("step %d: the run before is not ended and linked: %+v", i, r)
		}
		prev = r
	}
	if at, ok := e.received(prev, 3, d); !ok || at != 1200 {
		t.Fatalf("the run keeps its first message: %d %v", at, ok)
	}
	if _, ok := e.received(prev, 4, d); ok {
		t.Fatal("the run keeps a message it never received")
	}
	other := k
	other.DPRank = 1
	if r, isNew := e.observe(other, 3, 2000, d, 0, 5<<32|7); r.local != 2000 || !isNew || r.kind != runStart {
		t.Fatalf("a second key has its own epoch: got %d %v", r.local, isNew)
	}
	// The cached strings agree with streams.
	odd := streams.Key{Namespace: "a.b", Component: "c d", WorkerID: "", DPRank: 12}
	r, _ := e.observe(odd, 0, 5000, d, 0, 1)
	if r.subject != streams.FPMSubject(odd) || r.rankStr != "12" || r.local != 5000 || r.kind != runStart {
		t.Fatalf("run %+v", r)
	}
	if r2, _ := e.observe(odd, 0, 5000, d, 0, 1); r2.kind != runRestart || r2.prev != r || r2.firstSeq != 0 {
		t.Fatalf("restarted run %+v", r2)
	}
	// The same key from another endpoint: a connection of its own.
	if r3, _ := e.observe(odd, 1, 5001, d, 1, 1); r3.kind != runReconnect {
		t.Fatalf("the key from another endpoint: %+v", r3)
	}
	// A run keeps its first runFirst messages and its last runRecent.
	long := streams.Key{Namespace: "n", Component: "c", WorkerID: "long", DPRank: 0}
	var lr *run
	n := uint64(runFirst + 3*runRecent)
	for q := range n {
		lr, _ = e.observe(long, q, 7000+int64(q), streams.PayloadDigest([]byte(fmt.Sprint(q))), 0, 1)
	}
	for q, want := range map[uint64]bool{0: true, runFirst - 1: true, runFirst: false, n - runRecent - 1: false, n - runRecent: true, n - 1: true} {
		if _, ok := e.received(lr, q, streams.PayloadDigest([]byte(fmt.Sprint(q)))); ok != want {
			t.Errorf("message %d kept: %v, want %v", q, ok, want)
		}
	}
}

func TestBufferDropRanges(t *testing.T) {
	t.Parallel()
	k1 := streams.Key{Namespace: "n", Component: "c", WorkerID: "w", DPRank: 0}
	k2 := k1
	k2.DPRank = 1
	mk := func(k streams.Key, epoch int64, seq uint64) *item {
		return &item{kind: kindFPM, key: k, epoch: epoch, seq: seq, recvMs: int64(seq), size: 10}
	}
	b := newBuffer(2, 1<<20)
	for _, it := range []*item{mk(k1, 1, 0), mk(k1, 1, 1)} {
		if !b.push(it) {
			t.Fatal("rejected while not full")
		}
	}
	// Full: 2,3,4 of k1 dropped (one range), 7 of k2, 5 of k1 (contiguous), 9 of k1 (not: closes 2..5).
	for _, it := range []*item{mk(k1, 1, 2), mk(k1, 1, 3), mk(k1, 1, 4), mk(k2, 1, 7), mk(k1, 1, 5), mk(k1, 1, 9)} {
		if b.push(it) {
			t.Fatalf("accepted seq %d into a full buffer", it.seq)
		}
	}
	if got := b.len(); got != 2 {
		t.Fatalf("len %d", got)
	}
	closed := b.takeMarkers()
	if len(closed) != 1 || closed[0].first != 2 || closed[0].last != 5 || closed[0].count != 4 || closed[0].reason != reasonBufferFull {
		t.Fatalf("closed ranges %+v", closed)
	}
	if closed[0].firstRecvMs != 2 || closed[0].lastRecvMs != 5 {
		t.Fatalf("receive times %+v", closed[0])
	}
	// Room again: k1's next accepted message closes its open range (9..9); k2's stays open.
	b.pop(nil, 1)
	if !b.push(mk(k1, 1, 10)) {
		t.Fatal("rejected with room")
	}
	closed = b.takeMarkers()
	if len(closed) != 1 || closed[0].first != 9 || closed[0].last != 9 || closed[0].key != k1 {
		t.Fatalf("closed ranges %+v", closed)
	}
	// A new epoch is never contiguous with the old one.
	b.recordDrop(mk(k2, 2, 8), reasonShutdown)
	closed = b.takeMarkers()
	if len(closed) != 1 || closed[0].key != k2 || closed[0].first != 7 || closed[0].epoch != 1 {
		t.Fatalf("closed ranges %+v", closed)
	}
	b.closeIdle(time.Now(), true)
	closed = b.takeMarkers()
	if len(closed) != 1 || closed[0].epoch != 2 || closed[0].reason != reasonShutdown {
		t.Fatalf("closed ranges %+v", closed)
	}
	if b.high.Load() != 2 {
		t.Fatalf("high-water mark %d", b.high.Load())
	}
}

func TestBufferBytesBound(t *testing.T) {
	t.Parallel()
	b := newBuffer(100, 25)
	big := func(seq uint64) *item { return &item{kind: kindDeadLetter, seq: seq, size: 20} }
	if !b.push(big(0)) {
		t.Fatal("an item larger than the byte bound is accepted into an empty buffer")
	}
	if b.push(big(1)) {
		t.Fatal("accepted past the byte bound")
	}
	got := b.pop(nil, 10)
	if len(got) != 1 || b.bytes != 0 {
		t.Fatalf("pop %d items, %d bytes left", len(got), b.bytes)
	}
}

func TestBufferRingGrowsInOrder(t *testing.T) {
	t.Parallel()
	b := newBuffer(5000, 1<<30)
	var next uint64
	for round := 0; round < 5; round++ {
		for i := 0; i < 1500; i++ {
			if !b.push(&item{kind: kindDeadLetter, seq: next}) {
				t.Fatal("rejected")
			}
			next++
		}
		got := b.pop(nil, 1000)
		for i, it := range got {
			if i > 0 && it.order != got[i-1].order+1 {
				t.Fatal("out of order")
			}
		}
	}
	if b.len() != 5*500 {
		t.Fatalf("len %d", b.len())
	}
}
