package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// capture records every well-formed FPM a real ZMQ SUB socket receives from one rank: seq → canonical
// JSON of the payload. It is what "the published payload" means in these tests.
type capture struct {
	mu   sync.Mutex
	got  map[uint64][]byte
	bad  int
	quit chan struct{}
	done chan struct{}
}

func startCapture(t *testing.T, endpoint string) *capture {
	t.Helper()
	sub := producertest.NewSubscriber(t, endpoint, 1_000_000)
	c := &capture{got: map[uint64][]byte{}, quit: make(chan struct{}), done: make(chan struct{})}
	go func() { // owns sub until quit
		defer close(c.done)
		for {
			select {
			case <-c.quit:
				return
			default:
			}
			m, err := sub.Recv(100 * time.Millisecond)
			if err != nil {
				continue
			}
			f, err := schemas.DecodeFPM(m.Payload())
			c.mu.Lock()
			if !m.Wellformed || err != nil {
				c.bad++
			} else {
				c.got[m.Seq] = append([]byte(nil), f.JSON...)
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *capture) stop() {
	select {
	case <-c.quit:
	default:
		close(c.quit)
	}
	<-c.done
}

func (c *capture) snapshot() map[uint64][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint64][]byte, len(c.got))
	for k, v := range c.got {
		out[k] = v
	}
	return out
}

// jsClient connects to url for assertions on stream contents.
func jsClient(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// storedFPM is one message of the FPM stream, decoded for assertions.
type storedFPM struct {
	subject string
	key     streams.Key
	seq     uint64
	epoch   string
	body    []byte
	header  nats.Header
}

func storedFPMs(t *testing.T, js jetstream.JetStream, filter string) []storedFPM {
	t.Helper()
	var out []storedFPM
	for _, m := range streamstest.Messages(t, js, streams.StreamFPM, filter) {
		k, err := streams.ParseFPMSubject(m.Subject())
		if err != nil {
			t.Fatalf("stored subject: %v", err)
		}
		seq, err := strconv.ParseUint(m.Headers().Get(streams.HeaderSeq), 10, 64)
		if err != nil {
			t.Fatalf("%s: %s header: %v", m.Subject(), streams.HeaderSeq, err)
		}
		out = append(out, storedFPM{subject: m.Subject(), key: k, seq: seq, epoch: m.Headers().Get(streams.HeaderEpoch), body: m.Data(), header: m.Headers()})
	}
	return out
}

// streamCount returns the number of messages in stream.
func streamCount(t *testing.T, js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(t.Context())
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// waitStreamCount waits until stream holds exactly want messages (and stays there briefly).
func waitStreamCount(t *testing.T, js jetstream.JetStream, stream string, want uint64, d time.Duration) {
	t.Helper()
	eventually(t, d, func() error {
		n, err := streamCount(t, js, stream)
		if err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("stream %s has %d messages, want %d", stream, n, want)
		}
		return nil
	})
}

// traceLines decodes every line of every segment matching pattern with the trace package's own reader,
// which reads multi-member gzip, takes an empty segment (created just before a crash) as no lines, and
// fails on a torn or corrupt one.
func traceLines(t *testing.T, pattern string) []*schemas.TraceLine {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	var out []*schemas.TraceLine
	for _, f := range files {
		err := trace.ReadSegment(f, func(line []byte) error {
			l, err := schemas.ParseTraceLine(line)
			if err != nil {
				return err
			}
			out = append(out, l)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return out
}
