package tracefile

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// member returns one gzip member holding s.
func member(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// testLogger logs into the test's output (shown on failure or with -v).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testFPM is a valid FPM of key, and its message as the bridge publishes it (natsservertest).
type testFPM struct {
	key        streams.Key
	counter    int64
	receivedMs int64 // Fpm-Received-At-Ms; 0 = header missing
	heartbeat  bool
}

func (f testFPM) body(t testing.TB) []byte {
	return natsservertest.FPMBody(t, f.key, f.counter, f.heartbeat)
}

func (f testFPM) msg(t testing.TB) *nats.Msg {
	return natsservertest.FPMMsg(t, f.key, f.counter, f.receivedMs, "", f.heartbeat)
}

// fakeMsg is a Message without a server.
type fakeMsg struct {
	subject string
	data    []byte
	hdr     nats.Header
}

func (m *fakeMsg) Subject() string      { return m.subject }
func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Headers() nats.Header { return m.hdr }

// segmentLines returns the lines of the segment at path.
func segmentLines(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	if err := ReadSegment(path, func(l []byte) error {
		out = append(out, string(l))
		return nil
	}); err != nil {
		t.Fatalf("ReadSegment(%s): %v", path, err)
	}
	return out
}
