package trace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/durable/durabletest"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// ownership records which instance has a segment file of each producer open, and every time two
// instances had one producer's files open at once.
type ownership struct {
	mu         sync.Mutex
	open       map[string]map[string]int // prefix -> instance -> open files
	violations []string
	opened     map[string][]string // prefix -> instance of each segment opened, in order
}

type trackedFile struct {
	file
	o        *ownership
	prefix   string
	instance string
	once     sync.Once
}

func (f *trackedFile) Close() error {
	err := f.file.Close()
	f.once.Do(func() {
		f.o.mu.Lock()
		defer f.o.mu.Unlock()
		f.o.open[f.prefix][f.instance]--
		if f.o.open[f.prefix][f.instance] == 0 {
			delete(f.o.open[f.prefix], f.instance)
		}
	})
	return err
}

func (o *ownership) opener(instance string) func(string) (file, error) {
	return func(path string) (file, error) {
		f, err := createFile(path)
		if err != nil {
			return nil, err
		}
		// path is <prefix>.<index:06>.jsonl.gz
		prefix := strings.TrimSuffix(path, ".jsonl.gz")
		prefix = prefix[:strings.LastIndexByte(prefix, '.')]
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.open[prefix] == nil {
			o.open[prefix] = map[string]int{}
		}
		for other, n := range o.open[prefix] {
			if other != instance && n > 0 {
				o.violations = append(o.violations, fmt.Sprintf("%s opened %s while %s has %d file(s) of it open", instance, filepath.Base(path), other, n))
			}
		}
		o.open[prefix][instance]++
		o.opened[prefix] = append(o.opened[prefix], instance)
		return &trackedFile{file: f, o: o, prefix: prefix, instance: instance}, nil
	}
}

// groupInstance is one writer of the group on its own connection.
type groupInstance struct {
	name   string
	nc     *nats.Conn
	w      *Consumer
	cancel context.CancelFunc
	done   chan error
}

func startGroupInstance(t *testing.T, env *natsservertest.Env, cfg Config, name string, o *ownership) *groupInstance {
	t.Helper()
	nc, err := nats.Connect(env.Server.ClientURL(), nats.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(logTo(cfg, testLogger(t).With("instance", name)), js, durable.WithMemberID(name))
	if err != nil {
		t.Fatal(err)
	}
	w.set.open = o.opener(name)
	ctx, cancel := context.WithCancel(context.Background())
	gi := &groupInstance{name: name, nc: nc, w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { gi.done <- w.Run(ctx) }()
	select {
	case <-w.Ready():
	case err := <-gi.done:
		cancel()
		t.Fatalf("%s did not start: %v", name, err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("%s not ready after 10s", name)
	}
	t.Cleanup(func() { _ = gi.stop() })
	return gi
}

// stop leaves the group gracefully and returns Run's result (once).
func (gi *groupInstance) stop() error {
	if gi.cancel == nil {
		return nil
	}
	gi.cancel()
	gi.cancel = nil
	select {
	case err := <-gi.done:
		return err
	case <-time.After(60 * time.Second):
		return errors.New(gi.name + " did not stop within 60s")
	}
}

// kill closes the instance's connection: its partitions are lost, not handed over.
func (gi *groupInstance) kill(t *testing.T) {
	gi.nc.Close()
	select {
	case err := <-gi.done:
		if err == nil {
			t.Errorf("%s: Run returned nil after its connection was closed", gi.name)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not end within 30s of its connection closing", gi.name)
	}
	gi.cancel()
	gi.cancel = nil
}

// waitGroupConsumed waits until every partition consumer of the group has acked every message and
// the partition stream holds n.
func waitGroupConsumed(t *testing.T, js jetstream.JetStream, pc durable.GroupConfig, n uint64) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ok, status := true, ""
		if ps := pc.PartitionStream(); ps != "" {
			s, err := js.Stream(ctx, ps)
			if err != nil || s.CachedInfo().State.Msgs != n {
				ok = false
				if err == nil {
					status = fmt.Sprintf("partition stream %d/%d", s.CachedInfo().State.Msgs, n)
				}
			}
		}
		for p := range pc.Partitions {
			if !ok {
				break
			}
			c, err := js.PushConsumer(ctx, pc.ConsumerStream(), pc.ConsumerName(p))
			if err != nil {
				ok, status = false, err.Error()
				break
			}
			ci := c.CachedInfo()
			if ci.NumPending != 0 || ci.NumAckPending != 0 {
				ok, status = false, fmt.Sprintf("partition %d: pending %d, ack pending %d", p, ci.NumPending, ci.NumAckPending)
			}
		}
		cancel()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group not done: %s", status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type lineKey struct {
	worker  string
	rank    int64
	counter int64
}

// TestGroupScaleOutThreeInstancesOneStoppedOneKilled runs three writers of one group over six
// partitions while messages keep arriving; one leaves gracefully mid-run, then one is killed (its
// connection closed: its partitions are lost and taken over after PinnedTTL, with lines on disk
// whose acks never arrived). Afterwards every message is exactly once in the segments, each
// producer's lines are in order, and no producer's files were ever open in two instances at once.
func TestGroupScaleOutThreeInstancesOneStoppedOneKilled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("scale-out test takes ~5s per mode")
	}
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		t.Run(mode, func(t *testing.T) { testGroupScaleOut(t, mode) })
	}
}

