package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// traceLineAt is a valid trace line observed at observed.
func traceLineAt(t *testing.T, observed int64) []byte {
	t.Helper()
	k := testKeys(1)[0]
	return schemas.AppendTraceLine(nil, &schemas.TraceLine{Event: schemas.TraceEvent{Schema: schemas.TraceSchema,
		Source: schemas.TraceSource{Namespace: k.Namespace, Component: k.Component, ProducerID: k.WorkerID}, CaptureMode: schemas.CaptureFull,
		ObservedAtUnixMs: observed, FPM: testFPM{key: k, counter: observed}.body(t)}})
}

// Every segment retention removes is recorded with what it held: counted as written when this writer
// wrote it (lines, stream sequences, observation times), read from the file when an earlier writer
// did (lines, observation times; no sequences).
func TestSegmentWriterRecordsWhatItPrunes(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "fpm.w")
	earlier, err := newDefaultSegmentWriter(prefix, 1<<20, 10)
	if err != nil {
		t.Fatal(err)
	}
	// Observation times out of stream order (a bridge's backlog stored after newer FPMs): the segment
	// is named by its earliest and latest, not by its first and last lines'.
	for _, obs := range []int64{101, 100, 102} {
		if err := earlier.Append(traceLineAt(t, obs)); err != nil {
			t.Fatal(err)
		}
	}
	if err := earlier.Close(); err != nil {
		t.Fatal(err)
	}
	line := traceLineAt(t, 200)
	w, err := newDefaultSegmentWriter(prefix, int64(len(line))+1, 2) // one line per segment, two kept
	if err != nil {
		t.Fatal(err)
	}
	var pruned []prunedSegment
	for i, obs := range []int64{200, 201, 202} {
		if err := w.appendRecord(traceLineAt(t, obs), uint64(11+i), obs); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		pruned = append(pruned, w.takePruned()...)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := []prunedSegment{
		{Segment: tracefile.SegmentPath(prefix, 0), Index: 0, Lines: 3, FirstObservedMs: 100, LastObservedMs: 102},
		{Segment: tracefile.SegmentPath(prefix, 1), Index: 1, Lines: 1, FirstSeq: 11, LastSeq: 11, FirstObservedMs: 200, LastObservedMs: 200},
	}
	if !slices.Equal(pruned, want) {
		t.Fatalf("pruned %+v, want %+v", pruned, want)
	}

	// The same for lines this writer counted as it wrote them.
	prefix = filepath.Join(t.TempDir(), "fpm.w")
	w, err = newDefaultSegmentWriter(prefix, 3*int64(len(line)), 1) // two lines per segment (a third would pass the roll), one kept
	if err != nil {
		t.Fatal(err)
	}
	pruned = nil
	for i, obs := range []int64{300, 250, 400} {
		if err := w.appendRecord(traceLineAt(t, obs), uint64(21+i), obs); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		pruned = append(pruned, w.takePruned()...)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want = []prunedSegment{{Segment: tracefile.SegmentPath(prefix, 0), Index: 0, Lines: 2, FirstSeq: 21, LastSeq: 22, FirstObservedMs: 250, LastObservedMs: 300}}
	if !slices.Equal(pruned, want) {
		t.Fatalf("pruned %+v, want %+v", pruned, want)
	}
}

// A writer continues the segment another writer of this process left only while that is the
// producer's newest segment and holds exactly the bytes it left: checked when the writer is made and
// again when it first writes; otherwise it starts at the next free index, and the changed segment is
// not touched.
func TestSegmentWriterContinuesOnlyAnUnchangedNewestSegment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "fpm.w")
	write := func(w *SegmentWriter, lines ...string) {
		t.Helper()
		for _, l := range lines {
			if err := w.Append([]byte(l)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	first, err := newDefaultSegmentWriter(prefix, 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	write(first, "a", "b")
	st, ok := first.state()
	if !ok || st.index != 0 || st.lines != 2 {
		t.Fatalf("state %+v, %v", st, ok)
	}
	next := func(st segmentState) (*SegmentWriter, bool) {
		t.Helper()
		w, err := newDefaultSegmentWriter(prefix, 1<<20, 100)
		if err != nil {
			t.Fatal(err)
		}
		return w, w.continueFrom(st)
	}
	second, ok := next(st)
	if !ok {
		t.Fatal("an unchanged newest segment was not continued")
	}
	write(second, "c")
	if got := prefixLines(t, prefix); len(got) != 1 || strings.Join(got[0], " ") != "a b c" {
		t.Fatalf("segments %v, want 0: [a b c]", got)
	}

	// Changed after the writer was made, before its first write: a new segment; the changed one keeps
	// what the other writer put there.
	st, _ = second.state()
	third, ok := next(st)
	if !ok {
		t.Fatal("not continued")
	}
	other, err := os.OpenFile(tracefile.SegmentPath(prefix, 0), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = other.Write(member(t, "x\n"))
	_ = other.Close()
	write(third, "d")
	if got := prefixLines(t, prefix); len(got) != 2 || strings.Join(got[0], " ") != "a b c x" || strings.Join(got[1], " ") != "d" {
		t.Fatalf("segments %v, want 0: [a b c x], 1: [d]", got)
	}

	// Not the newest any more (another writer started segment 2): not continued.
	st, _ = third.state()
	touch(t, tracefile.SegmentPath(prefix, 2))
	if _, ok := next(st); ok {
		t.Fatal("a segment below the newest was continued")
	}
}

// A segment swapped for something else between the writer's look at it (continueFrom) and its first
// write is not continued through it: nothing is appended to the file a symbolic link points to, the
// reopen does not wait for a reader of a named pipe, what was swapped in stays as it is, and the writer
// starts a new segment.
func TestSegmentWriterDoesNotContinueThroughASwappedInFile(t *testing.T) {
	t.Parallel()
	for name, swap := range map[string]func(seg, elsewhere string) error{
		"a symbolic link to the segment moved elsewhere": func(seg, elsewhere string) error {
			if err := os.Rename(seg, elsewhere); err != nil {
				return err
			}
			return os.Symlink(elsewhere, seg)
		},
		"a named pipe": func(seg, _ string) error {
			if err := os.Remove(seg); err != nil {
				return err
			}
			return syscall.Mkfifo(seg, 0o644)
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			prefix := filepath.Join(t.TempDir(), "fpm.w")
			first, err := newDefaultSegmentWriter(prefix, 1<<20, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []string{"a", "b"} {
				if err := first.Append([]byte(l)); err != nil {
					t.Fatal(err)
				}
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			st, _ := first.state()
			second, err := newDefaultSegmentWriter(prefix, 1<<20, 100)
			if err != nil {
				t.Fatal(err)
			}
			if !second.continueFrom(st) {
				t.Fatal("an unchanged newest segment was not continued")
			}
			seg := tracefile.SegmentPath(prefix, st.index)
			written, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			elsewhere := filepath.Join(t.TempDir(), "elsewhere.jsonl.gz")
			if err := swap(seg, elsewhere); err != nil {
				t.Fatal(err)
			}

			done := make(chan error, 1)
			go func() {
				if err := second.Append([]byte("c")); err != nil {
					done <- err
					return
				}
				done <- second.Close()
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the writer's first write waits on what was swapped in at %s", seg)
			}

			if got, err := os.ReadFile(elsewhere); err == nil && !bytes.Equal(got, written) {
				t.Fatalf("%s changed through the link at %s: %d bytes, the writer left %d", elsewhere, seg, len(got), len(written))
			}
			if fi, err := os.Lstat(seg); err != nil || fi.Mode().IsRegular() {
				t.Fatalf("what was swapped in at %s was replaced: %v, %v", seg, fi, err)
			}
			if got := segmentLines(t, tracefile.SegmentPath(prefix, st.index+1)); strings.Join(got, " ") != "c" {
				t.Fatalf("the new segment holds %v, want [c]", got)
			}
		})
	}
}

// Writers that succeed one another in a process on one output (the incarnations of a component its
// supervisor restarts) share processSegments: the second continues each producer's segment, where a
// writer of its own starts a new one, as at a process start.
func TestConsumersSharingProcessSegmentsContinueTheSegments(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig(t)
	msgs, published := manyFPMs(t, testKeys(2), 400, 1_782_777_600_000)
	segments := func() int {
		t.Helper()
		segs, err := tracefile.ListSegments(tracefile.SegmentPrefix(cfg.OutputPath, "w0"))
		if err != nil {
			t.Fatal(err)
		}
		return len(segs)
	}
	segs := NewProcessSegments()
	runOnce := func(from, to int, shared *processSegments) {
		t.Helper()
		publish(t, env.JS, msgs[from:to])
		cfg := cfg
		cfg.Segments = shared
		r := startWriter(t, cfg, env.JS)
		waitConsumed(t, env.JS, cfg.Group)
		if err := r.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	runOnce(0, 100, segs)
	runOnce(100, 200, segs)
	if n := segments(); n != 1 {
		t.Fatalf("%d segments after two incarnations sharing the process's segments, want 1", n)
	}
	runOnce(200, 300, nil) // a writer of its own: a writer's start
	if n := segments(); n != 2 {
		t.Fatalf("%d segments after a writer's start, want 2", n)
	}
	runOnce(300, 400, segs) // what segs holds is not the newest segment any more
	if n := segments(); n != 3 {
		t.Fatalf("%d segments, want 3: the segment another writer left behind is not continued", n)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
}
