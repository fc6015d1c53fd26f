package trace

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/internal/smalldisk"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// disk is a switchable fault: while a kind is on, every operation of that kind on every segment file
// the writer opens fails, as a full or broken disk does.
type disk struct {
	failWrite, failSync, failTruncate, failCreate atomic.Bool
	failures                                      atomic.Int64
}

func (d *disk) open(path string) (file, error) {
	if d.failCreate.Load() {
		d.failures.Add(1)
		return nil, &os.PathError{Op: "open", Path: path, Err: syscall.EACCES}
	}
	f, err := createFile(path)
	if err != nil {
		return nil, err
	}
	return &switchFile{file: f, d: d}, nil
}

func (d *disk) heal() {
	d.failWrite.Store(false)
	d.failSync.Store(false)
	d.failTruncate.Store(false)
	d.failCreate.Store(false)
}

type switchFile struct {
	file
	d *disk
}

func (f *switchFile) Write(p []byte) (int, error) {
	if f.d.failWrite.Load() {
		f.d.failures.Add(1)
		n, _ := f.file.Write(p[:len(p)/2]) // a torn member, as a full disk leaves it
		return n, syscall.ENOSPC
	}
	return f.file.Write(p)
}

func (f *switchFile) Sync() error {
	if f.d.failSync.Load() {
		f.d.failures.Add(1)
		return syscall.EIO
	}
	return f.file.Sync()
}

func (f *switchFile) Truncate(n int64) error {
	if f.d.failTruncate.Load() {
		f.d.failures.Add(1)
		return syscall.EIO
	}
	return f.file.Truncate(n)
}

// readableLines counts the lines readable in every segment under outputPath, stopping at a torn tail.
func readableLines(t *testing.T, outputPath string) int {
	t.Helper()
	producers, err := tracefile.Producers(outputPath)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range producers {
		segs, err := tracefile.ListSegments(tracefile.OutputBase(outputPath) + "." + p)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range segs {
			err := tracefile.ReadSegment(s.Path, func([]byte) error { n++; return nil })
			var ce *tracefile.CorruptError
			if err != nil && !errors.As(err, &ce) && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
	return n
}

func consumerInfo(t *testing.T, env *natsservertest.Env, durable string) (ackFloor, ackPending uint64) {
	t.Helper()
	c, err := env.JS.PushConsumer(context.Background(), streams.StreamFPM, durable)
	if err != nil {
		t.Fatal(err)
	}
	ci, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ci.AckFloor.Stream, uint64(ci.NumAckPending)
}

// While the disk fails, the writer acks nothing more, keeps the messages on the stream, retries with
// backoff, and when the disk is back writes every message exactly once, with no torn tail left in any
// segment. An outage longer than the ack wait redelivers nothing: the held messages are kept alive.
func TestWriteFailuresAreRetriedWithoutLossOrDuplicate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		fail    func(d *disk)
		ackWait time.Duration // > 0: the outage outlasts it, so held messages are redelivered meanwhile
	}{
		"disk full: short writes":            {fail: func(d *disk) { d.failWrite.Store(true) }},
		"i/o error: failing fsync":           {fail: func(d *disk) { d.failSync.Store(true) }},
		"failing fsync and failing cutback":  {fail: func(d *disk) { d.failSync.Store(true); d.failTruncate.Store(true) }},
		"unwritable directory: create fails": {fail: func(d *disk) { d.failCreate.Store(true) }},
		"an outage longer than the ack wait": {fail: func(d *disk) { d.failWrite.Store(true) }, ackWait: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			cfg := testConfig(t)
			cfg.RollBytes = 64 << 10 // new segments (creates) during the outage
			cfg.MaxSegments = 1000
			cfg.AckWait = tc.ackWait
			d := &disk{}
			w, err := New(logTo(retrying(cfg, time.Millisecond, 20*time.Millisecond), testLogger(t)), env.JS)
			if err != nil {
				t.Fatal(err)
			}
			w.set.open = d.open
			r := runConsumer(t, w)

			keys := testKeys(4)
			a, pubA := manyFPMs(t, keys, 1000, 1_782_777_600_000)
			publish(t, env.JS, a)
			waitConsumed(t, env.JS, cfg.Group)

			tc.fail(d)
			b, pubB := manyFPMs(t, keys, 1000, 1_782_777_700_000)
			for i := range pubB {
				pubB[i].counter += 250
				b[i] = pubB[i].msg(t)
			}
			publish(t, env.JS, b)
			deadline := time.Now().Add(20 * time.Second)
			for counterValue(t, r.w.metrics.retries) < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("no retries: %d failures", d.failures.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
			floor, pending := consumerInfo(t, env, cfg.Group)
			if floor != 1000 || pending == 0 {
				t.Fatalf("during the outage: ack floor %d (want 1000: nothing more acked), ack pending %d", floor, pending)
			}
			if n := readableLines(t, cfg.OutputPath); uint64(n) < floor {
				t.Fatalf("%d lines readable but %d messages acked", n, floor)
			}
			if tc.ackWait > 0 {
				time.Sleep(3 * tc.ackWait) // without in-progress acks the server would redeliver what the writer holds
				if floor, pending := consumerInfo(t, env, cfg.Group); floor != 1000 || pending == 0 {
					t.Fatalf("after 3 ack waits of outage: ack floor %d, ack pending %d: the case did not test what it should", floor, pending)
				}
			}

			d.heal()
			ci := waitConsumed(t, env.JS, cfg.Group)
			if err := r.stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			// outputLines fails on any torn segment.
			checkExactlyOnce(t, outputLines(t, cfg.OutputPath), append(pubA, pubB...), schemas.CaptureFull)
			if ci.NumRedelivered != 0 || counterValue(t, w.metrics.skippedWritten) != 0 {
				t.Fatalf("%d messages redelivered during the outage: held messages must be kept alive", ci.NumRedelivered)
			}
		})
	}
}