func testGroupScaleOut(t *testing.T, mode string) {
	env := natsservertest.Start(t)
	keys := testKeys(20) // 10 producers (w0..w9), 2 ranks each
	const n = 24000
	msgs, published := manyFPMs(t, keys, n, 1_782_777_600_000)

	cfg := testConfig(t)
	cfg.Mode = Mode(mode)
	cfg.SampleInterval = 100 * time.Millisecond
	cfg.Group = "trace-group"
	cfg.RollBytes = 64 << 10 // many segments per producer: handovers are visible in their indexes
	cfg.MaxSegments = 100000
	cfg.MaxAckPending = 2000
	cfg.Partitions = 6
	pc, err := cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := pc.Filters[0]; got.Subject != "fpm.*.*.*.*" || len(got.KeyTokens) != 1 || got.KeyTokens[0] != 3 {
		t.Fatalf("partition filter %+v: want fpm.*.*.*.* keyed by token 3 (worker_id)", got)
	}

	o := &ownership{open: map[string]map[string]int{}, opened: map[string][]string{}}
	publish(t, env.JS, msgs[:6000])
	a := startGroupInstance(t, env, cfg, "a", o)
	b := startGroupInstance(t, env, cfg, "b", o)
	c := startGroupInstance(t, env, cfg, "c", o)

	publish(t, env.JS, msgs[6000:12000])
	time.Sleep(time.Second)
	t.Logf("owned before stop: a %v, b %v, c %v", a.w.Owned(), b.w.Owned(), c.w.Owned())
	if err := b.stop(); err != nil { // graceful, mid-run
		t.Fatalf("stop b: %v", err)
	}
	publish(t, env.JS, msgs[12000:18000])
	pubDone := make(chan struct{})
	go func() { // publishing goes on while c is killed, so that c holds lines durable but not acked
		defer close(pubDone)
		publish(t, env.JS, msgs[18000:])
	}()
	time.Sleep(100 * time.Millisecond)
	t.Logf("owned before kill: a %v, c %v", a.w.Owned(), c.w.Owned())
	c.kill(t) // abrupt: connection closed, no handover; a takes c's partitions after PinnedTTL
	<-pubDone

	waitGroupConsumed(t, env.JS, pc, n)
	if err := a.stop(); err != nil {
		t.Fatalf("stop a: %v", err)
	}
	t.Logf("redeliveries skipped as already written: a %v, b %v, c %v", counterValue(t, a.w.metrics.skippedWritten),
		counterValue(t, b.w.metrics.skippedWritten), counterValue(t, c.w.metrics.skippedWritten))

	o.mu.Lock()
	for _, v := range o.violations {
		t.Errorf("two writers: %s", v)
	}
	instancesPerProducer := 0
	for prefix, ins := range o.opened {
		seen := map[string]bool{}
		for _, i := range ins {
			seen[i] = true
		}
		if len(seen) > 1 {
			instancesPerProducer++
		}
		t.Logf("%s: segments opened by %v", filepath.Base(prefix), ins)
	}
	o.mu.Unlock()
	if instancesPerProducer == 0 {
		t.Errorf("no producer was handed over between instances: the test did not exercise a handover")
	}

	checkGroupOutput(t, outputLines(t, cfg.OutputPath), published, 10, true, mode, cfg.SampleInterval)
}

