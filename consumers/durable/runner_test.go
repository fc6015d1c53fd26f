package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// publishPatiently lets an asynchronous publish wait for the server as long as a loaded machine needs:
// nats.go's default gives up after 200 ms when its window of publishes in flight is full ("stalled with
// too many outstanding async published messages").
var publishPatiently = jetstream.WithStallWait(30 * time.Second)

func testLogger() *slog.Logger {
	if os.Getenv("FPMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func connect(t testing.TB, env *natsservertest.Env) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(env.Server.ClientURL(), nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func subjectOf(k int) string {
	return streams.FPMSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w" + strconv.Itoa(k), DPRank: 0})
}

// publish stores n messages spread over keys keys; message i has body "i".
func publish(t testing.TB, js jetstream.JetStream, from, n, keys int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := from; i < from+n; i++ {
		if _, err := js.PublishAsync(subjectOf(i%keys), []byte(strconv.Itoa(i)), publishPatiently); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publish timed out")
	}
}

func groupConfig(group string, partitions int, cumulative bool) GroupConfig {
	c := FPMGroup(group)
	c.Partitions = partitions
	c.PinnedTTL = MinPinnedTTL
	c.AckWait = 30 * time.Second
	c.MaxAckPending = 2000
	c.Batch = 500
	c.ReleaseTimeout = 10 * time.Second
	c.CumulativeAcks = cumulative
	return c
}

// recorder is a Consumer that records what it is handed. Messages are made durable by Tick (like a
// writer's flush) unless holdFn holds them; rejectFn rejects; failFn fails the instance.
type recorder struct {
	mu       sync.Mutex
	seen     []string // bodies in handling order
	bodies   map[string]int
	pending  []*Msg
	released []int
	lost     []int
	closed   bool
	holdFn   func(*Msg) bool
	rejectFn func(*Msg) error
	failFn   func(*Msg) error
	held     []*Msg
}

func newRecorder() *recorder { return &recorder{bodies: map[string]int{}} }

func (c *recorder) Handle(_ context.Context, batch []*Msg) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range batch {
		if c.failFn != nil {
			if err := c.failFn(m); err != nil {
				return err
			}
		}
		if c.rejectFn != nil {
			if err := c.rejectFn(m); err != nil {
				m.Reject(err)
				continue
			}
		}
		c.seen = append(c.seen, string(m.Data()))
		c.bodies[string(m.Data())]++
		if c.holdFn != nil && c.holdFn(m) {
			c.held = append(c.held, m)
			continue
		}
		c.pending = append(c.pending, m)
	}
	return nil
}

func (c *recorder) flush() {
	for _, m := range c.pending {
		m.Done()
	}
	c.pending = nil
}

func (c *recorder) Tick(context.Context, time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flush()
	return nil
}

func (c *recorder) Close(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flush()
	c.closed = true
	return nil
}

func (c *recorder) Assigned(context.Context, int) error { return nil }
func (c *recorder) Release(_ context.Context, p int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, p)
	c.flush()
	return nil
}
func (c *recorder) Lost(p int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = append(c.lost, p)
	c.pending = nil
}

