package partition

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
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

// testLogger logs to stderr with FPMBUS_TEST_LOG=1, else nowhere.
func testLogger() *slog.Logger {
	if os.Getenv("FPMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testConfig is an FPM group with short timers.
func testConfig(group string, partitions int) Config {
	c := FPMConfig(group)
	c.Partitions = partitions
	c.PinnedTTL = MinPinnedTTL
	c.AckWait = 30 * time.Second
	c.MaxAckPending = 2000
	c.Batch = 500
	c.ReleaseTimeout = 10 * time.Second
	return c
}

// connect opens a client connection of its own (one per simulated instance).
func connect(t testing.TB, env *natsservertest.Env) (*nats.Conn, jetstream.JetStream) {
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
	return nc, js
}

func keySubject(k int) string {
	return streams.FPMSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w" + strconv.Itoa(k), DPRank: k % 4})
}

// publish publishes perKey messages for each of keys keys, round robin, body = the message's index
// within its key, pacing so that the whole run takes about dur.
func publish(ctx context.Context, js jetstream.JetStream, keys, perKey int, dur time.Duration) error {
	return publishFrom(ctx, js, keys, 0, perKey, dur)
}

// publishFrom is publish with bodies from, from+1, ...
func publishFrom(ctx context.Context, js jetstream.JetStream, keys, from, perKey int, dur time.Duration) error {
	const chunk = 200
	pause := dur / time.Duration(max(keys*perKey/chunk, 1))
	n := 0
	for i := range perKey {
		for k := range keys {
			if _, err := js.PublishAsync(keySubject(k), []byte(strconv.Itoa(from+i)), publishPatiently); err != nil {
				return err
			}
			if n++; n%chunk == 0 {
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					return ctx.Err()
				}
				time.Sleep(pause)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recorder is the "durable output" of the tests: a log per key, appended in handler order, that
// remembers the last stream sequence it holds per key (as a real output would, in its files) and so
// skips a redelivered message it already has. It fails the test on any overlap: two handlers of one
// partition running at once, or two members processing one key at once.
type recorder struct {
	t          testing.TB
	cfg        Config
	mu         sync.Mutex
	logs       map[string][]int
	last       map[string]uint64
	busy       map[string]string
	owner      map[int]string
	total      atomic.Int64
	deliveries atomic.Int64
	dups       atomic.Int64
	sessions   atomic.Int64
	ackEvery   time.Duration
}

func newRecorder(t testing.TB, cfg Config) *recorder {
	return &recorder{t: t, cfg: cfg, logs: map[string][]int{}, last: map[string]uint64{}, busy: map[string]string{}, owner: map[int]string{}}
}

// handler processes like the trace writer: each message goes to the output at once (durable), acks
// are sent in batches every ackEvery (0: right after each message), all remaining ones when msgs is
// closed, none once ctx is cancelled (the partition is lost). With cfg.CumulativeAcks a batch is
// acked by its last message only.
func (r *recorder) handler(member string) Handler {
	return func(ctx context.Context, p int, msgs <-chan jetstream.Msg) error {
		r.mu.Lock()
		if o := r.owner[p]; o != "" {
			r.t.Errorf("partition %d: handler of %s started while %s's still runs", p, member, o)
		}
		r.owner[p] = member
		r.mu.Unlock()
		r.sessions.Add(1)
		defer func() {
			r.mu.Lock()
			if r.owner[p] == member {
				delete(r.owner, p)
			}
			r.mu.Unlock()
		}()
		var pending []jetstream.Msg
		ackAll := func() error {
			if r.cfg.CumulativeAcks && len(pending) > 0 {
				pending = pending[len(pending)-1:] // one ack covers the messages handed before it
			}
			for _, m := range pending {
				if err := m.Ack(); err != nil {
					return err
				}
			}
			pending = pending[:0]
			return nil
		}
		var tick <-chan time.Time
		if r.ackEvery > 0 {
			t := time.NewTicker(r.ackEvery)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick:
				if err := ackAll(); err != nil {
					return err
				}
			case m, ok := <-msgs:
				if !ok {
					return ackAll()
				}
				if err := r.process(member, p, m); err != nil {
					return err
				}
				pending = append(pending, m)
				if r.ackEvery == 0 {
					if err := ackAll(); err != nil {
						return err
					}
				}
			}
		}
	}
}

// process appends m to the output unless the output already holds it.
func (r *recorder) process(member string, p int, m jetstream.Msg) error {
	r.deliveries.Add(1)
	key := m.Subject()
	if want, err := r.cfg.PartitionOf(key); err != nil {
		r.t.Errorf("subject %q: %v", key, err)
	} else if want != p {
		r.t.Errorf("message of %s handed as partition %d, want %d", key, p, want)
	}
	seq, err := StreamSequence(m)
	if err != nil {
		r.t.Errorf("stream sequence: %v", err)
		return err
	}
	idx, err := strconv.Atoi(string(m.Data()))
	if err != nil {
		r.t.Errorf("body %q", m.Data())
		return err
	}
	r.mu.Lock()
	if o := r.busy[key]; o != "" {
		r.t.Errorf("key %s: %s processes it while %s does", key, member, o)
	}
	r.busy[key] = member
	r.mu.Unlock()
	runtime.Gosched() // the "work": another processor of the key would show up in busy now
	r.mu.Lock()
	defer r.mu.Unlock()
	defer delete(r.busy, key)
	if seq <= r.last[key] {
		r.dups.Add(1) // already durable: redelivered after a crash; acked again
		return nil
	}
	if idx != len(r.logs[key]) {
		r.t.Errorf("key %s: message %d (seq %d) arrives after %d messages: out of order or lost", key, idx, seq, len(r.logs[key]))
	}
	r.logs[key] = append(r.logs[key], idx)
	r.last[key] = seq
	r.total.Add(1)
	return nil
}

func (r *recorder) check(keys, perKey int) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range keys {
		key := keySubject(k)
		l := r.logs[key]
		if len(l) != perKey {
			r.t.Errorf("key %s: %d messages in the output, want %d", key, len(l), perKey)
			continue
		}
		for i, v := range l {
			if v != i {
				r.t.Errorf("key %s: output[%d] = %d", key, i, v)
				break
			}
		}
	}
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timeout after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// running is a member whose Consume runs in a goroutine.
type running struct {
	m    *Member
	nc   *nats.Conn
	done chan error
}

func startMember(t testing.TB, env *natsservertest.Env, cfg Config, id string, rec *recorder) *running {
	t.Helper()
	nc, js := connect(t, env)
	return startMemberWith(t, nc, js, cfg, id, rec)
}

// startMemberOn starts a member connected to node i of c.
func startMemberOn(t testing.TB, c *natsservertest.Cluster, i int, cfg Config, id string, rec *recorder) *running {
	t.Helper()
	nc, js := c.Connect(i)
	return startMemberWith(t, nc, js, cfg, id, rec)
}

func startMemberWith(t testing.TB, nc *nats.Conn, js jetstream.JetStream, cfg Config, id string, rec *recorder) *running {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, js, cfg, WithMemberID(id), WithLogger(testLogger().With("test_member", id)))
	if err != nil {
		t.Fatalf("join %s: %v", id, err)
	}
	r := &running{m: m, nc: nc, done: make(chan error, 1)}
	go func() { r.done <- m.Consume(context.Background(), rec.handler(id)) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = m.Stop(sctx)
		<-r.done
	})
	return r
}

func ownedBy(rs []*running) map[int]string {
	out := map[int]string{}
	for _, r := range rs {
		for _, p := range r.m.Owned() {
			out[p] = r.m.ID()
		}
	}
	return out
}

func fmtOwned(rs []*running) string {
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf("%s=%v ", r.m.ID(), r.m.Owned())
	}
	return s
}

// stop stops the member gracefully and returns what its Consume returned.
func (r *running) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.m.Stop(ctx); err != nil {
		return err
	}
	err := <-r.done
	r.done <- err // for the cleanup
	return err
}