// TestGroupPartitionConfig checks the partitioning derived from a writer config: with one partition
// the filter as given; with more, keyed by worker_id whatever the filter, refused where one producer's
// messages could be split.
func TestGroupPartitionConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	for _, tc := range []struct {
		filter        string
		parts, shards int
		subj          string
		key           []int
		bad           bool
	}{
		{filter: "fpm.>", parts: 4, subj: "fpm.*.*.*.*", key: []int{3}},
		{filter: "fpm.dynamo.>", parts: 4, subj: "fpm.dynamo.*.*.*", key: []int{2}},
		{filter: "fpm.dynamo.backend.*.*", parts: 4, subj: "fpm.dynamo.backend.*.*", key: []int{1}},
		{filter: "fpm.dynamo.backend.w1.>", parts: 4, bad: true},
		{filter: "fpm.dynamo.backend.w1.>", parts: 1, subj: "fpm.dynamo.backend.w1.>"},
		{filter: "fpm.>", parts: 1, subj: "fpm.>"},
		{filter: "fpm.>", parts: -1, bad: true},
		{filter: "fpm.>", parts: 0, subj: "fpm.>"}, // one per shard: 1 on one stream
		{filter: "fpm.>", parts: 0, shards: 3, subj: "fpm.*.*.*.*", key: []int{3}},
		{filter: "fpm.dynamo.>", parts: 0, shards: 3, subj: "fpm.dynamo.*.*.*", key: []int{2}},
		{filter: "fpm.dynamo.backend.w1.>", parts: 0, shards: 3, subj: "fpm.dynamo.backend.w1.>"},
	} {
		c := cfg
		c.FilterSubject = tc.filter
		c.Partitions, c.FPMShards = tc.parts, tc.shards
		pc, err := c.PartitionConfig()
		if tc.bad {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%s P=%d: got %v, want ErrInvalidConfig", tc.filter, tc.parts, err)
			}
			if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%s P=%d: Validate = %v, want ErrInvalidConfig", tc.filter, tc.parts, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s P=%d: %v", tc.filter, tc.parts, err)
			continue
		}
		f := pc.Filters[0]
		if f.Subject != tc.subj || fmt.Sprint(f.KeyTokens) != fmt.Sprint(tc.key) {
			t.Errorf("%s P=%d: filter %+v, want %s keyed %v", tc.filter, tc.parts, f, tc.subj, tc.key)
		}
	}
	c := cfg
	c.ProducerID = "one"
	c.Partitions = 2
	if _, err := c.PartitionConfig(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("producer id with 2 partitions: got %v, want ErrInvalidConfig", err)
	}
	c.Partitions = 1
	if _, err := c.PartitionConfig(); err != nil {
		t.Errorf("producer id with 1 partition: %v", err)
	}
	// Full mode acks the done prefix, sampled mode each message; retention loss is reported only where
	// every skipped sequence is a lost message.
	// With FPM shards, the default partitions (0) are one per shard, each reading its shard directly,
	// which reports retention loss per shard as well.
	for _, tc := range []struct {
		mode, filter     string
		parts, shards    int
		cumulative, loss bool
	}{
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 1, cumulative: true, loss: true},
		{mode: schemas.CaptureFull, filter: "fpm.dynamo.>", parts: 1, cumulative: true},
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 4, cumulative: true},
		{mode: schemas.CaptureSampled, filter: "fpm.>", parts: 1, loss: true},
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 0, cumulative: true, loss: true},
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 0, shards: 3, cumulative: true, loss: true},
		{mode: schemas.CaptureSampled, filter: "fpm.>", parts: 3, shards: 3, loss: true},
		{mode: schemas.CaptureFull, filter: "fpm.dynamo.>", parts: 0, shards: 3, cumulative: true},
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 1, shards: 3, cumulative: true},
		{mode: schemas.CaptureFull, filter: "fpm.>", parts: 2, shards: 3, cumulative: true},
	} {
		c := cfg
		c.Mode, c.FilterSubject, c.Partitions, c.FPMShards = Mode(tc.mode), tc.filter, tc.parts, tc.shards
		pc, err := c.PartitionConfig()
		if err != nil {
			t.Fatal(err)
		}
		if rc := c.runnerConfig(pc); pc.CumulativeAcks != tc.cumulative || rc.DetectRetentionLoss != tc.loss || rc.Validate() != nil {
			t.Errorf("%s %s P=%d shards %d: cumulative %v, retention loss %v (%v), want %v, %v", tc.mode, tc.filter, tc.parts, tc.shards,
				pc.CumulativeAcks, rc.DetectRetentionLoss, rc.Validate(), tc.cumulative, tc.loss)
		}
	}
}

