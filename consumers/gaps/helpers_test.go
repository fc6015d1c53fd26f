package gaps

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// equal fails t when got != want (reflect.DeepEqual).
func equal(t testing.TB, want, got any, msg ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("%s\nwant %+v\n got %+v", fmt.Sprint(msg...), want, got)
	}
}

// check fails t when cond is false.
func check(t testing.TB, cond bool, format string, args ...any) {
	t.Helper()
	if !cond {
		t.Fatalf(format, args...)
	}
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

// harness runs one Detector on its own connection; stop cancels Run and returns its result.
type harness struct {
	t      testing.TB
	d      *Detector
	nc     *nats.Conn
	js     jetstream.JetStream
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// testConfig is DefaultConfig with test-sized times.
func testConfig() Config {
	c := DefaultConfig()
	c.MarkerGrace = 300 * time.Millisecond
	c.StaleAfter = time.Hour
	c.CommitInterval = 20 * time.Millisecond
	c.AckWait = 2 * time.Second
	c.StopTimeout = 5 * time.Second
	c.PinnedTTL = 3 * time.Second
	return c
}

func testLogger() *slog.Logger {
	if os.Getenv("FPMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startDetector starts a detector with cfg on a new connection to url.
func startDetector(t testing.TB, url string, cfg Config, opts ...durable.Option) *harness {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, testLogger()
	d, err := New(cfg, js, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, d: d, nc: nc, js: js, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- d.Run(ctx) }()
	t.Cleanup(func() { h.stop(); nc.Close() })
	select {
	case <-d.Ready():
	case err := <-h.done:
		t.Fatalf("detector stopped before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("detector not ready after 30s")
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
		h.t.Fatal("detector did not stop within 60s")
		return nil
	}
}

// kill ends the detector as a crash would: its connection is closed under it, so nothing is
// checkpointed or acked any more; what it had not acked is redelivered after AckWait.
func (h *harness) kill() {
	h.nc.Close()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		h.t.Fatal("detector did not end after its connection closed")
	}
	h.cancel()
	h.cancel = nil
}

// metric returns the value of a counter or gauge family (summed over label sets matching labels).
func (h *harness) metric(name string, labels ...string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}

// fpmMsg is one FPM as the bridge publishes it: subject, canonical JSON body and Fpm-* headers.
func fpmMsg(k streams.Key, seq uint64, epoch, atMs int64, heartbeat bool, bridge string) *nats.Msg {
	f := &schemas.FPM{Version: 1, WorkerID: k.WorkerID, DPRank: int64(k.DPRank), CounterID: int64(seq)}
	if !heartbeat {
		f.WallTime = 0.025
		f.Scheduled = schemas.ScheduledRequests{NumPrefillRequests: 2, SumPrefillTokens: 256, SumPrefillKVTokens: 64, NumDecodeRequests: 3, SumDecodeKVTokens: 1024}
	}
	d, err := schemas.DecodeFPM(schemas.EncodeMsgpack(f))
	if err != nil {
		panic(err)
	}
	m := nats.NewMsg(streams.FPMSubject(k))
	m.Data = d.JSON
	m.Header.Set(streams.HeaderMsgID, streams.MsgID(k, epoch, seq))
	m.Header.Set(streams.HeaderSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(streams.HeaderReceivedAt, strconv.FormatInt(atMs, 10))
	m.Header.Set(streams.HeaderEpoch, strconv.FormatInt(epoch, 10))
	m.Header.Set(streams.HeaderNamespace, k.Namespace)
	m.Header.Set(streams.HeaderComponent, k.Component)
	m.Header.Set(streams.HeaderWorkerID, k.WorkerID)
	m.Header.Set(streams.HeaderDPRank, strconv.Itoa(k.DPRank))
	m.Header.Set(streams.HeaderBridge, bridge)
	return m
}

// markerMsg is a drop marker as the bridge publishes it (streams.DropMarker.Msg).
func markerMsg(k streams.Key, epoch int64, first, last uint64, reason string) *nats.Msg {
	m := streams.DropMarker{Type: streams.DropMarkerEvent, Key: k, Epoch: epoch, FirstSeq: first, LastSeq: last,
		Count: last - first + 1, Reason: reason, Bridge: "test-bridge", FirstReceivedAtMs: epoch, LastReceivedAtMs: epoch}
	return m.Msg()
}

// publishAll publishes msgs in order and waits for every ack.
func publishAll(t testing.TB, js jetstream.JetStream, msgs ...*nats.Msg) {
	t.Helper()
	for i, m := range msgs {
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if i%1000 == 999 || i == len(msgs)-1 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(60 * time.Second):
				t.Fatal("publish: timeout")
			}
		}
	}
}

// fpms returns the FPMs first..last of k under epoch, observed from atMs one per 10 ms.
func fpms(k streams.Key, first, last uint64, epoch, atMs int64) []*nats.Msg {
	var out []*nats.Msg
	for q := first; q <= last; q++ {
		out = append(out, fpmMsg(k, q, epoch, atMs+int64(q-first)*10, q%5 == 0, "test-bridge"))
	}
	return out
}

// storedEvents reads every event on FPM_EVENTS gap subjects, in stream order.
func storedEvents(t testing.TB, js jetstream.JetStream) []Event {
	t.Helper()
	var out []Event
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.GapEventWildcard) {
		var e Event
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			t.Fatalf("event %s: %v", m.Data(), err)
		}
		if m.Subject() != streams.GapEventSubject(e.Key) || m.Headers().Get(streams.HeaderMsgID) != e.ID ||
			m.Headers().Get(streams.HeaderEventType) != e.Type {
			t.Fatalf("event %s: subject %s headers %v", e.ID, m.Subject(), m.Headers())
		}
		out = append(out, e)
	}
	return out
}

// waitEvents waits until n events are stored and returns them by key.
func waitEvents(t testing.TB, js jetstream.JetStream, n int, wait time.Duration) map[streams.Key][]Event {
	t.Helper()
	var evs []Event
	checkFor(t, wait, 50*time.Millisecond, func() error {
		evs = storedEvents(t, js)
		if len(evs) < n {
			return fmt.Errorf("%d of %d events stored: %v", len(evs), n, summarizeAll(evs))
		}
		return nil
	})
	if len(evs) > n {
		t.Fatalf("%d events stored, want %d: %v", len(evs), n, summarizeAll(evs))
	}
	return byKey(evs)
}

// waitFirstEvents waits until at least n events are stored and returns the first n by key.
func waitFirstEvents(t testing.TB, js jetstream.JetStream, n int, wait time.Duration) map[streams.Key][]Event {
	t.Helper()
	var evs []Event
	checkFor(t, wait, 50*time.Millisecond, func() error {
		evs = storedEvents(t, js)
		if len(evs) < n {
			return fmt.Errorf("%d of %d events stored: %v", len(evs), n, summarizeAll(evs))
		}
		return nil
	})
	return byKey(evs[:n])
}

func byKey(evs []Event) map[streams.Key][]Event {
	by := map[streams.Key][]Event{}
	for _, e := range evs {
		by[e.Key] = append(by[e.Key], e)
	}
	return by
}

func summarizeAll(evs []Event) []string {
	var s []string
	for _, e := range evs {
		s = append(s, e.ID+"/"+e.Cause)
	}
	return s
}

// missingOf sums the missing numbers of gap events.
func missingOf(evs []Event) uint64 {
	var n uint64
	for _, e := range evs {
		if e.Type == TypeGap {
			n += e.Missing
		}
	}
	return n
}

// delivered counts the distinct sequence numbers of k stored on FPM (per epoch run).
func delivered(t testing.TB, js jetstream.JetStream, k streams.Key) uint64 {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range natsservertest.Messages(t, js, streams.StreamFPM, streams.FPMSubject(k)) {
		seen[m.Headers().Get(streams.HeaderMsgID)] = true
	}
	return uint64(len(seen))
}

// consumerDone waits until the consumer has acked everything stored for it.
func consumerDone(t testing.TB, js jetstream.JetStream, stream, durable string) {
	t.Helper()
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		c, err := js.PushConsumer(context.Background(), stream, durable)
		if err != nil {
			return err
		}
		ci, err := c.Info(context.Background())
		if err != nil {
			return err
		}
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			return fmt.Errorf("%s: %d pending, %d unacked", durable, ci.NumPending, ci.NumAckPending)
		}
		last, err := natsservertest.LastStoredFor(context.Background(), js, stream, ci.Config)
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream < last {
			return fmt.Errorf("%s: acked up to %d of %d", durable, ci.AckFloor.Stream, last)
		}
		return nil
	})
}
