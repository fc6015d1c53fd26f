package trace

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// A symbolic link planted as the start-up repair's temporary file of one producer's torn segment
// (<segment>.repair.tmp) refuses that producer alone, as a lock file that cannot be had does: the
// writer starts, never writes through the link, leaves the torn segment as it is and rejects that
// producer's messages (dead letters naming the link), while the other producer is written. Once the
// link is removed, the producer's next message after a Tick repairs the segment, and its messages are
// written again, without a restart.
func TestStartupRepairRefusedByAPlantedTemporaryFileRefusesOnlyItsProducer(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	keys := testKeys(4) // producers w0 and w1, two ranks each
	batch := func(n int, counterFrom int64, startMs int64) ([]*nats.Msg, []testFPM) {
		_, fs := manyFPMs(t, keys, n, startMs)
		msgs := make([]*nats.Msg, len(fs))
		for i := range fs {
			fs[i].counter += counterFrom
			msgs[i] = fs[i].msg(t)
		}
		return msgs, fs
	}
	// Two flushes: each producer's segment holds two gzip members, the repair keeps the first.
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	for i := range int64(2) {
		msgs, _ := batch(20, 10*i, 1_782_777_600_000+100*i)
		publish(t, env.JS, msgs)
		waitConsumed(t, env.JS, cfg.Group)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// A crash inside the last member of w0's newest segment, and a link planted under the name its
	// repair writes.
	segs, err := tracefile.ListSegments(tracefile.SegmentPrefix(cfg.OutputPath, "w0"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("w0's segments: %v %v", segs, err)
	}
	newest := segs[len(segs)-1].Path
	data, err := os.ReadFile(newest)
	if err != nil {
		t.Fatal(err)
	}
	torn := data[:len(data)-5]
	if err := os.WriteFile(newest, torn, 0o644); err != nil {
		t.Fatal(err)
	}
	victim := t.TempDir() + "/victim"
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := newest + tracefile.RepairTmpSuffix
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}

	second, fs2 := batch(40, 20, 1_782_777_700_000)
	publish(t, env.JS, second)
	r = startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the start-up repair wrote through the planted link: %q", b)
	}
	if got, _ := os.ReadFile(newest); !bytes.Equal(got, torn) {
		t.Fatal("the torn segment was changed")
	}
	dl := deadLetters(t, env.JS)
	if len(dl) != 20 {
		t.Fatalf("%d dead letters, want the 20 messages of w0", len(dl))
	}
	for _, m := range dl {
		if s := m.Headers().Get(streams.HeaderSubject); !strings.HasPrefix(s, "fpm.dynamo.backend.w0.") || !strings.Contains(m.Headers().Get(streams.HeaderError), link) {
			t.Fatalf("dead letter of %s: reason %q, want w0's naming %s", s, m.Headers().Get(streams.HeaderError), link)
		}
	}
	w1 := observed(t, tracefile.SegmentPrefix(cfg.OutputPath, "w1"))
	for _, f := range fs2 {
		if f.key.WorkerID == "w1" && !w1[f.receivedMs] {
			t.Fatalf("w1's message observed at %d has no line", f.receivedMs)
		}
	}

	// What was planted is removed: w0's next message after a Tick repairs its segment and is written.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	third, fs3 := batch(40, 40, 1_782_777_800_000)
	publish(t, env.JS, third)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r.stop(); err != nil {
		t.Fatalf("the writer ended: %v", err)
	}
	if n := len(deadLetters(t, env.JS)); n != 20 {
		t.Fatalf("%d dead letters after the link was removed, want still 20", n)
	}
	if res, err := tracefile.Repair(newest, nil); err != nil || res.Repaired {
		t.Fatalf("w0's torn segment was not repaired: %+v %v", res, err)
	}
	lines := map[string]map[int64]bool{"w0": observed(t, tracefile.SegmentPrefix(cfg.OutputPath, "w0")), "w1": observed(t, tracefile.SegmentPrefix(cfg.OutputPath, "w1"))}
	for _, f := range fs2 {
		if f.key.WorkerID == "w0" && lines["w0"][f.receivedMs] {
			t.Fatalf("w0's rejected message observed at %d has a line", f.receivedMs)
		}
	}
	for _, f := range fs3 {
		if !lines[f.key.WorkerID][f.receivedMs] {
			t.Fatalf("%s's message observed at %d has no line after the repair", f.key.WorkerID, f.receivedMs)
		}
	}
}

// observed reads every segment of prefix: the observed_at_unix_ms of its lines.
func observed(t *testing.T, prefix string) map[int64]bool {
	t.Helper()
	segs, err := tracefile.ListSegments(prefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, s := range segs {
		if err := tracefile.ReadSegment(s.Path, func(l []byte) error {
			tl, err := schemas.ParseTraceLine(l)
			if err == nil {
				out[tl.Event.ObservedAtUnixMs] = true
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