// ackLoser loses every Done (its line is written, its acknowledgement never sent), as a writer killed
// between its fsyncs and its acks.
func ackLoser(m *durable.Msg) delivery { return lostDoneMsg{m} }

// TestGroupTakeoverSkipsLinesOfPreviousOwner: one partition (--partitions 1, a hot standby), every
// producer under one --producer-id. The first owner writes every message but none of its acks
// arrives; when it leaves, the standby gets every message again and must write none of them twice,
// then carries on with new messages in the same producer's files.
func TestGroupTakeoverSkipsLinesOfPreviousOwner(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		t.Run(mode, func(t *testing.T) { testGroupTakeover(t, mode) })
	}
}

func testGroupTakeover(t *testing.T, mode string) {
	env := natsservertest.Start(t)
	msgs, published := manyFPMs(t, testKeys(6), 3000, 1_782_777_600_000)
	cfg := testConfig(t)
	cfg.Mode = Mode(mode)
	cfg.SampleInterval = 100 * time.Millisecond
	cfg.Group = "trace-standby"
	cfg.ProducerID = "all"
	cfg.RollBytes = 64 << 10
	cfg.MaxSegments = 100000
	pc, err := cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	o := &ownership{open: map[string]map[string]int{}, opened: map[string][]string{}}
	publish(t, env.JS, msgs[:2000])

	nc, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	lossy, err := New(logTo(cfg, testLogger(t).With("instance", "lossy")), js, durable.WithMemberID("lossy"))
	if err != nil {
		t.Fatal(err)
	}
	lossy.set.open = o.opener("lossy")
	lossy.deliver = ackLoser
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lossy.Run(ctx) }()
	<-lossy.Ready()
	// Wait until the lossy owner got all 2000 messages (none acked) and wrote their lines.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := env.JS.PushConsumer(context.Background(), streams.StreamFPM, cfg.Group)
		if err == nil && c.CachedInfo().NumPending == 0 && c.CachedInfo().NumAckPending == 2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lossy owner did not get all 2000 messages: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if mode == schemas.CaptureFull { // every line written (flushes run every FlushInterval)
		deadline = time.Now().Add(30 * time.Second)
		for n := 0; n != 2000; {
			if time.Now().After(deadline) {
				t.Fatalf("lossy owner wrote %d of 2000 lines", n)
			}
			time.Sleep(cfg.FlushInterval)
			n = 0
			for _, ls := range outputLines(t, cfg.OutputPath) {
				n += len(ls)
			}
		}
	} else { // some intervals written
		time.Sleep(5 * cfg.FlushInterval)
	}
	standby := startGroupInstance(t, env, cfg, "standby", o)
	cancel() // the lossy owner leaves: its partition, unacked, goes to the standby
	if err := <-done; err != nil {
		t.Fatalf("lossy: %v", err)
	}
	publish(t, env.JS, msgs[2000:])
	waitGroupConsumed(t, env.JS, pc, 3000)
	if err := standby.stop(); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, standby.w.metrics.skippedWritten); mode == schemas.CaptureFull && got != 2000 {
		t.Errorf("standby skipped %v redelivered messages, want 2000", got)
	}
	for _, v := range o.violations {
		t.Errorf("two writers: %s", v)
	}
	out := outputLines(t, cfg.OutputPath)
	if len(out) != 1 || len(out["all"]) == 0 {
		t.Fatalf("producers %d, lines of \"all\" %d: want 1 producer", len(out), len(out["all"]))
	}
	checkGroupOutput(t, out, published, 1, false, mode, cfg.SampleInterval)
	t.Logf("segments opened: %v", o.opened)
}

