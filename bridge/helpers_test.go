package bridge

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/schemas"
)

func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) != "" {
		runNode() // a server process of a kill -9 test (batch_test.go)
	}
	// nats-server registers a stream in its account only after its file store is set up, so a stream
	// the bridge (re)creates while a test shuts the server down is never stopped: its store's state
	// flusher, its message blocks' flush loops and the access-time ticker it holds stay behind. That is
	// the server's shutdown race, not the bridge's; any other goroutine of a server left running is
	// still a leak.
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

// testLogger discards logs unless FPMBUS_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("FPMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// checkFor retries f every sleep until it returns nil or wait passes, then fails with f's error.
func checkFor(t testing.TB, wait, sleep time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", wait, err)
		}
		time.Sleep(sleep)
	}
}

// testPub is a Dynamo-like FPM publisher: the synthetic publisher's socket (producer.Sender) as an XPUB
// (a PUB that also reports subscriptions, so a test can wait until the bridge is subscribed instead of
// sleeping) with no send high-water mark, sending (topic, 8-byte big-endian sequence, msgpack payload).
type testPub struct {
	t   testing.TB
	s   *producer.Sender
	URL string
}

// newTestPub binds on endpoint ("tcp://127.0.0.1:*" picks a free port).
func newTestPub(t testing.TB, endpoint string) *testPub {
	t.Helper()
	s, err := producer.NewSender(nil, endpoint, -1, producer.WithSubscriberCount(), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	p := &testPub{t: t, s: s, URL: s.Endpoint()}
	t.Cleanup(p.Close)
	return p
}

// Close closes the socket and its context; safe to call twice.
func (p *testPub) Close() { _ = p.s.Close() }

// waitSubscribed blocks until a subscriber's subscription reached the socket: from then on nothing
// sent is lost to ZMQ's slow-joiner window.
func (p *testPub) waitSubscribed() {
	p.t.Helper()
	if err := p.s.WaitSubscribers(1, 15*time.Second); err != nil {
		p.t.Fatal(err)
	}
}

func (p *testPub) sendFrames(frames ...[]byte) {
	p.t.Helper()
	if err := p.s.SendFrames(frames...); err != nil {
		p.t.Fatalf("send: %v", err)
	}
}

// send sends one Dynamo multipart: empty topic, seq, payload.
func (p *testPub) send(seq uint64, payload []byte) {
	p.t.Helper()
	p.sendFrames(nil, seqFrame(seq), payload)
}

func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// testFPM is a busy forward pass of worker/rank whose counter_id is seq, as Dynamo stamps it.
func testFPM(worker string, rank int, seq uint64) *schemas.FPM {
	return &schemas.FPM{
		Version: 1, WorkerID: worker, DPRank: int64(rank), CounterID: int64(seq), WallTime: 0.025,
		Scheduled: schemas.ScheduledRequests{NumPrefillRequests: 2, SumPrefillTokens: 256, VarPrefillLength: 12.5,
			SumPrefillKVTokens: 64, NumDecodeRequests: 3, SumDecodeKVTokens: 1024, VarDecodeKVTokens: 0.5},
		Queued: schemas.QueuedRequests{NumPrefillRequests: 1, SumPrefillTokens: 128, NumDecodeRequests: 0},
	}
}

func payload(worker string, rank int, seq uint64) []byte {
	return schemas.EncodeMsgpack(testFPM(worker, rank, seq))
}

// harness is one bridge on a real embedded JetStream server, over its own natsconn.Connect connection.
type harness struct {
	t      testing.TB
	nc     *nats.Conn
	b      *Bridge
	cancel context.CancelFunc
	done   chan error
}

// startBridge starts a bridge for endpoints on env, with cfg adjusted by mutate. Cleanup stops it.
func startBridge(t testing.TB, env *natsservertest.Env, endpoints []Endpoint, mutate func(*Config), opts ...option) *harness {
	t.Helper()
	return startBridgeAt(t, natsconn.ConnConfig{URL: env.Server.ClientURL()}, endpoints, mutate, opts...)
}

// startBridgeAt is startBridge on the server conn names (with its credentials, if any).
func startBridgeAt(t testing.TB, conn natsconn.ConnConfig, endpoints []Endpoint, mutate func(*Config), opts ...option) *harness {
	t.Helper()
	conn.Name = "bridge-test"
	nc, err := natsconn.Connect(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := Config{Endpoints: endpoints, BridgeID: "test-bridge", Logger: testLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := New(cfg, nc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, nc: nc, b: b, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- b.Run(ctx) }()
	t.Cleanup(func() { _ = h.stop() })
	select {
	case <-b.Ready():
	case err := <-h.done:
		h.done <- err
		t.Fatalf("bridge stopped before ready: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("bridge not ready after 15s")
	}
	return h
}

// stop cancels Run and returns its result; later calls return nil.
func (h *harness) stop() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		return err
	case <-time.After(60 * time.Second):
		h.t.Fatal("bridge did not stop within 60s")
		return nil
	}
}

// waitStats waits until cond holds for the bridge's Stats.
func (h *harness) waitStats(wait time.Duration, what string, cond func(stats) bool) stats {
	h.t.Helper()
	var s stats
	checkFor(h.t, wait, 5*time.Millisecond, func() error {
		s = h.b.Stats()
		if cond(s) {
			return nil
		}
		return &statsErr{what: what, s: s}
	})
	return s
}

type statsErr struct {
	what string
	s    stats
}

func (e *statsErr) Error() string {
	return "waiting for " + e.what + ": stats " + fmtStats(e.s)
}

func fmtStats(s stats) string {
	return fmt.Sprintf("%+v buffered=%d high=%d in_flight=%d markers=%d", s.Total(), s.Buffered, s.BufferedHigh, s.InFlight, s.MarkersPublished)
}

// listenAddr returns host:port of a running server (to restart it at the same address).
func listenAddr(t testing.TB, s *natsserver.Server) string {
	t.Helper()
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// storedMsg is one message read back from a stream.
type storedMsg struct{ raw *jetstream.RawStreamMsg }

func (m storedMsg) Subject() string      { return m.raw.Subject }
func (m storedMsg) Headers() nats.Header { return m.raw.Header }
func (m storedMsg) Data() []byte         { return m.raw.Data }

// messages returns every message of stream whose subject matches filter, in stream order. It reads
// each sequence with a direct get, which is quick and has no fetch-size limits.
func messages(t testing.TB, js jetstream.JetStream, stream, filter string) []storedMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	st := s.CachedInfo().State
	var out []storedMsg
	if st.Msgs == 0 {
		return nil
	}
	// Each read has its own deadline: tens of thousands of them one after the other outlast any single
	// one on a loaded machine.
	for seq := st.FirstSeq; seq <= st.LastSeq; seq++ {
		gctx, gcancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := s.GetMsg(gctx, seq)
		gcancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s #%d: %v", stream, seq, err)
		}
		if subjectMatches(filter, m.Subject) {
			out = append(out, storedMsg{m})
		}
	}
	return out
}

// subjectMatches reports whether subject matches a NATS filter with * and > wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

func nan() float64 { return math.NaN() }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
