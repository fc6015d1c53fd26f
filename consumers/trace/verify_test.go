package trace

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// verifyOutput is a trace output written by the real writer, kept as bytes so that every scenario
// damages its own copy.
type verifyOutput struct {
	base  string            // the output path's file name: dynamo-fpm.jsonl.gz
	files map[string][]byte // file name -> bytes
}

// writeVerifyOutput publishes n messages of 4 keys (2 producers) and has a full-mode writer with clock
// write them in small segments (about 30 lines) of small members (about 6 lines).
func writeVerifyOutput(t *testing.T, js jetstream.JetStream, n int, clock func() time.Time, configure ...func(*Config)) verifyOutput {
	t.Helper()
	msgs, _ := manyFPMs(t, testKeys(4), n, 1_782_777_600_000)
	publish(t, js, msgs)
	cfg := testConfig(t)
	for _, c := range configure {
		c(&cfg)
	}
	cfg.RollBytes, cfg.BufferSize, cfg.MaxSegments, cfg.MaxAckPending = 20_000, 4_000, 1000, 24
	opts := []durable.Option{}
	if clock != nil {
		opts = append(opts, durable.WithClock(clock))
	}
	r := startWriter(t, cfg, js, opts...)
	waitConsumed(t, js, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	out := verifyOutput{base: filepath.Base(cfg.OutputPath), files: map[string][]byte{}}
	entries, err := os.ReadDir(filepath.Dir(cfg.OutputPath))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), tracefile.SegmentSuffix) {
			continue // the producers' lock files (owner.go)
		}
		data, err := os.ReadFile(filepath.Join(filepath.Dir(cfg.OutputPath), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out.files[e.Name()] = data
	}
	return out
}

// copyTo writes the output into a new directory and returns its output path.
func (o verifyOutput) copyTo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range o.files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, o.base)
}

// segmentName is the file name of segment index of producer.
func (o verifyOutput) segmentName(producer string, index uint64) string {
	return filepath.Base(tracefile.SegmentPath(tracefile.OutputBase(o.base)+"."+producer, index))
}

// piece is a byte range of a segment's bytes (tracefile.Pieces): an intact block, normally one of the
// writer's gzip members, or a damaged region; n is its lines.
type piece struct {
	off, end int64
	damaged  bool
	n        int
}

// pieces cuts a segment's bytes as Verify does (tracefile.Pieces).
func pieces(data []byte) []piece {
	var out []piece
	for _, p := range tracefile.Pieces(data) {
		out = append(out, piece{off: p.Offset, end: p.End, damaged: p.Damaged, n: p.Lines})
	}
	return out
}

// gzipTrailerLen is a gzip member's trailer: CRC-32 and size of the uncompressed data.
const gzipTrailerLen = 8

// blocks returns the intact blocks (the writer's gzip members) of a segment's bytes.
func blocks(t *testing.T, data []byte) []piece {
	t.Helper()
	pcs := pieces(data)
	for _, pc := range pcs {
		if pc.damaged {
			t.Fatalf("pristine segment damaged: %+v", pcs)
		}
	}
	if len(pcs) < 4 {
		t.Fatalf("segment has %d members, want at least 4", len(pcs))
	}
	return pcs
}

// gunzip decompresses every member of data (the standard library's reader, not fpmbus's).
func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// findingsOf returns the findings of the segment named name.
func findingsOf(t *testing.T, rep *tracefile.VerifyReport, name string) (*tracefile.VerifySegment, []tracefile.Finding) {
	t.Helper()
	for _, p := range rep.Producers {
		for _, s := range p.Segments {
			if filepath.Base(s.Path) == name {
				return s, s.Findings
			}
		}
	}
	t.Fatalf("no segment %s in the report", name)
	return nil, nil
}

func kinds(fs []tracefile.Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Kind)
	}
	return out
}

