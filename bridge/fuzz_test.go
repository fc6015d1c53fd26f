package bridge

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// FuzzParseFrames feeds parseFrames multiparts of 0 to 4 frames built from three fuzzed frames and
// checks its contract: a valid triple yields the big-endian sequence and the payload frame; anything
// else is a *frameError wrapping errBadFrames whose sizes describe the input. The seed corpus in
// testdata/fuzz/FuzzParseFrames holds a real publisher's multipart and the malformed shapes.
func FuzzParseFrames(f *testing.F) {
	f.Add([]byte{}, seqFrame(0), payload("w", 0, 0), uint8(3))
	f.Add([]byte("topic"), seqFrame(1<<40), []byte{0x80}, uint8(3))
	f.Add([]byte{}, seqFrame(7)[:7], payload("w", 0, 7), uint8(3))
	f.Add([]byte{}, seqFrame(7), []byte{}, uint8(2))
	f.Add([]byte{}, seqFrame(7), payload("w", 0, 7), uint8(4))
	f.Fuzz(func(t *testing.T, topic, seq, pl []byte, n uint8) {
		all := [][]byte{topic, seq, pl, pl}
		frames := all[:int(n)%5]
		gotSeq, gotPayload, err := parseFrames(frames)
		valid := len(frames) == 3 && len(seq) == 8
		if valid {
			if err != nil {
				t.Fatalf("valid multipart rejected: %v", err)
			}
			if gotSeq != binary.BigEndian.Uint64(seq) || !bytes.Equal(gotPayload, pl) {
				t.Fatalf("got seq %d payload %x", gotSeq, gotPayload)
			}
			return
		}
		var fe *frameError
		if !errors.Is(err, errBadFrames) || !errors.As(err, &fe) {
			t.Fatalf("malformed multipart (%d frames) gave %v", len(frames), err)
		}
		if fe.Frames != len(frames) || !reflect.DeepEqual(fe.Sizes, frameSizes(frames)) || fe.Reason == "" {
			t.Fatalf("FrameError %+v does not describe %d frames", fe, len(frames))
		}
		if gotPayload != nil || gotSeq != 0 {
			t.Fatal("a malformed multipart returned a sequence or payload")
		}
	})
}

// offlineBridge is a Bridge with no sockets and no connection, enough to run process.
func offlineBridge(maxPayload int) *Bridge {
	cfg := Config{Endpoints: []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 3}}, MaxPayload: maxPayload, BridgeID: "fuzz", Logger: testLogger()}.withDefaults()
	b := &Bridge{cfg: cfg, log: cfg.Logger, endpoints: cfg.Endpoints, buf: newBuffer(10, 1<<20), epochs: newEpochs(),
		rankWarned: make([]atomic.Bool, 1), decoders: make([]schemas.Decoder, 1), sessions: make([]atomic.Uint64, 1),
		lineReserve: lineReserve(nil), keyRoom: keyRoomFor(cfg.Namespace, cfg.Component)}
	b.pub = newPublisher(b)
	b.metrics = newMetrics(func() float64 { return 0 }, func() float64 { return 0 }, func() float64 { return 0 })
	b.ranks = []*rankCounters{{m: b.metrics.forRank(3)}}
	return b
}