func (c *recorder) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type running struct {
	r      *Runner
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, cfg Config, js jetstream.JetStream, c Consumer, opts ...Option) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	r, err := New(cfg, js, c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	select {
	case <-r.Ready():
	case err := <-rr.done:
		t.Fatalf("runner ended before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("runner not ready")
	}
	return rr
}

func (rr *running) stop(t testing.TB) error {
	rr.cancel()
	select {
	case err, ok := <-rr.done:
		if ok {
			close(rr.done)
		}
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("runner did not stop")
		return nil
	}
}

func consumerInfo(t testing.TB, js jetstream.JetStream, g GroupConfig, p int) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.PushConsumer(ctx, g.ConsumerStream(), g.ConsumerName(p))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestRunnerAcksOnlyWhatIsDone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		cumulative bool
		partitions int
	}{
		{"cumulative_one_partition", true, 1},
		{"explicit_one_partition", false, 1},
		{"cumulative_four_partitions", true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := natsservertest.Start(t)
			js := connect(t, env)
			publish(t, js, 0, 3000, 16)
			rec := newRecorder()
			g := groupConfig("g", tc.partitions, tc.cumulative)
			rr := start(t, Config{Name: "test", Group: g, TickInterval: 50 * time.Millisecond}, js, rec)
			waitFor(t, "3000 handled", 30*time.Second, func() bool { return rec.count() >= 3000 })
			if err := rr.stop(t); err != nil {
				t.Fatalf("stop: %v", err)
			}
			if len(rec.seen) != 3000 {
				t.Fatalf("handled %d, want 3000", len(rec.seen))
			}
			// Per key in stream order, each once.
			last := map[int]int{}
			for _, b := range rec.seen {
				i, _ := strconv.Atoi(b)
				if prev, ok := last[i%16]; ok && i <= prev {
					t.Fatalf("key %d: %d handled after %d", i%16, i, prev)
				}
				last[i%16] = i
				if rec.bodies[b] != 1 {
					t.Fatalf("message %s handled %d times", b, rec.bodies[b])
				}
			}
			for p := range tc.partitions {
				if info := consumerInfo(t, js, g, p); info.NumAckPending != 0 || info.NumPending != 0 {
					t.Fatalf("partition %d after stop: %d unacked, %d pending", p, info.NumAckPending, info.NumPending)
				}
			}
			if !rec.closed {
				t.Fatal("Close not called")
			}
		})
	}
}

// A message held longer than the ack wait is kept alive with in-progress acks: never redelivered.
func TestRunnerKeepsHeldMessagesAlive(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	js := connect(t, env)
	publish(t, js, 0, 10, 2)
	rec := newRecorder()
	var release sync.WaitGroup
	release.Add(1)
	rec.holdFn = func(m *Msg) bool { return string(m.Data()) == "3" }
	g := groupConfig("hold", 1, false)
	g.AckWait = time.Second
	rr := start(t, Config{Name: "hold", Group: g, TickInterval: 50 * time.Millisecond}, js, rec)
	waitFor(t, "10 handled", 10*time.Second, func() bool { return rec.count() >= 10 })
	time.Sleep(3 * g.AckWait) // three ack waits: without in-progress acks message 3 comes back
	rec.mu.Lock()
	n := len(rec.seen)
	held := rec.held[0]
	rec.mu.Unlock()
	if n != 10 {
		t.Fatalf("handled %d messages, want 10 (a held message was redelivered)", n)
	}
	if info := consumerInfo(t, js, g, 0); info.NumAckPending != 1 || info.NumRedelivered != 0 {
		t.Fatalf("while held: %d unacked (want 1), %d redelivered (want 0)", info.NumAckPending, info.NumRedelivered)
	}
	held.Done()
	waitFor(t, "held message acked", 5*time.Second, func() bool { return consumerInfo(t, js, g, 0).NumAckPending == 0 })
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
}

func deadLetters(t testing.TB, js jetstream.JetStream, name string) []jetstream.Msg {
	return natsservertest.Messages(t, js, streams.StreamEvents, RejectedSubject(name))
}

