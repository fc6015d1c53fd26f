package tracefile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// FuzzReadSegment reads arbitrary bytes as a segment: it must never panic, and it either delivers
// lines or returns a *CorruptError whose offset is inside the file; Repair then leaves a segment that
// reads cleanly with exactly the lines before the offset. Seeds: the writer's own output (added here)
// plus testdata/fuzz/FuzzReadSegment.
func FuzzReadSegment(f *testing.F) {
	f.Add(append(member(f, "{\"a\":1}\n"), member(f, "{\"b\":2}\n{\"c\":3}\n")...))
	f.Add(member(f, "no newline"))
	f.Add([]byte{})
	f.Add([]byte{0x1f, 0x8b})
	dir := f.TempDir()
	// Small members keep decompression bombs fast; the limit's error path is fuzzed too.
	defer func(n int) { maxMemberBytes = n }(maxMemberBytes)
	maxMemberBytes = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "t.w.000000.jsonl.gz")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var before int
		err := ReadSegment(path, func(l []byte) error { before++; return nil })
		var ce *CorruptError
		if err != nil {
			if !errors.As(err, &ce) {
				t.Fatalf("error is not a *CorruptError: %v", err)
			}
			if ce.Offset < 0 || ce.Offset > int64(len(data)) || ce.Segment != path {
				t.Fatalf("bad CorruptError %+v for %d bytes", ce, len(data))
			}
		}
		res, rerr := Repair(path, nil)
		if rerr != nil {
			t.Fatalf("Repair: %v", rerr)
		}
		if res.Repaired != (err != nil) || res.KeptLines != before {
			t.Fatalf("Repair %+v disagrees with ReadSegment (%d lines, %v)", res, before, err)
		}
		if res.Removed {
			return
		}
		var after int
		if err := ReadSegment(path, func([]byte) error { after++; return nil }); err != nil {
			t.Fatalf("segment still corrupt after Repair: %v", err)
		}
		if after != before {
			t.Fatalf("lines after Repair %d, before %d", after, before)
		}
	})
}

// FuzzCheckFPM: the writer's fast path accepts only bodies that schemas.ParseFPMJSON accepts, with the
// same worker_id, dp_rank and counter_id; checkFPM fails exactly when ParseFPMJSON fails. Seeds: the
// codec's canonical bodies (which must take the fast path) and near misses.
func FuzzCheckFPM(f *testing.F) {
	k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w-1_x", DPRank: 3}
	for _, tf := range []testFPM{{key: k, counter: 0}, {key: k, counter: 123456789, heartbeat: true}, {key: streams.Key{}, counter: 7}} {
		b := tf.body(f)
		f.Add(b)
		f.Add(bytes.Replace(b, []byte(`"dp_rank":3`), []byte(`"dp_rank":-3`), 1))
		f.Add(bytes.Replace(b, []byte(`"version":1`), []byte(`"version":2`), 1))
		f.Add(bytes.Replace(b, []byte(`0.0`), []byte(`1e400`), 1))
		f.Add(bytes.Replace(b, []byte(`0.0`), []byte(`0.0029710211149514445`), 1))
		f.Add(bytes.Replace(b, []byte(`0.0`), []byte(`1.5e-7`), 1))
		f.Add(bytes.Replace(b, []byte(`0.0`), []byte(`1e+281`), 1))
		f.Add(bytes.Replace(b, []byte(`"counter_id":`), []byte(`"counter_id":00`), 1))
		f.Add(append(append([]byte(nil), b[:len(b)-2]...), `,"x":1}}`...))
		f.Add(bytes.Replace(b, []byte(`"worker_id":"`), []byte(`"worker_id":"\u00e9`), 1))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, werr := schemas.ParseFPMJSON(body)
		if id, ok := fastFPM(body); ok {
			if werr != nil {
				t.Fatalf("fast path accepted a body ParseFPMJSON rejects (%v): %q", werr, body)
			}
			if id.WorkerID != want.WorkerID || id.DPRank != want.DPRank || id.CounterID != want.CounterID {
				t.Fatalf("fast path read %+v, ParseFPMJSON %q/%d/%d: %q", id, want.WorkerID, want.DPRank, want.CounterID, body)
			}
		}
		id, err := CheckFPM(body)
		if (err == nil) != (werr == nil) {
			t.Fatalf("checkFPM error %v, ParseFPMJSON error %v: %q", err, werr, body)
		}
		if err == nil && (id.WorkerID != want.WorkerID || id.DPRank != want.DPRank || id.CounterID != want.CounterID) {
			t.Fatalf("checkFPM read %+v: %q", id, body)
		}
	})
}