// checkGroupOutput checks that every published message has exactly one line, in order per key, in
// the files of producers producers (each a worker's own when byWorker).
//
// In sampled mode a line stands for a key's interval: every (key, interval) published has exactly
// one line, and each key's intervals are in order.
func checkGroupOutput(t *testing.T, out map[string][][]byte, published []testFPM, producers int, byWorker bool, mode string, interval time.Duration) {
	t.Helper()
	ivMs := interval.Milliseconds()
	if mode == schemas.CaptureSampled {
		// Replace counters by intervals: the rest of the check is the same.
		pub := make([]testFPM, 0, len(published))
		seenIv := map[lineKey]bool{}
		for _, f := range published {
			k := lineKey{f.key.WorkerID, int64(f.key.DPRank), f.receivedMs / ivMs}
			if !seenIv[k] {
				seenIv[k] = true
				f.counter = k.counter
				pub = append(pub, f)
			}
		}
		published = pub
	}
	want := map[lineKey]bool{}
	for _, f := range published {
		want[lineKey{f.key.WorkerID, int64(f.key.DPRank), f.counter}] = true
	}
	if len(out) != producers {
		t.Errorf("producers: got %d, want %d", len(out), producers)
	}
	seen := map[lineKey]int{}
	dups := 0
	for prod, lines := range out {
		last := map[[2]string]int64{}
		for i, l := range lines {
			tl, err := schemas.ParseTraceLine(l)
			if err != nil {
				t.Fatalf("%s line %d: %v", prod, i, err)
			}
			f, err := schemas.ParseFPMJSON(tl.Event.FPM)
			if err != nil {
				t.Fatalf("%s line %d: fpm: %v", prod, i, err)
			}
			if byWorker && (tl.Event.Source.ProducerID != f.WorkerID || prod != f.WorkerID) {
				t.Fatalf("%s line %d: producer %q, worker %q", prod, i, tl.Event.Source.ProducerID, f.WorkerID)
			}
			if mode == schemas.CaptureSampled {
				f.CounterID = tl.Event.ObservedAtUnixMs / ivMs
			}
			k := lineKey{f.WorkerID, f.DPRank, f.CounterID}
			seen[k]++
			if seen[k] > 1 {
				dups++
				if dups <= 10 {
					t.Errorf("duplicate line %+v in %s (line %d)", k, prod, i)
				}
			}
			wr := [2]string{f.WorkerID, fmt.Sprint(f.DPRank)}
			if prev, ok := last[wr]; ok && f.CounterID <= prev && seen[k] == 1 {
				t.Errorf("%s line %d: %v counter %d after %d: out of order", prod, i, wr, f.CounterID, prev)
			}
			last[wr] = max(last[wr], f.CounterID)
		}
	}
	missing := 0
	for k := range want {
		if seen[k] == 0 {
			missing++
			if missing <= 10 {
				t.Errorf("missing line %+v", k)
			}
		}
	}
	if missing > 0 || dups > 0 || len(seen) != len(want) {
		t.Fatalf("lines: %d distinct of %d published, %d missing, %d duplicates", len(seen), len(want), missing, dups)
	}
}

// With P > 1 a message filed under another producer than its worker_id (the partition key) could
// give that producer's file two writers: it is rejected (a dead letter naming errGroupUnsupported's
// reason), and the others are written.
func TestGroupRejectsAProducerOtherThanItsWorker(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	var msgs []*nats.Msg
	var good []testFPM
	for i := range 40 {
		f := testFPM{key: streams.Key{Namespace: "ns", Component: "c", WorkerID: fmt.Sprint("w", i%4)}, counter: int64(i / 4), receivedMs: 1_782_777_600_000 + int64(i)}
		if i == 17 {
			f.producer = "someone-else"
		} else {
			good = append(good, f)
		}
		msgs = append(msgs, f.msg(t))
	}
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	cfg.Group = "two"
	cfg.Partitions = 2
	pc, err := cfg.PartitionConfig()
	if err != nil {
		t.Fatal(err)
	}
	o := &ownership{open: map[string]map[string]int{}, opened: map[string][]string{}}
	gi := startGroupInstance(t, env, cfg, "only", o)
	waitGroupConsumed(t, env.JS, pc, 40)
	if err := gi.stop(); err != nil {
		t.Fatalf("the writer stopped for one message: %v", err)
	}
	dl := deadLetters(t, env.JS)
	if len(dl) != 1 || dl[0].Headers().Get(streams.HeaderStreamSeq) != "18" ||
		!strings.Contains(dl[0].Headers().Get(streams.HeaderError), "not supported by a partitioned group") {
		t.Fatalf("dead letters: %d (want one, of stream sequence 18, naming the reason)", len(dl))
	}
	checkExactlyOnce(t, outputLines(t, cfg.OutputPath), good, schemas.CaptureFull)
}