// A message the stage rejects is dead-lettered with where it came from and why, and never holds up
// the others.
func TestRunnerRejectDeadLetters(t *testing.T) {
	t.Parallel()
	for _, cumulative := range []bool{true, false} {
		t.Run(fmt.Sprintf("cumulative=%v", cumulative), func(t *testing.T) {
			env := natsservertest.Start(t)
			js := connect(t, env)
			publish(t, js, 0, 100, 4)
			rec := newRecorder()
			rec.rejectFn = func(m *Msg) error {
				if string(m.Data()) == "42" {
					return errors.New("file name too long")
				}
				return nil
			}
			g := groupConfig("rej", 1, cumulative)
			rr := start(t, Config{Name: "rej", Group: g, TickInterval: 20 * time.Millisecond}, js, rec)
			waitFor(t, "99 handled and all acked", 10*time.Second, func() bool {
				return rec.count() == 99 && consumerInfo(t, js, g, 0).NumAckPending == 0
			})
			if err := rr.stop(t); err != nil {
				t.Fatal(err)
			}
			dl := deadLetters(t, js, "rej")
			if len(dl) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dl))
			}
			h := dl[0].Headers()
			if string(dl[0].Data()) != "42" || h.Get(streams.HeaderConsumer) != "rej" || h.Get(streams.HeaderStream) != streams.StreamFPM ||
				h.Get(streams.HeaderStreamSeq) != "43" || h.Get(streams.HeaderSubject) != subjectOf(42%4) || h.Get(streams.HeaderError) != "file name too long" {
				t.Fatalf("dead letter body %q headers %v", dl[0].Data(), h)
			}
			if info := consumerInfo(t, js, g, 0); info.AckFloor.Stream != 100 {
				t.Fatalf("ack floor %d, want 100", info.AckFloor.Stream)
			}
		})
	}
}

// A message that makes every instance fail is dead-lettered once it was delivered MaxDeliveries times,
// without reaching the stage again; the messages after it flow.
func TestRunnerDeliveryLimit(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	js := connect(t, env)
	publish(t, js, 0, 20, 2)
	g := groupConfig("poison", 1, true)
	cfg := Config{Name: "poison", Group: g, TickInterval: 20 * time.Millisecond, MaxDeliveries: 3, StopTimeout: 5 * time.Second}
	crash := func(m *Msg) error {
		if string(m.Data()) == "7" {
			return errors.New("instance crashed on message 7")
		}
		return nil
	}
	attempts := 0
	var rec *recorder
	for attempts < 6 {
		rec = newRecorder()
		rec.failFn = crash
		cfg.Logger = testLogger()
		r, err := New(cfg, js, rec)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		// Each instance either crashes on the poison message or, once it was given up, handles the
		// other 19. Which one is decided by what it did, never by how long it took: under load a
		// takeover after PinnedTTL can take far longer than on an idle machine.
		handledAll, crashed := false, false
		deadline := time.Now().Add(3 * time.Minute)
		for !handledAll && !crashed {
			select {
			case runErr := <-done:
				if runErr == nil {
					t.Fatal("an instance stopped without being cancelled or failing")
				}
				crashed = true
			case <-time.After(20 * time.Millisecond):
				handledAll = rec.count() >= 19
				if !handledAll && time.Now().After(deadline) {
					t.Fatalf("instance %d neither crashed nor handled the 19 good messages", attempts+1)
				}
			}
		}
		if handledAll {
			// This instance did not fail: the poison message was dead-lettered.
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			break
		}
		cancel()
		attempts++
		// The crashed instance owned the partition: the next one takes over after PinnedTTL.
	}
	// Three sessions crash as usual; the fourth hands messages one at a time and records message 7 as
	// the suspect before it crashes; the fifth dead-letters it.
	if attempts != cfg.MaxDeliveries+1 {
		t.Fatalf("%d instances failed before the message was given up, want %d", attempts, cfg.MaxDeliveries+1)
	}
	if rec.bodies["7"] != 0 {
		t.Fatal("the poison message reached the stage after its delivery limit")
	}
	dl := deadLetters(t, js, "poison")
	if len(dl) != 1 || string(dl[0].Data()) != "7" || dl[0].Headers().Get(streams.HeaderStreamSeq) != "8" {
		t.Fatalf("dead letters: %d, want one, of message 7 (stream sequence 8)", len(dl))
	}
	if info := consumerInfo(t, js, g, 0); info.AckFloor.Stream != 20 {
		t.Fatalf("ack floor %d, want 20", info.AckFloor.Stream)
	}
}