func TestFastPathTakesTheCanonicalBodies(t *testing.T) {
	t.Parallel()
	for name, tf := range map[string]testFPM{
		"a forward pass": {key: streams.Key{WorkerID: "4192", DPRank: 1}, counter: 42},
		"a heartbeat":    {key: streams.Key{WorkerID: "4192"}, counter: 43, heartbeat: true},
		"empty worker":   {key: streams.Key{}, counter: 0},
	} {
		t.Run(name, func(t *testing.T) {
			b := tf.body(t)
			id, ok := fastFPM(b)
			if !ok || id.WorkerID != tf.key.WorkerID || id.DPRank != int64(tf.key.DPRank) || id.CounterID != tf.counter {
				t.Fatalf("fastFPM = %+v, %v for %s", id, ok, b)
			}
		})
	}
}

// The numbers of real forward passes, as the bridge writes them (the canonical float format): a
// wall_time of a few milliseconds has 17 significant digits behind the point's zeros, and a tiny or
// huge value has an exponent. Each body is the bridge's own (DecodeFPM of the msgpack a worker
// sends), and the fast path takes it.
func TestFastPathTakesEveryCanonicalNumber(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ wallTime, varKV float64 }{
		"a few ms":              {0.0029710211149514445, 610726.1245674741},
		"a whole second":        {1, 0},
		"below the fifth place": {1.5e-7, 0.5},
		"a huge variance":       {0.25, 2.5e+20},
		"hundreds of places":    {0.001, 1.5e+250},
	} {
		t.Run(name, func(t *testing.T) {
			f := schemas.FPM{Version: schemas.FPMVersion, WorkerID: "w-1", DPRank: 2, CounterID: 41, WallTime: tc.wallTime}
			f.Scheduled.NumDecodeRequests, f.Scheduled.VarDecodeKVTokens = 3, tc.varKV
			var d schemas.Decoder
			var g schemas.FPM
			if err := d.DecodeFPM(schemas.EncodeMsgpack(&f), &g); err != nil {
				t.Fatal(err)
			}
			id, ok := fastFPM(g.JSON)
			if !ok || id.WorkerID != "w-1" || id.DPRank != 2 || id.CounterID != 41 {
				t.Fatalf("fastFPM = %+v, %v for %s", id, ok, g.JSON)
			}
		})
	}
}

// FuzzInfo reads arbitrary bytes as a segment: Info never panics; it either reports (a damaged tail
// with an offset inside the file) or fails with ErrNotGzip or ErrNotTrace (a *lineError naming the
// file and line). Seeds: a writer-made segment, text, other JSON.
func FuzzInfo(f *testing.F) {
	k := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w"}
	m := testFPM{key: k, counter: 1, receivedMs: 1000}.msg(f)
	r, err := ParseRecord(&fakeMsg{subject: m.Subject, data: m.Data, hdr: m.Header}, MsgMeta{}, "", nil)
	if err != nil {
		f.Fatal(err)
	}
	line := string(AppendLine(nil, &r, 0, schemas.CaptureFull))
	f.Add(append(member(f, line+"\n"), member(f, line+"\n"+line+"\n")...))
	f.Add(member(f, strings.Replace(line, "full", "bogus", 1)+"\n"))
	f.Add(member(f, "{\"a\":1}\n"))
	f.Add([]byte("not gzip"))
	dir := f.TempDir()
	defer func(n int) { maxMemberBytes = n }(maxMemberBytes)
	maxMemberBytes = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "t.w.000000.jsonl.gz")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := Info([]string{path})
		if err != nil {
			var le *lineError
			switch {
			case errors.Is(err, ErrNotGzip):
			case errors.Is(err, ErrNotTrace) && errors.As(err, &le) && le.Segment == path && le.Line > 0:
			default:
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		for _, d := range rep.Damaged {
			if d.Offset < 0 || d.Offset > int64(len(data)) {
				t.Fatalf("damage offset %d outside %d bytes", d.Offset, len(data))
			}
		}
		var buf bytes.Buffer
		if err := rep.WriteText(&buf); err != nil {
			t.Fatal(err)
		}
	})
}