// A damaged sealed segment is found by the files alone (or, cut at a member boundary, by the stream),
// restored from the stream to exactly the lines it held, and verifies cleanly afterwards; the other
// segments are untouched. The writer's clock is frozen here, so every line's timestamp is 0 and the
// restored content is byte-identical (TestVerifyEstimatesLostTimestamps covers a running clock).
func TestVerifyRepairsFromTheStream(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	frozen := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	orig := writeVerifyOutput(t, env.JS, 1200, func() time.Time { return frozen })
	seg1 := orig.segmentName("w0", 1)
	if _, ok := orig.files[orig.segmentName("w0", 4)]; !ok {
		t.Fatalf("want at least 5 segments per producer, have %v", slices.Sorted(func(yield func(string) bool) {
			for k := range orig.files {
				if !yield(k) {
					return
				}
			}
		}))
	}
	ctx := context.Background()
	for name, tc := range map[string]struct {
		damage func(t *testing.T, data []byte) []byte
		// offline: the finding kinds the files alone show; stream: the kinds matching the stream adds.
		offline, stream []string
		exact           bool // every restored timestamp is exact (read, or pinned by its neighbours)
		verified        bool // the rebuilt member matches the damaged member's CRC-32 and size
	}{
		"a flipped byte in a middle member": {
			damage: func(t *testing.T, data []byte) []byte {
				b := blocks(t, data)[2]
				data[b.off+(b.end-b.off)/2] ^= 0xff
				return data
			},
			offline: []string{tracefile.FindingGzip}, exact: true, verified: true,
		},
		"truncated inside a member": {
			damage: func(t *testing.T, data []byte) []byte {
				b := blocks(t, data)[1]
				return data[:b.off+(b.end-b.off)/3]
			},
			offline: []string{tracefile.FindingTruncated},
		},
		"truncated at a member boundary": {
			damage: func(t *testing.T, data []byte) []byte {
				return data[:blocks(t, data)[2].off]
			},
			stream: []string{tracefile.FindingMissing},
		},
		"a member's header destroyed": {
			damage: func(t *testing.T, data []byte) []byte {
				b := blocks(t, data)[1]
				data[b.off] = 0
				return data
			},
			offline: []string{tracefile.FindingGzip}, exact: true, verified: true,
		},
		"a member's CRC-32 flipped": {
			damage: func(t *testing.T, data []byte) []byte {
				b := blocks(t, data)[3]
				data[b.end-gzipTrailerLen] ^= 0x01
				return data
			},
			offline: []string{tracefile.FindingGzip}, exact: true,
		},
		"garbage appended": {
			damage: func(t *testing.T, data []byte) []byte {
				return append(data, []byte("\x1f\x8b\x08 not a member at all")...)
			},
			offline: []string{tracefile.FindingGzip}, exact: true,
		},
		"emptied": {
			damage:  func(t *testing.T, data []byte) []byte { return data[:0] },
			offline: []string{tracefile.FindingTruncated},
		},
	} {
		t.Run(name, func(t *testing.T) {
			out := tc.damage(t, bytes.Clone(orig.files[seg1]))
			output := orig.copyTo(t)
			path := filepath.Join(filepath.Dir(output), seg1)
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			// The files alone.
			rep, err := tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Logger: testLogger(t)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, fs := findingsOf(t, rep, seg1); !slices.Equal(kinds(fs), tc.offline) || rep.Remaining != len(tc.offline) {
				t.Fatalf("offline findings %v (remaining %d), want %v: %+v", kinds(fs), rep.Remaining, tc.offline, fs)
			}
			for _, f := range rep.Producers[0].Segments[1].Findings {
				if f.Kind == tracefile.FindingGzip || f.Kind == tracefile.FindingTruncated {
					if f.Offset < 0 || f.End > int64(len(out)) || f.End < f.Offset {
						t.Fatalf("damage at bytes %d..%d of a %d-byte file", f.Offset, f.End, len(out))
					}
				}
			}
			// With the stream, as a dry run: restorable, nothing written.
			rep, err = tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Logger: testLogger(t)}, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			want := append(slices.Clone(tc.offline), tc.stream...)
			_, fs := findingsOf(t, rep, seg1)
			if !slices.Equal(kinds(fs), want) || rep.Remaining != len(want) {
				t.Fatalf("findings with the stream %v (remaining %d), want %v: %+v", kinds(fs), rep.Remaining, want, fs)
			}
			for _, f := range fs {
				if f.Heal == nil || f.Heal.Status != tracefile.HealRestorable {
					t.Fatalf("finding %+v: heal %+v, want restorable", f, f.Heal)
				}
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, out) {
				t.Fatal("a verify without --repair changed the segment")
			}
			// Repair.
			rep, err = tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			s, fs := findingsOf(t, rep, seg1)
			if !s.Repaired || rep.Remaining != 0 || rep.Repaired != len(want) {
				t.Fatalf("repair: segment %+v, report %+v", s, rep)
			}
			restored := 0
			for _, f := range fs {
				h := f.Heal
				restored += h.Lines
				if h.Status != tracefile.HealRestored || h.TimestampsExact+h.TimestampsEstimated != h.Lines ||
					tc.exact && h.TimestampsEstimated != 0 || tc.verified != h.Verified {
					t.Fatalf("heal %+v (exact %v, verified %v)", h, tc.exact, tc.verified)
				}
			}
			lost := bytes.Count(gunzip(t, orig.files[seg1]), []byte{'\n'}) - countLines(t, out)
			if name != "garbage appended" && (restored == 0 || restored != lost) {
				t.Fatalf("%d lines restored, %d were unreadable", restored, lost)
			}
			// Every segment now decompresses to exactly its original content.
			for fname, data := range orig.files {
				got, err := os.ReadFile(filepath.Join(filepath.Dir(output), fname))
				if err != nil {
					t.Fatal(err)
				}
				if fname != seg1 && !bytes.Equal(got, data) {
					t.Fatalf("%s changed", fname)
				}
				if a, b := gunzip(t, got), gunzip(t, data); !bytes.Equal(a, b) {
					t.Fatalf("%s: restored content differs from the original (%d and %d bytes)", fname, len(a), len(b))
				}
			}
			if fi, err := os.Stat(path + tracefile.VerifyTmpSuffix); err == nil {
				t.Fatalf("temporary file left: %v", fi.Name())
			}
			rep, err = tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Logger: testLogger(t)}, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Damaged != 0 {
				t.Fatalf("after the repair: %+v", rep)
			}
		})
	}
}

