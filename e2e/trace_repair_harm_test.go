package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// traceUntilAcked runs `fpmbus trace` on out (full mode, small segments, group) until it has acked
// total messages, and returns it running.
func traceUntilAcked(t *testing.T, env *natsservertest.Env, out, group string, total uint64, extra ...string) *proc {
	t.Helper()
	args := append([]string{"trace", "--server", env.Server.ClientURL(), "--trace-mode", "full", "--trace-output", out,
		"--group", group, "--roll-bytes", "60000", "--trace-max-ack-pending", "40", "--trace-flush-interval", "50ms"}, extra...)
	p := fpmbus(t, "fpmbus trace", args...)
	waitAcked(t, env, group, total)
	return p
}

func waitAcked(t *testing.T, env *natsservertest.Env, group string, total uint64) {
	t.Helper()
	eventually(t, 60*time.Second, func() error {
		if _, floor, _ := consumerState(t, env.JS, group, total); floor != total {
			return fmt.Errorf("ack floor %d of %d", floor, total)
		}
		return nil
	})
}

// flipByte flips one byte of the file at off in place (no truncation: a writer appending to it keeps
// its file).
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A foreign segment with a higher index copied into the output (from another run) made `verify
// --repair` take the live writer's active segment for a sealed one and rewrite it, while the writer
// went on appending to the file it had open, now deleted: acked lines left the trace. The repair now
// owns every producer first and is refused while a writer holds them (exit 1, naming the writer and
// its lock), whatever the files are named; nothing is rewritten, and after the writer has stopped the
// repair heals the damage, every message traced exactly once.
func TestTraceVerifyRepairNextToALiveWriterIsRefused(t *testing.T) {
	t.Parallel()
	const first, more = 4000, 2000
	env := natsservertest.Start(t)
	fillFPM(t, env.JS, first, 2, 2, 1_782_777_600_000)
	out := filepath.Join(t.TempDir(), "fpm")
	p := traceUntilAcked(t, env, out, "live", first, "--max-segments", "1000")
	prefix := tracefile.SegmentPrefix(out, "kw0")
	segs, err := tracefile.ListSegments(prefix)
	if err != nil || len(segs) < 3 {
		t.Fatalf("segments of kw0: %v, %v", segs, err)
	}
	active := segs[len(segs)-1]
	foreign := tracefile.SegmentPath(prefix, active.Index+50)
	data, err := os.ReadFile(segs[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(foreign, data, 0o644); err != nil {
		t.Fatal(err)
	}
	activeData, err := os.ReadFile(active.Path)
	if err != nil {
		t.Fatal(err)
	}
	m := memberStarts(t, activeData)
	if len(m) < 3 {
		t.Fatalf("active segment has %d members", len(m))
	}
	flipByte(t, active.Path, int64(m[1]+m[2])/2)
	before, _ := os.Stat(active.Path)

	outText, err := run(t, 120*time.Second, fpmbusBin, "trace", "verify", "--repair", "--server", env.Server.ClientURL(), out)
	if code := exitCode(err); code != 1 || !strings.Contains(outText, tracefile.PrefixLockPath(prefix)) ||
		!strings.Contains(outText, fmt.Sprintf("pid %d", p.cmd.Process.Pid)) || !strings.Contains(outText, "trace writer") {
		t.Fatalf("verify --repair next to the writer (pid %d): exit %d, want 1 naming it and its lock:\n%s", p.cmd.Process.Pid, code, outText)
	}
	if after, err := os.Stat(active.Path); err != nil || !os.SameFile(before, after) {
		t.Fatalf("the writer's active segment was replaced: %v", err)
	}
	fillFPMOffset(t, env.JS, first, more, 2, 2, 1_782_777_600_000)
	waitAcked(t, env, "live", first+more)
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(foreign); err != nil {
		t.Fatal(err)
	}
	outText, err = run(t, 120*time.Second, fpmbusBin, "trace", "verify", "--repair", "--include-active", "--server", env.Server.ClientURL(), out)
	if code := exitCode(err); code != 0 {
		t.Fatalf("verify --repair once the writer stopped: exit %d\n%s", code, outText)
	}
	checkTraceOnce(t, env.JS, out, first+more)
}

// copySegments copies the regular segment files under dir into a new directory and returns it.
func copySegments(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl.gz"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// Repairs that made things worse, each on a copy of one output whose writer pruned its oldest segments
// (--max-segments 4), the stream holding every message: a sealed segment replaced by a symbolic link
// is reported, and its lines are not restored into the segment before it (the link's target holds
// them: twice); damage at the start of the oldest segment left is healed from the stream, which holds
// every one of its lines; a symbolic link planted as the repair's temporary file is refused, nothing is
// written through it, and the segment stays a regular file.
func TestTraceVerifyRepairDoesNoHarm(t *testing.T) {
	t.Parallel()
	const total = 4000
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)
	src := t.TempDir()
	p := traceUntilAcked(t, env, filepath.Join(src, "fpm"), "pruned", total, "--max-segments", "4")
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	segs, err := tracefile.ListSegments(tracefile.SegmentPrefix(filepath.Join(src, "fpm"), "kw0"))
	if err != nil || len(segs) != 4 || segs[0].Index == 0 {
		t.Fatalf("kw0's segments after pruning: %+v, %v", segs, err)
	}
	oldest, middle := filepath.Base(segs[0].Path), filepath.Base(segs[1].Path)
	verify := func(t *testing.T, out string) (verifyJSON, int, string) {
		t.Helper()
		text, code := runSplit(t, 120*time.Second, fpmbusBin, "trace", "verify", "--repair", "--json", "--server", url, out)
		var rep verifyJSON
		if err := json.Unmarshal([]byte(text), &rep); err != nil && code != 1 {
			t.Fatalf("verify --repair: exit %d, %v\n%s", code, err, text)
		}
		return rep, code, text
	}
	lines := func(t *testing.T, dir string) int {
		n := 0
		files, _ := filepath.Glob(filepath.Join(dir, "*.jsonl.gz")) // a link is followed, as a reader does
		for _, f := range files {
			n += len(traceLines(t, f))
		}
		return n
	}
	pristine := lines(t, src)

	t.Run("a sealed segment replaced by a symbolic link", func(t *testing.T) {
		dir := copySegments(t, src)
		path := filepath.Join(dir, middle)
		moved := filepath.Join(t.TempDir(), middle)
		if err := os.Rename(path, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, path); err != nil {
			t.Fatal(err)
		}
		rep, code, _ := verify(t, filepath.Join(dir, "fpm"))
		if n := lines(t, dir); n != pristine {
			t.Fatalf("%d lines after the repair, %d before: the link's lines were restored next to it", n, pristine)
		}
		fs := rep.findings(path)
		if code != 1 || len(fs) != 1 || fs[0].Kind != tracefile.FindingNotRegular || rep.Repaired != 0 {
			t.Fatalf("exit %d, findings of the link %+v, repaired %d", code, fs, rep.Repaired)
		}
	})

	t.Run("damage at the start of the oldest segment after pruning", func(t *testing.T) {
		dir := copySegments(t, src)
		path := filepath.Join(dir, oldest)
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := memberStarts(t, orig)
		flipByte(t, path, int64(m[1]-8)) // the first member's CRC-32: its lines still read
		rep, code, _ := verify(t, filepath.Join(dir, "fpm"))
		fs := rep.findings(path)
		if code != 0 || len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealRestored || len(fs[0].Heal.Unconfirmed) != 0 {
			t.Fatalf("exit %d, findings %+v", code, fs)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.Join(segmentLines(t, got), nil), bytes.Join(segmentLines(t, orig), nil)) {
			t.Fatal("the healed segment's lines differ from the original's")
		}
	})

	t.Run("a symbolic link planted as the repair's temporary file", func(t *testing.T) {
		dir := copySegments(t, src)
		path := filepath.Join(dir, middle)
		orig, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := memberStarts(t, orig)
		flipByte(t, path, int64(m[1]+m[2])/2)
		victim := filepath.Join(t.TempDir(), "victim")
		if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, path+".verify.tmp"); err != nil {
			t.Fatal(err)
		}
		_, code, text := verify(t, filepath.Join(dir, "fpm"))
		if b, _ := os.ReadFile(victim); string(b) != "precious" {
			t.Fatalf("the repair wrote through the planted link: the file it points to holds %d bytes", len(b))
		}
		if fi, err := os.Lstat(path); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the segment is no longer a regular file: %v %v", fi, err)
		}
		if code != 1 || !strings.Contains(text, path+".verify.tmp") {
			t.Fatalf("exit %d, want 1 with the planted link named:\n%s", code, text)
		}
	})
}