// A group whose consumer the server cannot change to what this writer needs — a plain durable with
// per-message acks (declared by hand), or the consumer of the other capture mode — is replaced at
// start, and the writer goes on after that consumer's ack floor: nothing acked before is read again,
// nothing after it is missed.
func TestConsumerDeclaredOtherwiseIsReplacedAfterItsAckFloor(t *testing.T) {
	t.Parallel()
	for name, old := range map[string]func(cfg Config) jetstream.ConsumerConfig{
		"a plain durable acking each message": func(cfg Config) jetstream.ConsumerConfig {
			return jetstream.ConsumerConfig{Durable: cfg.Group, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckExplicitPolicy,
				AckWait: time.Minute, MaxDeliver: -1, MaxAckPending: 20000, FilterSubject: cfg.FilterSubject}
		},
		"the group of the sampled mode": func(cfg Config) jetstream.ConsumerConfig {
			cfg.Mode = schemas.CaptureSampled
			pc, err := cfg.PartitionConfig()
			if err != nil {
				t.Fatal(err)
			}
			return pc.ConsumerConfig(0)
		},
	} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			msgs, published := manyFPMs(t, testKeys(2), 150, 1_782_777_600_000)
			publish(t, env.JS, msgs)
			cfg := testConfig(t)
			ctx := context.Background()
			occ := old(cfg)
			// The old writer wrote and acked the first 100 messages.
			taken := durabletest.Take(t, env.JS, streams.StreamFPM, occ, 100)
			writeLines(t, cfg, taken)
			for _, m := range taken {
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}

			r := startWriter(t, cfg, env.JS)
			ci := waitConsumed(t, env.JS, cfg.Group)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if ci.Config.AckPolicy != jetstream.AckAllPolicy || ci.Config.DeliverSubject == "" || ci.Config.Metadata["fpmbus_group"] != cfg.Group || ci.AckFloor.Stream != 150 {
				t.Fatalf("consumer after the start: ack policy %v, deliver subject %q, metadata %v, ack floor %d", ci.Config.AckPolicy, ci.Config.DeliverSubject, ci.Config.Metadata, ci.AckFloor.Stream)
			}
			if got := counterValue(t, r.w.metrics.skippedWritten); got != 0 {
				t.Fatalf("%v messages acked by the old consumer were read again", got)
			}
			checkExactlyOnce(t, outputLines(t, cfg.OutputPath), published, schemas.CaptureFull)
		})
	}
}

// failingPublisher refuses every publication while down, as a server that is away, paused or whose
// disk is full does.
type failingPublisher struct {
	jetstream.JetStream
	down bool
}

func (f *failingPublisher) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if f.down {
		return nil, nats.ErrTimeout
	}
	return f.JetStream.PublishMsg(ctx, msg, opts...)
}

// A pruned segment's loss event the server did not store is published again until it is, once, so
// that gaps report counts the pruned lines whenever the server was away at the prune.
func TestPrunedSegmentLossEventIsStoredOnceTheServerTakesIt(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	if _, err := streams.Ensure(ctx, env.JS, streams.DefaultConfig(), nil); err != nil {
		t.Fatal(err)
	}
	js := &failingPublisher{JetStream: env.JS, down: true}
	c, err := New(testConfig(t), js)
	if err != nil {
		t.Fatal(err)
	}
	ps := prunedSegment{Segment: "/traces/fpm.w.000003.jsonl.gz", Index: 3, Producer: "w", Lines: 7, FirstSeq: 11, LastSeq: 17,
		FirstObservedMs: 1_782_777_600_000, LastObservedMs: 1_782_777_600_900}
	c.publishPruned(0, ps)
	c.retryLosses(ctx, true) // still down: kept
	if n := len(natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.ConsumerLossSubject(ConsumerName))); n != 0 {
		t.Fatalf("%d loss events stored while the server refused them", n)
	}
	js.down = false
	c.retryLosses(ctx, false) // not due yet
	if len(c.unstoredLosses) != 1 {
		t.Fatalf("%d loss events waiting, want 1 until the retry is due", len(c.unstoredLosses))
	}
	c.retryLosses(ctx, true)
	c.retryLosses(ctx, true)
	var got []streams.ConsumerLoss
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.ConsumerLossSubject(ConsumerName)) {
		var l streams.ConsumerLoss
		if err := json.Unmarshal(m.Data(), &l); err != nil {
			t.Fatal(err)
		}
		l.DetectedAt = 0
		got = append(got, l)
	}
	want := []streams.ConsumerLoss{{Event: streams.ConsumerLossEvent, Cause: streams.LossPruned, Consumer: ConsumerName, Stream: streams.StreamFPM,
		First: 11, Last: 17, Count: 7, Segment: ps.Segment, Producer: "w", FirstObservedMs: ps.FirstObservedMs, LastObservedMs: ps.LastObservedMs}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loss events\n got %+v\nwant %+v", got, want)
	}
	if len(c.unstoredLosses) != 0 {
		t.Fatalf("%d loss events still waiting after they were stored", len(c.unstoredLosses))
	}
}
