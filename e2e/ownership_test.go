package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/fsutil/locktest"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// A second `fpmbus up` on a data directory in use is refused at start (exit 1), naming the first
// (pid, command), and the first runs on undisturbed; once the first is killed with SIGKILL its
// successor takes the directory over at once and says whose it was.
func TestSecondUpOnADataDirIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	args := func(listen string) []string {
		return []string{"up", "--listen", listen, "--data-dir", data, "--trace-output", filepath.Join(dir, "trace", "fpm"),
			"--fpm-port", strconv.Itoa(producertest.FreeBasePort(t, "", 1)), "--dp-size", "1"}
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	first := fpmbus(t, "fpmbus up (first)", args(listen)...)
	first.waitOutput("bridge ready", 60*time.Second)
	out, err := run(t, 60*time.Second, fpmbusBin, args(fmt.Sprintf("127.0.0.1:%d", freePort(t)))...)
	if code := exitCode(err); code != 1 || !strings.Contains(out, "--data-dir "+data+" is in use") ||
		!strings.Contains(out, fmt.Sprintf("pid %d", first.cmd.Process.Pid)) || !strings.Contains(out, "fpmbus up") {
		t.Fatalf("second up on %s: exit %d, want 1 naming the first (pid %d):\n%s", data, code, first.cmd.Process.Pid, out)
	}
	select {
	case <-first.done:
		t.Fatalf("the first up stopped: %v", first.err)
	default:
	}
	js := jsClient(t, "nats://"+listen)
	if _, err := js.Stream(t.Context(), streams.StreamFPM); err != nil {
		t.Fatalf("the first up's store after the refusal: %v", err)
	}
	pid := first.cmd.Process.Pid
	_ = first.signal(syscall.SIGKILL, 10*time.Second)
	next := fpmbus(t, "fpmbus up (after kill -9)", args(listen)...)
	next.waitOutput("bridge ready", 60*time.Second)
	if o := next.Output(); !strings.Contains(o, "taken over") || !strings.Contains(o, fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("the successor did not name the killed owner (pid %d):\n%s", pid, o)
	}
	if err := next.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// fpmbus's trace writer and a worker's own in-process trace writer refuse each other: while a process
// holds a producer's prefix lock the way Dynamo's writer does, `fpmbus trace` writes the other
// producers and rejects that producer's messages (dead letters naming the lock), creating none of its
// files; a Dynamo-style writer is refused the prefix fpmbus writes; once the worker lets go, fpmbus
// writes the producer again.
func TestTraceWriterAndDynamosOwnWriterRefuseEachOther(t *testing.T) {
	t.Parallel()
	const half, startMs = 400, 1_782_777_600_000
	env := natsservertest.Start(t)
	out := filepath.Join(t.TempDir(), "fpm")
	kw0, kw1 := tracefile.SegmentPrefix(out, "kw0"), tracefile.SegmentPrefix(out, "kw1")
	worker := locktest.Start(t, tracefile.PrefixLockPath(kw0), locktest.DynamoShared)
	if !worker.Held {
		t.Fatalf("Dynamo-style holder: %s", worker.Refused)
	}
	fillFPM(t, env.JS, half, 2, 2, startMs)
	p := fpmbus(t, "fpmbus trace", "trace", "--server", env.Server.ClientURL(), "--trace-mode", "full", "--trace-output", out,
		"--group", "own", "--trace-flush-interval", "50ms")
	eventually(t, 60*time.Second, func() error {
		if _, floor, _ := consumerState(t, env.JS, "own", half); floor != half {
			return fmt.Errorf("ack floor %d of %d", floor, half)
		}
		return nil
	})
	if segs, _ := tracefile.ListSegments(kw0); len(segs) != 0 {
		t.Fatalf("fpmbus wrote %d segments of a prefix the worker holds", len(segs))
	}
	if segs, _ := tracefile.ListSegments(kw1); len(segs) == 0 {
		t.Fatal("the other producer was not written")
	}
	dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(trace.ConsumerName))
	if len(dl) != half/2 {
		t.Fatalf("%d dead letters, want the held producer's %d", len(dl), half/2)
	}
	if reason := dl[0].Headers().Get(streams.HeaderError); !strings.Contains(reason, tracefile.PrefixLockPath(kw0)) ||
		!strings.Contains(reason, fmt.Sprintf("pid %d", worker.PID())) {
		t.Fatalf("dead letter reason %q: want the lock and its holder (pid %d)", reason, worker.PID())
	}
	if d := locktest.Start(t, tracefile.PrefixLockPath(kw1), locktest.DynamoShared); d.Held || !strings.Contains(d.Refused, syscall.EWOULDBLOCK.Error()) {
		t.Fatalf("a Dynamo-style writer on the prefix fpmbus writes: held %v, %q", d.Held, d.Refused)
	}
	worker.Release()
	// The refused producer is tried again at the writer's next tick: published in steps, its
	// messages are written again from then on.
	total := half
	for written := false; !written; {
		if total >= 20*half {
			t.Fatalf("producer kw0 not written after the worker let go (%d messages)", total)
		}
		fillFPMOffset(t, env.JS, total, 40, 2, 2, startMs)
		total += 40
		eventually(t, 60*time.Second, func() error {
			if _, floor, _ := consumerState(t, env.JS, "own", uint64(total)); floor != uint64(total) {
				return fmt.Errorf("ack floor %d of %d", floor, total)
			}
			return nil
		})
		segs, _ := tracefile.ListSegments(kw0)
		written = len(segs) > 0
	}
	if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	lines := 0
	files, _ := filepath.Glob(kw0 + ".*.jsonl.gz")
	for _, f := range files {
		lines += len(traceLines(t, f))
	}
	if rejected := len(natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(trace.ConsumerName))); lines+rejected != total/2 {
		t.Fatalf("producer kw0 after the worker let go: %d lines and %d rejected of %d", lines, rejected, total/2)
	}
}