// Messages the stream removed before the consumer read them are reported with their exact range,
// count and cause.
func TestRunnerReportsRetentionLoss(t *testing.T) {
	t.Parallel()
	for _, cumulative := range []bool{true, false} {
		t.Run(fmt.Sprintf("cumulative=%v", cumulative), func(t *testing.T) { testRetentionLoss(t, cumulative) })
	}
}

func testRetentionLoss(t *testing.T, cumulative bool) {
	env := natsservertest.Start(t)
	js := connect(t, env)
	publish(t, js, 0, 30, 3)
	g := groupConfig("ret", 1, cumulative)
	cfg := Config{Name: "ret", Group: g, TickInterval: 20 * time.Millisecond, DetectRetentionLoss: true}
	rec := newRecorder()
	rr := start(t, cfg, js, rec)
	waitFor(t, "30 handled", 10*time.Second, func() bool { return rec.count() >= 30 })
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
	publish(t, js, 30, 40, 3) // sequences 31..70
	ctx := context.Background()
	st, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	sc := st.CachedInfo().Config
	sc.MaxMsgs = 20 // an operator's limit: 31..50 go the way retention removes them
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{60, 61, 62} { // and three deleted one by one
		if err := st.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	rec2 := newRecorder()
	rr2 := start(t, cfg, js, rec2)
	waitFor(t, "17 handled", 10*time.Second, func() bool { return rec2.count() >= 17 })
	if err := rr2.stop(t); err != nil {
		t.Fatal(err)
	}
	var got []streams.ConsumerLoss
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.ConsumerLossSubject("ret")) {
		var l streams.ConsumerLoss
		if err := json.Unmarshal(m.Data(), &l); err != nil {
			t.Fatal(err)
		}
		l.DetectedAt = 0
		got = append(got, l)
	}
	want := []streams.ConsumerLoss{
		{Event: "loss", Cause: streams.LossRetention, Consumer: "ret", Stream: streams.StreamFPM, First: 31, Last: 50, Count: 20},
		{Event: "loss", Cause: streams.LossDeleted, Consumer: "ret", Stream: streams.StreamFPM, First: 60, Last: 62, Count: 3},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loss events\n got %+v\nwant %+v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := Config{Name: "ok", Group: groupConfig("g", 1, true)}
	for name, mut := range map[string]func(*Config){
		"empty name":         func(c *Config) { c.Name = "" },
		"name with a dot":    func(c *Config) { c.Name = "a.b" },
		"negative tick":      func(c *Config) { c.TickInterval = -time.Second },
		"no deliveries":      func(c *Config) { c.MaxDeliveries = -1 },
		"retention with P>1": func(c *Config) { c.DetectRetentionLoss = true; c.Group.Partitions = 4 },
		"bad group":          func(c *Config) { c.Group.Group = "" },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); !errors.Is(err, errInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", name, err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Graceful hand-overs (stops, rebalances) never count towards the crash-loop guard, however often
// the partition is taken over from the same ack floor: the held message is never dead-lettered.
func TestRunnerGracefulStopsAreNotACrashLoop(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	js := connect(t, env)
	publish(t, js, 0, 5, 1)
	g := groupConfig("calm", 1, false)
	cfg := Config{Name: "calm", Group: g, TickInterval: 20 * time.Millisecond, MaxDeliveries: 2, StopTimeout: 10 * time.Second}
	for i := 0; i < 5; i++ { // more sessions from the same floor than MaxDeliveries
		rec := newRecorder()
		rec.holdFn = func(m *Msg) bool { return string(m.Data()) == "0" } // holds the floor still
		rr := start(t, cfg, js, rec)
		waitFor(t, "5 handled", 10*time.Second, func() bool { return rec.count() >= 5 })
		if err := rr.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	if dl := deadLetters(t, js, "calm"); len(dl) != 0 {
		t.Fatalf("%d dead letters after graceful stops, want none", len(dl))
	}
	if info := consumerInfo(t, js, g, 0); info.AckFloor.Stream != 0 {
		t.Fatalf("ack floor %d, want 0 (message 0 is held, never done)", info.AckFloor.Stream)
	}
}