// countLines counts the whole lines of the intact members of a segment's bytes.
func countLines(t *testing.T, data []byte) int {
	t.Helper()
	n := 0
	for _, pc := range pieces(data) {
		if !pc.damaged {
			n += pc.n
		}
	}
	return n
}

// splitLines splits decompressed content into its lines.
func splitLines(content []byte) [][]byte {
	return bytes.SplitAfter(bytes.TrimSuffix(content, []byte{'\n'}), []byte{'\n'})
}

// A line whose bytes are lost gets back its event byte for byte, and as its timestamp the one of the
// line before it in the segment: never after the original, and counted as estimated.
func TestVerifyEstimatesLostTimestamps(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	orig := writeVerifyOutput(t, env.JS, 1200, nil)
	seg := orig.segmentName("w1", 2)
	output := orig.copyTo(t)
	path := filepath.Join(filepath.Dir(output), seg)
	b := blocks(t, orig.files[seg])[1]
	if err := os.WriteFile(path, orig.files[seg][:b.off+(b.end-b.off)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	s, fs := findingsOf(t, rep, seg)
	if !s.Repaired || len(fs) != 1 || fs[0].Kind != tracefile.FindingTruncated || fs[0].Heal.Status != tracefile.HealRestored {
		t.Fatalf("segment %+v: %+v", s, fs)
	}
	h := fs[0].Heal
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, have := splitLines(gunzip(t, orig.files[seg])), splitLines(gunzip(t, got))
	if len(have) != len(want) {
		t.Fatalf("%d lines after the repair, %d before the damage", len(have), len(want))
	}
	kept := countLines(t, orig.files[seg][:b.off])
	differ := 0
	for i := range want {
		w, g := mustParse(t, want[i]), mustParse(t, have[i])
		ew, _ := json.Marshal(w.Event)
		eg, _ := json.Marshal(g.Event)
		if !bytes.Equal(ew, eg) {
			t.Fatalf("line %d: event differs:\n%s\n%s", i+1, ew, eg)
		}
		switch {
		case i < kept:
			if !bytes.Equal(want[i], have[i]) {
				t.Fatalf("line %d was intact and changed", i+1)
			}
		case g.Timestamp != mustParse(t, have[i-1]).Timestamp || g.Timestamp > w.Timestamp:
			t.Fatalf("restored line %d: timestamp %d, the line before has %d, the original %d", i+1, g.Timestamp, mustParse(t, have[i-1]).Timestamp, w.Timestamp)
		case g.Timestamp != w.Timestamp:
			differ++
		}
	}
	if h.Lines != len(want)-kept || h.TimestampsEstimated != h.Lines || h.TimestampsEstimated < differ || h.Verified {
		t.Fatalf("heal %+v: %d lines restored, %d timestamps differ from the originals", h, len(want)-kept, differ)
	}
}

func mustParse(t *testing.T, line []byte) *schemas.TraceLine {
	t.Helper()
	l, err := schemas.ParseTraceLine(line)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lineKeys returns "worker/rank/counter" of each line.
func lineKeys(t *testing.T, lines [][]byte) []string {
	var out []string
	for _, l := range lines {
		tl := mustParse(t, l)
		f, err := schemas.ParseFPMJSON(tl.Event.FPM)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s/%d/%d", f.WorkerID, f.DPRank, f.CounterID))
	}
	return out
}

// What the stream no longer holds is reported — the keys and counter_ids of the lost lines, the lines
// read from the damaged bytes that nothing confirms — and the damaged bytes are kept.
func TestVerifyReportsWhatTheStreamNoLongerHolds(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	frozen := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	orig := writeVerifyOutput(t, env.JS, 1200, func() time.Time { return frozen })
	output := orig.copyTo(t)
	flipped, truncated := orig.segmentName("w0", 3), orig.segmentName("w1", 5)
	damaged := map[string][]byte{}
	bf := blocks(t, orig.files[flipped])[2]
	damaged[flipped] = bytes.Clone(orig.files[flipped])
	damaged[flipped][bf.end-gzipTrailerLen-4] ^= 0x55 // late in the deflate data: most of the member decodes
	bt := blocks(t, orig.files[truncated])[1]
	damaged[truncated] = orig.files[truncated][:bt.off+(bt.end-bt.off)/2]
	for name, data := range damaged {
		if err := os.WriteFile(filepath.Join(filepath.Dir(output), name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	s, err := env.JS.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Remaining != 2 || rep.Repaired != 0 {
		t.Fatalf("report: %d remaining, %d repaired, want 2 and 0", rep.Remaining, rep.Repaired)
	}
	for name, data := range damaged {
		got, err := os.ReadFile(filepath.Join(filepath.Dir(output), name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s was changed although the stream holds none of its lost lines", name)
		}
		sg, fs := findingsOf(t, rep, name)
		if sg.Repaired || len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealIncomplete {
			t.Fatalf("%s: %+v", name, fs)
		}
		// The lines lost = the original lines minus those still read whole.
		intact := map[string]bool{}
		for _, k := range lineKeys(t, splitLines(gunzipIntact(t, data))) {
			intact[k] = true
		}
		var lost []string
		for _, k := range lineKeys(t, splitLines(gunzip(t, orig.files[name]))) {
			if !intact[k] {
				lost = append(lost, k)
			}
		}
		var reported []string
		h := fs[0].Heal
		for _, u := range h.Unconfirmed {
			reported = append(reported, fmt.Sprintf("%s/%d/%d", u.WorkerID, u.DPRank, u.CounterID))
		}
		for _, m := range h.Missing {
			if m.CounterFrom < 0 || m.CounterTo < m.CounterFrom {
				t.Fatalf("%s: open or empty missing range %+v", name, m)
			}
			for c := m.CounterFrom; c <= m.CounterTo; c++ {
				reported = append(reported, fmt.Sprintf("%s/%d/%d", m.WorkerID, m.DPRank, c))
			}
		}
		slices.Sort(lost)
		slices.Sort(reported)
		if len(lost) == 0 || !slices.Equal(lost, reported) {
			t.Fatalf("%s: lost lines %v, reported %v (%+v)", name, lost, reported, h)
		}
	}
}

// gunzipIntact decompresses the intact members of a damaged segment's bytes.
func gunzipIntact(t *testing.T, data []byte) []byte {
	t.Helper()
	var out []byte
	for _, pc := range pieces(data) {
		if !pc.damaged {
			out = append(out, gunzip(t, data[pc.off:pc.end])...)
		}
	}
	return out
}

// Intact members in the wrong place are found by the stream: lines out of stream order, lines written
// twice. Lines out of order are not rewritten: which bytes are wrong is for a person to decide. A line
// written twice is a copy of the earlier one (the stream holds one message for both): the repair
// removes the copy, leaving exactly what was written before.
func TestVerifyFindsOrderAndDuplicates(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	frozen := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	orig := writeVerifyOutput(t, env.JS, 600, func() time.Time { return frozen })
	seg := orig.segmentName("w0", 1)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		damage  func(data []byte, b []piece) []byte
		kind    string
		count   func(b []piece) int // findings expected
		offline bool                // the files alone show them
		removed bool                // the repair removes them
	}{
		"a line that is no trace line": {
			damage: func(data []byte, b []piece) []byte {
				return slices.Concat(data[:b[2].off], member(t, "{\"msg\":\"a log line\"}\n"), data[b[2].off:])
			},
			kind: tracefile.FindingLine, count: func([]piece) int { return 1 }, offline: true,
		},
		"two members swapped": {
			damage: func(data []byte, b []piece) []byte {
				out := slices.Concat(data[:b[1].off], data[b[2].off:b[2].end], data[b[1].off:b[1].end], data[b[2].end:])
				return out
			},
			kind: tracefile.FindingOrder, count: func(b []piece) int { return b[1].n },
		},
		"a member repeated": {
			damage: func(data []byte, b []piece) []byte {
				return slices.Concat(data[:b[2].end], data[b[1].off:b[1].end], data[b[2].end:])
			},
			kind: tracefile.FindingDuplicate, count: func(b []piece) int { return b[1].n }, removed: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			output := orig.copyTo(t)
			path := filepath.Join(filepath.Dir(output), seg)
			b := blocks(t, orig.files[seg])
			damaged := tc.damage(orig.files[seg], b)
			if err := os.WriteFile(path, damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Logger: testLogger(t)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.offline != (rep.Damaged != 0) {
				t.Fatalf("the files alone (whole members, one frozen clock) show %d findings", rep.Damaged)
			}
			rep, err = tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			s, fs := findingsOf(t, rep, seg)
			if len(fs) != tc.count(b) || s.Repaired != tc.removed || tc.removed != (rep.Remaining == 0) || !tc.removed && rep.Remaining != len(fs) {
				t.Fatalf("findings %v (remaining %d, repaired %v), want %d of %s", kinds(fs), rep.Remaining, s.Repaired, tc.count(b), tc.kind)
			}
			for _, f := range fs {
				if f.Kind != tc.kind || f.Line == 0 || tc.removed && (f.Heal == nil || f.Heal.Status != tracefile.HealRestored) {
					t.Fatalf("finding %+v, want %s", f, tc.kind)
				}
			}
			if tc.removed {
				got, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(gunzip(t, got), gunzip(t, orig.files[seg])) {
					t.Fatal("the segment differs from what was written after its copies were removed")
				}
				return
			}
			if tc.kind == tracefile.FindingLine {
				if want := b[0].n + b[1].n + 1; fs[0].Line != want || fs[0].Offset != b[2].off {
					t.Fatalf("bad line reported at line %d, member at byte %d; it is line %d, at byte %d", fs[0].Line, fs[0].Offset, want, b[2].off)
				}
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, damaged) {
				t.Fatal("the segment was rewritten")
			}
		})
	}
}

// The newest segment of a producer is a running writer's: reported on and repaired only when asked.
func TestVerifyLeavesTheActiveSegmentAlone(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	frozen := time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC)
	orig := writeVerifyOutput(t, env.JS, 600, func() time.Time { return frozen })
	var newest string
	for i := uint64(0); ; i++ {
		n := orig.segmentName("w1", i)
		if _, ok := orig.files[n]; !ok {
			break
		}
		newest = n
	}
	output := orig.copyTo(t)
	path := filepath.Join(filepath.Dir(output), newest)
	damaged := bytes.Clone(orig.files[newest])
	b := blocks(t, damaged)[1]
	damaged[b.off+(b.end-b.off)/2] ^= 0xff
	if err := os.WriteFile(path, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rep, err := tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if s, fs := findingsOf(t, rep, newest); s.Checked || !s.Active || len(fs) != 0 || rep.Damaged != 0 {
		t.Fatalf("active segment %+v", s)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, damaged) {
		t.Fatal("the active segment was rewritten")
	}
	rep, err = tracefile.Verify(ctx, tracefile.VerifyConfig{OutputPath: output, Repair: true, IncludeActive: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if s, fs := findingsOf(t, rep, newest); !s.Checked || !s.Repaired || len(fs) != 1 || rep.Remaining != 0 {
		t.Fatalf("active segment with IncludeActive %+v", s)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gunzip(t, got), gunzip(t, orig.files[newest])) {
		t.Fatal("the active segment's content differs after the repair")
	}
}

// A repair is refused while the writer runs (it owns its producers' prefixes), before it reads or
// writes anything; once the writer has stopped the repair heals the segment, and every message has
// exactly one line, in stream order.
func TestVerifyRepairIsRefusedWhileTheWriterRuns(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	keys := testKeys(4)
	msgs, fs := manyFPMs(t, keys, 2400, 1_782_777_600_000)
	publish(t, env.JS, msgs[:1200])
	cfg := testConfig(t)
	cfg.RollBytes, cfg.BufferSize, cfg.MaxSegments, cfg.MaxAckPending = 20_000, 4_000, 1000, 24
	r := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	seg := tracefile.SegmentPath(tracefile.SegmentPrefix(cfg.OutputPath, "w0"), 2)
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b := blocks(t, data)[1]
	data[b.off+(b.end-b.off)/2] ^= 0xff
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: cfg.OutputPath, Repair: true, Logger: testLogger(t)}, env.JS)
	var held *fsutil.HeldError
	if !errors.Is(err, tracefile.ErrPrefixHeld) || !errors.As(err, &held) || held.Holder == nil || held.Holder.Role != "trace writer" ||
		!strings.Contains(err.Error(), tracefile.PrefixLockPath(tracefile.SegmentPrefix(cfg.OutputPath, "w0"))) {
		t.Fatalf("repair next to the running writer: %v, want it refused naming the writer and its lock", err)
	}
	if got, _ := os.ReadFile(seg); !bytes.Equal(got, data) {
		t.Fatal("the refused repair rewrote a segment")
	}
	publish(t, env.JS, msgs[1200:])
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: cfg.OutputPath, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := findingsOf(t, rep, filepath.Base(seg)); !s.Repaired {
		t.Fatalf("segment not repaired: %+v", s)
	}
	want := map[string][]string{}
	for _, f := range fs {
		want[f.key.WorkerID] = append(want[f.key.WorkerID], fmt.Sprintf("%s/%d/%d", f.key.WorkerID, f.key.DPRank, f.counter))
	}
	got := outputLines(t, cfg.OutputPath)
	for p, w := range want {
		if g := lineKeys(t, got[p]); !slices.Equal(g, w) {
			t.Fatalf("producer %s: %d lines, want %d, in stream order", p, len(g), len(w))
		}
	}
}

// In sampled mode the writer kept one message per key and interval, partly by its clock: which messages
// had lines cannot be told from the stream, so damage is reported and nothing is rewritten.
func TestVerifyDoesNotGuessSampledLines(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	orig := writeVerifyOutput(t, env.JS, 2400, nil, func(c *Config) {
		c.Mode, c.SampleInterval, c.RollBytes = schemas.CaptureSampled, 5*time.Millisecond, 12_000
	})
	seg := orig.segmentName("w0", 1)
	data := bytes.Clone(orig.files[seg])
	pcs := pieces(data)
	if len(pcs) < 2 {
		t.Fatalf("segment has %d members, want 2 or more", len(pcs))
	}
	b := pcs[len(pcs)/2]
	data[b.off+(b.end-b.off)/2] ^= 0xff
	output := orig.copyTo(t)
	path := filepath.Join(filepath.Dir(output), seg)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	s, fs := findingsOf(t, rep, seg)
	if len(fs) != 1 || fs[0].Kind != tracefile.FindingGzip || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealUnknown || s.Repaired || rep.Remaining != 1 {
		t.Fatalf("sampled damage: %+v, heal %+v", fs, fs[0].Heal)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Fatal("a sampled segment was rewritten")
	}
}

// A sampled writer writes the samples of an interval in Dynamo's key order, so a producer's lines
// follow its keys, not the stream: key b (rank 0) has its line before key a (rank 1), whose message is
// older. Matched to the stream, such a trace is intact.
func TestVerifySampledLinesAcrossKeysNeedNotFollowTheStream(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	const base = 1_782_777_600_000 // a multiple of the interval
	a := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 1}
	b := streams.Key{Namespace: "ns", Component: "c", WorkerID: "w", DPRank: 0}
	fs := []testFPM{
		{key: a, counter: 1, receivedMs: base + 100},  // stream sequence 1: a's sample of interval 0
		{key: b, counter: 1, receivedMs: base + 200},  // 2: b's sample of interval 0
		{key: b, counter: 2, receivedMs: base + 1100}, // 3: b's interval 1 begins
		{key: a, counter: 2, receivedMs: base + 1200}, // 4: a's; interval 0 is written b (2) first, then a (1)
	}
	var msgs []*nats.Msg
	for _, f := range fs {
		msgs = append(msgs, f.msg(t))
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.Mode, cfg.SampleInterval = schemas.CaptureSampled, time.Second
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r := startWriter(t, cfg, env.JS)
	waitHanded(t, reg, len(fs))
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, l := range outputLines(t, cfg.OutputPath)["w"] {
		tl, err := schemas.ParseTraceLine(l)
		if err != nil {
			t.Fatal(err)
		}
		f, err := tracefile.CheckFPM(tl.Event.FPM)
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, fmt.Sprintf("%d/%d", f.DPRank, f.CounterID))
	}
	if got := strings.Join(order, " "); !strings.HasPrefix(got, "0/1 1/1") {
		t.Fatalf("lines (dp_rank/counter_id) %s: want b's first sample before a's", got)
	}
	rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: cfg.OutputPath, IncludeActive: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Stream || rep.Lines != len(order) || rep.Damaged != 0 {
		var fs []string
		for _, p := range rep.Producers {
			for _, s := range p.Segments {
				for _, f := range s.Findings {
					fs = append(fs, f.Kind+": "+f.Reason)
				}
			}
		}
		t.Fatalf("stream %v, lines %d of %d, damaged %d: %v", rep.Stream, rep.Lines, len(order), rep.Damaged, fs)
	}
}

// A sealed segment replaced by a symbolic link (to a copy elsewhere) still held lines: it is reported,
// never read or rewritten through, and its lines are not "restored" into the segments around it, which
// would hold them twice with the link's target.
func TestVerifyReportsANonRegularSegmentAndRestoresNothingAroundIt(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	orig := writeVerifyOutput(t, env.JS, 1200, nil)
	for name, plant := range map[string]func(t *testing.T, path string, data []byte){
		"a symbolic link to a copy elsewhere": func(t *testing.T, path string, data []byte) {
			moved := filepath.Join(t.TempDir(), filepath.Base(path))
			if err := os.WriteFile(moved, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, path); err != nil {
				t.Fatal(err)
			}
		},
		"a directory": func(t *testing.T, path string, _ []byte) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			output := orig.copyTo(t)
			seg := orig.segmentName("w0", 1)
			path := filepath.Join(filepath.Dir(output), seg)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			plant(t, path, orig.files[seg])
			rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
			if err != nil {
				t.Fatal(err)
			}
			for fname, data := range orig.files {
				if fname == seg {
					continue
				}
				if got, err := os.ReadFile(filepath.Join(filepath.Dir(output), fname)); err != nil || !bytes.Equal(got, data) {
					t.Fatalf("%s was rewritten (%v): the link's lines restored around it", fname, err)
				}
			}
			_, fs := findingsOf(t, rep, seg)
			if len(fs) != 1 || fs[0].Kind != tracefile.FindingNotRegular || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealUnknown || !strings.Contains(fs[0].Reason, path) {
				t.Fatalf("findings of %s: %+v", seg, fs)
			}
			if rep.Damaged != 1 || rep.Repaired != 0 || rep.Remaining != 1 {
				t.Fatalf("report: damaged %d, repaired %d, remaining %d; want only the link, unrepaired", rep.Damaged, rep.Repaired, rep.Remaining)
			}
		})
	}
}

// Rotation pruned a producer's oldest segments, and the first member of the oldest one left is
// damaged: no line precedes the damage, but its first line, still readable in the damaged bytes and
// in the stream, says where its lines begin, and the stream restores every one of them.
func TestVerifyHealsTheOldestSegmentAfterPruning(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	orig := writeVerifyOutput(t, env.JS, 1200, nil)
	output := orig.copyTo(t)
	dir := filepath.Dir(output)
	for _, i := range []uint64{0, 1} { // pruned
		if err := os.Remove(filepath.Join(dir, orig.segmentName("w0", i))); err != nil {
			t.Fatal(err)
		}
	}
	seg := orig.segmentName("w0", 2)
	data := bytes.Clone(orig.files[seg])
	b := blocks(t, data)[0]
	data[b.end-gzipTrailerLen] ^= 0xff // the first member's CRC-32: its lines read, unconfirmed by the file
	if err := os.WriteFile(filepath.Join(dir, seg), data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := tracefile.Verify(context.Background(), tracefile.VerifyConfig{OutputPath: output, Repair: true, Logger: testLogger(t)}, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	s, fs := findingsOf(t, rep, seg)
	if len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealRestored || len(fs[0].Heal.Unconfirmed) != 0 || !s.Repaired {
		t.Fatalf("damage at the start of the oldest segment: %+v, heal %+v", fs, fs[0].Heal)
	}
	got, err := os.ReadFile(filepath.Join(dir, seg))
	if err != nil {
		t.Fatal(err)
	}
	if a, b := gunzip(t, got), gunzip(t, orig.files[seg]); !bytes.Equal(a, b) {
		t.Fatalf("restored content differs from the original (%d and %d bytes)", len(a), len(b))
	}
	if rep.Remaining != 0 {
		t.Fatalf("remaining %d", rep.Remaining)
	}
}
