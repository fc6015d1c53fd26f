package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
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
func jsClient(t testing.TB, url string) jetstream.JetStream {
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

func storedFPMs(t testing.TB, js jetstream.JetStream, filter string) []storedFPM {
	t.Helper()
	var out []storedFPM
	for _, m := range natsservertest.Messages(t, js, streams.StreamFPM, filter) {
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
func streamCount(t testing.TB, js jetstream.JetStream, stream string) (uint64, error) {
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
func waitStreamCount(t testing.TB, js jetstream.JetStream, stream string, want uint64, d time.Duration) {
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
func traceLines(t testing.TB, pattern string) []*schemas.TraceLine {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	var out []*schemas.TraceLine
	for _, f := range files {
		err := tracefile.ReadSegment(f, func(line []byte) error {
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

// metricSamples scrapes a Prometheus text endpoint: sample name → label sets with their values.
type metricSample struct {
	labels map[string]string
	value  float64
}

func scrapeSamples(addr string) (map[string][]metricSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string][]metricSample{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, labelled := strings.Cut(line, "{")
		s := metricSample{labels: map[string]string{}}
		var val string
		if labelled {
			ls, v, ok := strings.Cut(rest, "} ")
			if !ok {
				return nil, fmt.Errorf("metric line %q", line)
			}
			for _, kv := range strings.Split(ls, ",") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return nil, fmt.Errorf("metric line %q", line)
				}
				s.labels[k] = strings.Trim(v, `"`)
			}
			val = v
		} else {
			name, val, _ = strings.Cut(line, " ")
		}
		if s.value, err = strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil {
			return nil, fmt.Errorf("metric line %q: %v", line, err)
		}
		out[name] = append(out[name], s)
	}
	return out, sc.Err()
}

// sum adds the samples of name whose labels include every pair of labels.
func sumSamples(m map[string][]metricSample, name string, labels ...string) float64 {
	var total float64
next:
	for _, s := range m[name] {
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				continue next
			}
		}
		total += s.value
	}
	return total
}
