package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// runSplit runs a command to completion and returns its stdout alone (stderr is shown on failure) and
// its exit status.
func runSplit(t *testing.T, d time.Duration, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = testEnv(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0
	case errors.As(err, &ee):
		t.Logf("%s %s: exit %d, stderr:\n%s", filepath.Base(bin), strings.Join(args, " "), ee.ExitCode(), stderr.String())
		return stdout.String(), ee.ExitCode()
	}
	t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	return "", 0
}

// segmentLines decompresses a segment (the standard library's multi-member reader) into its lines.
func segmentLines(t *testing.T, data []byte) [][]byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	content, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(bytes.TrimSuffix(content, []byte{'\n'}), []byte{'\n'})
}

// memberStarts returns the offsets of a segment's gzip members (each is read to its end: the standard
// reader reads one member at a time with multistream off).
func memberStarts(t *testing.T, data []byte) []int {
	t.Helper()
	var out []int
	br := bytes.NewReader(data)
	for br.Len() > 0 {
		out = append(out, len(data)-br.Len())
		zr, err := gzip.NewReader(br)
		if err != nil {
			t.Fatal(err)
		}
		zr.Multistream(false)
		if _, err := io.Copy(io.Discard, zr); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// verifyJSON is the part of `trace verify --json` the test reads.
type verifyJSON struct {
	Producers []struct {
		Segments []struct {
			Path     string              `json:"path"`
			Active   bool                `json:"active"`
			Repaired bool                `json:"repaired"`
			Findings []tracefile.Finding `json:"findings"`
		} `json:"segments"`
	} `json:"producers"`
	Damaged   int `json:"damaged"`
	Repaired  int `json:"repaired"`
	Remaining int `json:"remaining"`
}

func (v verifyJSON) findings(path string) []tracefile.Finding {
	for _, p := range v.Producers {
		for _, s := range p.Segments {
			if s.Path == path {
				return s.Findings
			}
		}
	}
	return nil
}

// `fpmbus trace verify` finds flipped bytes and truncations in segments the real writer wrote (exit 1,
// file and byte range), `--repair` restores them from the stream — every line back, its event
// byte-identical, intact lines untouched, a timestamp lost with its bytes never later than the original
// (the writer's clock ran: TestVerifyRepairsFromTheStream in consumers/trace shows byte-identical
// content with a frozen one), every line byte-identical where the damage left the lines readable — and
// after a purge it reports the lines the stream no longer holds by key and counter_id, leaving the bytes
// as they are. `trace info` prints the recording's replay figures.
func TestTraceVerifyRepairsFromTheStream(t *testing.T) {
	t.Parallel()
	const total = 4000
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)
	dir := t.TempDir()
	output := filepath.Join(dir, "fpm")
	p := fpmbus(t, "fpmbus trace", "trace", "--server", url, "--trace-mode", "full", "--trace-output", output,
		"--group", "verify", "--roll-bytes", "60000", "--max-segments", "1000", "--trace-max-ack-pending", "40", "--trace-flush-interval", "50ms")
	eventually(t, 60*time.Second, func() error {
		c, err := env.JS.PushConsumer(t.Context(), streams.StreamFPM, "verify")
		if err != nil {
			return err
		}
		ci, err := c.Info(t.Context())
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream != total {
			return fmt.Errorf("ack floor %d", ci.AckFloor.Stream)
		}
		return nil
	})
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("writer: %v", err)
	}
	pristine := map[string][]byte{}
	files, _ := filepath.Glob(output + ".*.jsonl.gz")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pristine[f] = data
	}
	seg := func(producer string, i uint64) string {
		s := tracefile.SegmentPath(tracefile.SegmentPrefix(output, producer), i)
		if _, ok := pristine[s]; !ok {
			t.Fatalf("no segment %s among %d files: %v", s, len(pristine), files)
		}
		return s
	}
	flipped, truncated := seg("kw0", 1), seg("kw1", 3)
	seg("kw0", 6)
	seg("kw1", 6)
	damage := func(path string, mutate func(data []byte, m []int) []byte) {
		t.Helper()
		m := memberStarts(t, pristine[path])
		if len(m) < 4 {
			t.Fatalf("%s has %d members, want at least 4", path, len(m))
		}
		if err := os.WriteFile(path, mutate(bytes.Clone(pristine[path]), m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	damage(flipped, func(data []byte, m []int) []byte {
		data[(m[1]+m[2])/2] ^= 0xff
		return data
	})
	damage(truncated, func(data []byte, m []int) []byte { return data[:(m[2]+m[3])/2] })
	// Two damages that leave every line readable, so every timestamp is read back: a flipped bit in a
	// member's CRC-32, and a file cut inside its last member's trailer.
	crc, cut := seg("kw0", 4), seg("kw1", 5)
	damage(crc, func(data []byte, m []int) []byte {
		data[m[2]-8] ^= 0x01
		return data
	})
	damage(cut, func(data []byte, m []int) []byte { return data[:len(data)-3] })

	// The files alone: exit 1, both damages with their file and byte range.
	out, code := runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", output)
	if code != 1 || !strings.Contains(out, filepath.Base(flipped)+": ") || !strings.Contains(out, "gzip at bytes ") ||
		!strings.Contains(out, "truncated at bytes ") || !strings.Contains(out, "4 finding(s), 4 remain") {
		t.Fatalf("verify: exit %d\n%s", code, out)
	}
	out, code = runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--json", output)
	var rep verifyJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 {
		t.Fatalf("verify --json: exit %d, %v\n%s", code, err, out)
	}
	for path, kind := range map[string]string{flipped: tracefile.FindingGzip, truncated: tracefile.FindingTruncated, crc: tracefile.FindingGzip, cut: tracefile.FindingTruncated} {
		fs := rep.findings(path)
		if len(fs) != 1 || fs[0].Kind != kind || fs[0].Offset <= 0 || fs[0].End <= fs[0].Offset {
			t.Fatalf("%s: findings %+v, want one %s with its byte range", path, fs, kind)
		}
	}

	// --repair: exit 0, both restored.
	out, code = runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--repair", "--json", "--server", url, output)
	rep = verifyJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || rep.Repaired != 4 || rep.Remaining != 0 {
		t.Fatalf("verify --repair: exit %d, %v\n%s", code, err, out)
	}
	for _, path := range []string{flipped, truncated, crc, cut} {
		fs := rep.findings(path)
		if len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealRestored || fs[0].Heal.Lines == 0 {
			t.Fatalf("%s: %+v", path, fs)
		}
		h := fs[0].Heal
		want, got := segmentLines(t, pristine[path]), segmentLines(t, mustRead(t, path))
		if len(got) != len(want) {
			t.Fatalf("%s: %d lines after the repair, %d written", path, len(got), len(want))
		}
		t.Logf("%s: heal %+v", filepath.Base(path), *h)
		changed := 0
		for i := range want {
			if bytes.Equal(got[i], want[i]) {
				continue
			}
			changed++
			w, g := parseLine(t, want[i]), parseLine(t, got[i])
			ew, _ := json.Marshal(w.Event)
			eg, _ := json.Marshal(g.Event)
			if !bytes.Equal(ew, eg) || g.Timestamp > w.Timestamp {
				t.Fatalf("%s line %d: restored %s, written %s", path, i+1, got[i], want[i])
			}
		}
		if changed > h.TimestampsEstimated || h.TimestampsExact+h.TimestampsEstimated != h.Lines {
			t.Fatalf("%s: %d lines differ from the originals (in their timestamp only), heal %+v", path, changed, h)
		}
		if (path == crc || path == cut) && (changed != 0 || h.TimestampsEstimated != 0) {
			t.Fatalf("%s: every line was readable, yet %d differ from the originals: heal %+v", path, changed, h)
		}
	}
	for path, data := range pristine {
		if path != flipped && path != truncated && path != crc && path != cut && !bytes.Equal(mustRead(t, path), data) {
			t.Fatalf("%s changed", path)
		}
	}
	if out, code := runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--stream", "--server", url, output); code != 0 ||
		!strings.Contains(out, "0 finding(s)") {
		t.Fatalf("verify --stream after the repair: exit %d\n%s", code, out)
	}

	// trace info: the replay figures of what the segments hold.
	out, code = runSplit(t, 60*time.Second, fpmbusBin, "trace", "info", "--json", dir)
	var info struct {
		Recorded struct {
			Records   int     `json:"records"`
			DurationS float64 `json:"duration_s"`
			Ranks     []struct {
				Producer string  `json:"producer"`
				Records  int     `json:"records"`
				P50      float64 `json:"inter_arrival_p50_ms"`
			} `json:"ranks"`
		} `json:"recorded"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || code != 0 {
		t.Fatalf("trace info --json: exit %d, %v\n%s", code, err, out)
	}
	if r := info.Recorded; r.Records != total || len(r.Ranks) != 4 || r.DurationS != float64(total-1)/1000 || r.Ranks[0].Records != total/4 || r.Ranks[0].P50 != 4 {
		t.Fatalf("trace info recorded %+v: want %d records over %.3fs, 4 ranks of %d, one every 4 ms", r, total, float64(total-1)/1000, total/4)
	}
	if out, code := runSplit(t, 60*time.Second, fpmbusBin, "trace", "info", dir); code != 0 || !strings.Contains(out, "recorded: 4000 records over 3.999s") ||
		!strings.Contains(out, "inter-arrival p50") {
		t.Fatalf("trace info: exit %d\n%s", code, out)
	}

	// After a purge the stream holds none of the lost lines: they are reported by key and counter_id.
	purged := seg("kw0", 5)
	damage(purged, func(data []byte, m []int) []byte { return data[:(m[1]+m[2])/2] })
	damaged := mustRead(t, purged)
	s, err := env.JS.Stream(t.Context(), streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	out, code = runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--repair", "--json", "--server", url, output)
	rep = verifyJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || rep.Remaining != 1 {
		t.Fatalf("verify --repair after a purge: exit %d, %v\n%s", code, err, out)
	}
	fs := rep.findings(purged)
	if len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealIncomplete {
		t.Fatalf("%s after a purge: %+v", purged, fs)
	}
	if !bytes.Equal(mustRead(t, purged), damaged) {
		t.Fatal("a segment the stream cannot restore was rewritten")
	}
	var lost, reported []string
	kept := len(segmentLines(t, damaged[:memberStarts(t, pristine[purged])[1]]))
	for _, l := range segmentLines(t, pristine[purged])[kept:] {
		f, err := schemas.ParseFPMJSON(parseLine(t, l).Event.FPM)
		if err != nil {
			t.Fatal(err)
		}
		lost = append(lost, fmt.Sprintf("%s/%d/%d", f.WorkerID, f.DPRank, f.CounterID))
	}
	for _, m := range fs[0].Heal.Missing {
		for c := m.CounterFrom; c >= 0 && c <= m.CounterTo; c++ {
			reported = append(reported, fmt.Sprintf("%s/%d/%d", m.WorkerID, m.DPRank, c))
		}
	}
	for _, u := range fs[0].Heal.Unconfirmed {
		reported = append(reported, fmt.Sprintf("%s/%d/%d", u.WorkerID, u.DPRank, u.CounterID))
	}
	slices.Sort(lost)
	slices.Sort(reported)
	if len(lost) == 0 || !slices.Equal(lost, reported) {
		t.Fatalf("lost %v, reported %v", lost, reported)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func parseLine(t *testing.T, line []byte) *schemas.TraceLine {
	t.Helper()
	l, err := schemas.ParseTraceLine(line)
	if err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	return l
}

// A stream message traced twice — a line copied into a later sealed segment, as a backfill rerun by an
// older fpmbus left it — is reported by `trace verify --stream` (exit 1, kind duplicate, the copy's
// file and line, naming the line it repeats) and removed by `--repair`: the segment is rewritten
// without the copy, every other line byte for byte, and afterwards every message of the stream is in
// the files exactly once, in stream order.
func TestTraceVerifyRemovesAMessageTracedTwice(t *testing.T) {
	t.Parallel()
	const total = 3000
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)
	output := filepath.Join(t.TempDir(), "fpm")
	if out, err := run(t, 60*time.Second, fpmbusBin, "trace", "backfill", "--server", url, "--trace-mode", "full", "--trace-output", output,
		"--roll-bytes", "60000", "--max-segments", "1000", "--start-seq", "1", "--progress", "none"); err != nil {
		t.Fatalf("backfill: %v\n%s", err, out)
	}
	prefix := tracefile.SegmentPrefix(output, "kw0")
	first, second := tracefile.SegmentPath(prefix, 0), tracefile.SegmentPath(prefix, 1)
	if _, err := os.Stat(tracefile.SegmentPath(prefix, 2)); err != nil {
		t.Fatalf("want at least three segments of kw0, so that segment 1 is sealed: %v", err)
	}
	original := mustRead(t, second)
	// The copy carries the timestamp of the segment's last line, as a line a later writer appended
	// would: only the stream tells it is a copy.
	lines := segmentLines(t, original)
	copied := parseLine(t, segmentLines(t, mustRead(t, first))[9])
	copied.Timestamp = parseLine(t, lines[len(lines)-1]).Timestamp
	copiedLine := append(schemas.AppendTraceLine(nil, copied), '\n')
	var member bytes.Buffer
	zw := gzip.NewWriter(&member)
	_, _ = zw.Write(copiedLine)
	_ = zw.Close()
	planted := append(bytes.Clone(original), member.Bytes()...)
	if err := os.WriteFile(second, planted, 0o644); err != nil {
		t.Fatal(err)
	}
	wantLines := len(lines) + 1

	out, code := runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--stream", "--json", "--server", url, output)
	var rep verifyJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 1 || rep.Remaining != 1 {
		t.Fatalf("verify --stream: exit %d, %v\n%s", code, err, out)
	}
	fs := rep.findings(second)
	if len(fs) != 1 || fs[0].Kind != tracefile.FindingDuplicate || fs[0].Line != wantLines || !strings.Contains(fs[0].Reason, "line 10 of "+first) {
		t.Fatalf("%s: findings %+v, want one duplicate at line %d naming line 10 of %s", second, fs, wantLines, first)
	}
	if !bytes.Equal(mustRead(t, second), planted) {
		t.Fatal("verify --stream wrote")
	}

	out, code = runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--repair", "--json", "--server", url, output)
	rep = verifyJSON{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || rep.Repaired != 1 || rep.Remaining != 0 {
		t.Fatalf("verify --repair: exit %d, %v\n%s", code, err, out)
	}
	if fs := rep.findings(second); len(fs) != 1 || fs[0].Heal == nil || fs[0].Heal.Status != tracefile.HealRestored {
		t.Fatalf("%s after the repair: %+v", second, fs)
	}
	got, want := segmentLines(t, mustRead(t, second)), segmentLines(t, original)
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines after the repair, want the %d written", second, len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%s line %d changed: %s, written %s", second, i+1, got[i], want[i])
		}
	}
	checkFullLines(t, streamSeqs(t, env.JS), output, 1, total)
	if out, code := runSplit(t, 60*time.Second, fpmbusBin, "trace", "verify", "--stream", "--server", url, output); code != 0 {
		t.Fatalf("verify --stream after the repair: exit %d\n%s", code, out)
	}
}