// Stopping while the disk is still full gives the blocked flush up at the stop timeout: nothing it
// held is acked, and the next run (disk back) writes those messages exactly once.
func TestStopWhileDiskFullLeavesMessagesUnacked(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig(t)
	cfg.StopTimeout = 300 * time.Millisecond
	d := &disk{}
	w, err := New(logTo(retrying(cfg, time.Millisecond, 10*time.Millisecond), testLogger(t)), env.JS, durable.WithMemberID("test-"+cfg.Group))
	if err != nil {
		t.Fatal(err)
	}
	w.set.open = d.open
	r := runConsumer(t, w)
	msgs, published := manyFPMs(t, testKeys(2), 500, 1_782_777_600_000)
	d.failWrite.Store(true)
	publish(t, env.JS, msgs)
	for d.failures.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	err = r.stop()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Run = %v, want the ENOSPC it gave up on", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("stop took %v with a stop timeout of %v", took, cfg.StopTimeout)
	}
	if floor, _ := consumerInfo(t, env, cfg.Group); floor != 0 {
		t.Fatalf("ack floor %d after a run that made nothing durable", floor)
	}
	d.heal()
	r2 := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
}

// A segment that exists already (another writer owns the producer) is not retried: Run fails, and
// nothing is acknowledged.
func TestSegmentOwnedByAnotherWriterFailsRun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	cfg := testConfig(t)
	w, err := New(logTo(retrying(cfg, time.Millisecond, 10*time.Millisecond), testLogger(t)), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	w.set.open = func(path string) (file, error) {
		touch(t, path) // the other writer wins the race for the name
		return createFile(path)
	}
	msgs, _ := manyFPMs(t, testKeys(1), 10, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = w.Run(ctx)
	if !errors.Is(err, os.ErrExist) {
		t.Fatalf("Run = %v, want os.ErrExist", err)
	}
	if floor, _ := consumerInfo(t, env, cfg.Group); floor != 0 {
		t.Fatalf("ack floor %d after a failed run", floor)
	}
}

// The SegmentWriter level: a chunk whose write fails is written again, after the segment was cut back
// to its fsynced members, into the same segment (a failed write opens no segment); the torn half of
// the failed member is gone.
func TestWriteBatchRetryCutsBackAndWritesTheSameSegment(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "t.w")
	w, err := newDefaultSegmentWriter(prefix, 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	d := &disk{}
	w.open = d.open
	var sizeAtRetry int64
	appendFlush := func(lines ...string) error {
		for _, l := range lines {
			if err := w.Append([]byte(l)); err != nil {
				return err
			}
		}
		b := w.detach()
		err := w.writeBatchRetry(b, nil, retryPolicy(time.Millisecond, time.Millisecond)(), func(*SegmentWriter, error, time.Duration) {
			sizeAtRetry = fileSize(t, tracefile.SegmentPath(prefix, 0))
			d.heal() // the next attempt succeeds
		})
		return w.complete(b, err)
	}
	if err := appendFlush("a", "b"); err != nil {
		t.Fatal(err)
	}
	size0 := fileSize(t, tracefile.SegmentPath(prefix, 0))
	d.failWrite.Store(true)
	if err := appendFlush("c", "d"); err != nil {
		t.Fatal(err)
	}
	if sizeAtRetry <= size0 {
		t.Fatalf("the failed write left %d bytes, %d before it: no torn member to cut", sizeAtRetry, size0)
	}
	if err := appendFlush("e"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := prefixLines(t, prefix)
	if len(got) != 1 || strings.Join(got[0], " ") != "a b c d e" {
		t.Fatalf("segments %v, want 0: [a b c d e]", got)
	}
	if w.Durable() != 5 {
		t.Fatalf("durable %d, want 5", w.Durable())
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A writer started while its output's disk is full (a real filesystem with no space left) neither fails
// nor reads anything: it waits for space, not ready, and once space is freed it starts and writes every
// FPM once. In `fpmbus up` a full disk at start used to disable the trace writer for the process's life.
func TestWriterStartedOnAFullDiskStartsWhenSpaceReturns(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	msgs, published := manyFPMs(t, testKeys(2), 40, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	dir := smalldisk.Mount(t, 1<<20)
	cfg.OutputPath = filepath.Join(dir, "trace", "dynamo-fpm.jsonl.gz")
	if err := os.MkdirAll(filepath.Dir(cfg.OutputPath), 0o755); err != nil {
		t.Fatal(err)
	}
	free := smalldisk.Fill(t, dir)
	cfg.RetryInitial, cfg.RetryMax = 20*time.Millisecond, 50*time.Millisecond
	waiting := &signalOn{Handler: testLogger(t).Handler(), prefix: "trace output's disk is full", seen: make(chan struct{})}
	w, err := New(logTo(cfg, slog.New(waiting)), env.JS, durable.WithMemberID("test-"+cfg.Group))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- w.Run(ctx); close(finished) }()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	// The probe failed with no space left (the writer says so): it is waiting, not failed, not ready.
	select {
	case <-waiting.seen:
	case err := <-done:
		t.Fatalf("the writer ended on a full disk: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the writer never probed the full disk")
	}
	select {
	case err := <-done:
		t.Fatalf("the writer ended on a full disk: %v", err)
	case <-w.Ready():
		t.Fatal("the writer is ready on a full disk")
	default:
	}
	free()
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("the writer ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the writer did not start within 30s of space returning")
	}
	waitConsumed(t, env.JS, cfg.Group)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
}

// signalOn is a log handler that closes seen at the first record whose message begins with prefix: a
// point to synchronise on, the test's verdict coming from the writer's outputs.
type signalOn struct {
	slog.Handler
	prefix string
	seen   chan struct{}
	once   sync.Once
}

func (h *signalOn) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(func() { close(h.seen) })
	}
	return h.Handler.Handle(ctx, r)
}

func (h *signalOn) WithAttrs(as []slog.Attr) slog.Handler {
	return &signalOn{Handler: h.Handler.WithAttrs(as), prefix: h.prefix, seen: h.seen}
}

func (h *signalOn) WithGroup(name string) slog.Handler {
	return &signalOn{Handler: h.Handler.WithGroup(name), prefix: h.prefix, seen: h.seen}
}