// FuzzProcess runs arbitrary multiparts through the bridge's receive path (parse, size check, decode,
// message building) and checks that each becomes exactly one message: an FPM whose body is the
// payload's canonical JSON, or a dead letter whose body is the raw frames and whose stage and error
// agree with parseFrames and DecodeFPM. Every input also goes through a bridge facing tight server
// limits (a 512-byte max_control_line, a 4 KiB max_payload), which must never produce a message the
// server would refuse: an FPM whose subjects are too long or whose headers plus body are too large is a
// dead letter of stage size naming its size and the limit, and every dead letter fits with its copied
// headers bounded. The seed corpus in testdata/fuzz/FuzzProcess holds such worker_ids and payloads.
func FuzzProcess(f *testing.F) {
	f.Add([]byte{}, seqFrame(0), payload("w", 3, 0), uint8(3))
	f.Add([]byte{}, seqFrame(5), payload("w", 3, 9), uint8(3))
	f.Add([]byte("t"), seqFrame(1), []byte{0x93, 1, 2, 3}, uint8(3))
	f.Add([]byte{}, seqFrame(1), []byte{0xc1}, uint8(3))
	f.Add([]byte{}, seqFrame(1)[:7], payload("w", 3, 1), uint8(3))
	f.Add([]byte{}, seqFrame(1), payload("w", 3, 1), uint8(2))
	b := offlineBridge(512)
	tight := offlineBridge(64 << 10)
	tight.cfg.MaxControlLine = 512
	tight.pub.serverMax.Store(4 << 10)
	f.Fuzz(func(t *testing.T, topic, seq, pl []byte, n uint8) {
		frames := [][]byte{topic, seq, pl, pl}[:int(n)%5]
		checkTightLimits(t, tight, frames)
		var raw []byte
		for _, fr := range frames {
			raw = append(raw, fr...)
		}
		now := time.Now()
		it := b.process(0, frames, now, now)
		gotSeq, gotPayload, perr := parseFrames(frames)
		if it.kind == kindDeadLetter {
			if !bytes.Equal(it.msg.Data, raw) {
				t.Fatalf("dead letter body %x, want the raw frames %x", it.msg.Data, raw)
			}
			stage := it.msg.Header.Get(streams.HeaderErrorStage)
			switch {
			case perr != nil:
				if stage != streams.StageFrames {
					t.Fatalf("stage %q for %v", stage, perr)
				}
			case len(gotPayload) > 512:
				if stage != streams.StageSize {
					t.Fatalf("stage %q for a %d-byte payload", stage, len(gotPayload))
				}
			default:
				_, derr := schemas.DecodeFPM(gotPayload)
				if derr == nil || it.msg.Header.Get(streams.HeaderError) != boundHeader(streams.ErrorHeaderValue(derr.Error())) {
					t.Fatalf("dead letter %q for a payload that decodes with %v", it.msg.Header.Get(streams.HeaderError), derr)
				}
			}
			return
		}
		if perr != nil || len(gotPayload) > 512 {
			t.Fatalf("stored an FPM from bad frames (%v)", perr)
		}
		want, err := schemas.DecodeFPM(gotPayload)
		if err != nil || !bytes.Equal(it.msg.Data, want.JSON) {
			t.Fatalf("FPM body %s, want %s (%v)", it.msg.Data, want.JSON, err)
		}
		if it.msg.Header.Get(streams.HeaderSeq) != strconv.FormatUint(gotSeq, 10) || it.msg.Subject != streams.FPMSubject(it.key) {
			t.Fatalf("headers %v subject %q", it.msg.Header, it.msg.Subject)
		}
		if (want.CounterID < 0 || uint64(want.CounterID) != gotSeq) != (it.msg.Header.Get(streams.HeaderSeqMismatch) != "") {
			t.Fatalf("seq mismatch flag wrong: counter %d seq %d headers %v", want.CounterID, gotSeq, it.msg.Header)
		}
	})
}

// checkTightLimits processes frames on b (tight server limits) and checks the message fits them, and
// that an FPM given up for its size says why.
func checkTightLimits(t *testing.T, b *Bridge, frames [][]byte) {
	t.Helper()
	now := time.Now()
	it := b.process(0, frames, now, now)
	if err := b.checkLine(it.msg); err != nil {
		t.Fatalf("subject of %d bytes: %v", len(it.msg.Subject), err)
	}
	if size := encodedSize(it.msg); int64(size) > b.serverMaxPayload() {
		t.Fatalf("a %d-byte message for a %d-byte max_payload", size, b.serverMaxPayload())
	}
	_, pl, perr := parseFrames(frames)
	if perr != nil || len(pl) > b.cfg.MaxPayload {
		return
	}
	f, derr := schemas.DecodeFPM(pl)
	if derr != nil {
		return
	}
	key := streams.Key{Namespace: b.cfg.Namespace, Component: b.cfg.Component, WorkerID: f.WorkerID, DPRank: int(f.DPRank)}
	subject := len(streams.DropMarkerSubject(key))
	h := it.msg.Header
	switch {
	case subject > b.maxSubject():
		if it.kind != kindDeadLetter || h.Get(streams.HeaderErrorStage) != streams.StageSize ||
			h.Get(streams.HeaderErrorSize) != strconv.Itoa(subject) || h.Get(streams.HeaderErrorLimit) != strconv.Itoa(b.maxSubject()) {
			t.Fatalf("worker_id of %d bytes (%d-byte subject, room %d): kind %v headers %v", len(f.WorkerID), subject, b.maxSubject(), it.kind, h)
		}
	case it.kind == kindDeadLetter:
		size, err := strconv.ParseInt(h.Get(streams.HeaderErrorSize), 10, 64)
		if h.Get(streams.HeaderErrorStage) != streams.StageSize || err != nil || size <= b.serverMaxPayload() ||
			h.Get(streams.HeaderErrorLimit) != strconv.FormatInt(b.serverMaxPayload(), 10) {
			t.Fatalf("a valid FPM with a %d-byte subject dead-lettered: %v", subject, h)
		}
	}
	if it.kind == kindDeadLetter {
		for k, vs := range h {
			if len(vs[0]) > maxHeaderValue {
				t.Fatalf("dead letter header %s of %d bytes", k, len(vs[0]))
			}
		}
	}
}