// The trace writer's start-up repair cuts a torn tail through "<segment>.repair.tmp". A symbolic link
// planted under that name is refused and concerns that producer alone, as a lock file that cannot be
// had does: the writer starts and keeps running, writes nothing through the link, leaves the torn
// segment as it is (a regular file), and rejects that producer's messages (dead letters naming the
// link) while the other producer's are written.
func TestTraceWriterStartupRepairRefusesAPlantedTemporaryFile(t *testing.T) {
	t.Parallel()
	const total = 2000
	env := natsservertest.Start(t)
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	out := filepath.Join(t.TempDir(), "fpm")
	p := traceUntilAcked(t, env, out, "startup", total)
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	segs, err := tracefile.ListSegments(tracefile.SegmentPrefix(out, "kw0"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v %v", segs, err)
	}
	newest := segs[len(segs)-1].Path
	data, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	torn := data[:len(data)-5] // a crash inside the last member's trailer
	if err := os.WriteFile(newest, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := newest + ".repair.tmp"
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	// observed are the observed_at_unix_ms of a producer's lines (retention may have pruned old ones).
	observed := func(producer string) map[int64]bool {
		t.Helper()
		segs, err := tracefile.ListSegments(tracefile.SegmentPrefix(out, producer))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int64]bool{}
		for _, s := range segs {
			if err := tracefile.ReadSegment(s.Path, func(l []byte) error {
				tl, err := schemas.ParseTraceLine(l)
				if err == nil {
					seen[tl.Event.ObservedAtUnixMs] = true
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		return seen
	}

	// 100 more messages of each producer, to the writer started over the planted link.
	fillFPMOffset(t, env.JS, total, 200, 2, 2, 1_782_777_600_000)
	w := traceUntilAcked(t, env, out, "startup", total+200)
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the start-up repair wrote through the planted link: the file it points to holds %d bytes", len(b))
	}
	if fi, err := os.Lstat(newest); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the segment is no longer a regular file: %v %v", fi, err)
	}
	if got, _ := os.ReadFile(newest); !bytes.Equal(got, torn) {
		t.Fatal("the torn segment was changed")
	}
	dl := streamsMessages(t, env.JS, streams.StreamEvents, streams.ConsumerDeadLetterSubject("trace"))
	if len(dl) != 100 {
		t.Fatalf("%d dead letters, want the 100 new messages of kw0", len(dl))
	}
	for _, m := range dl {
		if subj := m.Headers().Get(streams.HeaderSubject); !strings.Contains(subj, ".kw0.") || !strings.Contains(m.Headers().Get(streams.HeaderError), link) {
			t.Fatalf("dead letter of %s: reason %q, want kw0's naming %s", subj, m.Headers().Get(streams.HeaderError), link)
		}
	}
	kw1 := observed("kw1")
	for i := total; i < total+200; i++ {
		if i%4 >= 2 && !kw1[1_782_777_600_000+int64(i)] { // fillFPM: kw1's messages, received at start + i
			t.Fatalf("kw1's message %d has no line: the other producer must go on", i)
		}
	}
	if !strings.Contains(w.Output(), "cannot be repaired") || !strings.Contains(w.Output(), link) {
		t.Fatalf("the writer does not log the refused producer naming the link:\n%s", w.Output())
	}
	if err := w.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("the writer did not keep running and stop cleanly: %v\n%s", err, w.Output())
	}
}
