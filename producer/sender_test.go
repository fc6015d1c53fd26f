package producer_test

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
)

const recvTimeout = 5 * time.Second

// sendUntilReceived sends a probe message until the subscriber gets one: the slow-joiner handshake.
func sendUntilReceived(t *testing.T, s *producer.Sender, sub *producertest.Subscriber) {
	t.Helper()
	deadline := time.Now().Add(recvTimeout)
	for time.Now().Before(deadline) {
		if err := s.SendFrames([]byte("probe")); err != nil {
			t.Fatalf("send probe: %v", err)
		}
		if m, err := sub.Recv(20 * time.Millisecond); err == nil {
			if string(m.Frames[0]) != "probe" {
				t.Fatalf("probe came back as %q", m.Frames)
			}
			// Drain any further probes.
			for {
				if _, err := sub.Recv(50 * time.Millisecond); err != nil {
					return
				}
			}
		}
	}
	t.Fatal("subscriber never connected")
}

func TestSenderFrames(t *testing.T) {
	port := producertest.FreeBasePort(t, "", 1)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	s, err := producer.NewSender(nil, ep, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Endpoint() != ep {
		t.Errorf("Endpoint() = %q, want %q", s.Endpoint(), ep)
	}
	sub := producertest.NewSubscriber(t, ep, 0)
	sendUntilReceived(t, s, sub)

	t.Run("Send writes Dynamo's three frames", func(t *testing.T) {
		payload := []byte{0x80} // an empty msgpack map
		if err := s.Send(0x0102030405060708, payload); err != nil {
			t.Fatal(err)
		}
		m, err := sub.Recv(recvTimeout)
		if err != nil {
			t.Fatal(err)
		}
		want := [][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8}, {0x80}}
		if len(m.Frames) != 3 || !m.Wellformed || m.Seq != 0x0102030405060708 {
			t.Fatalf("got %q (wellformed %v, seq %#x), want %q", m.Frames, m.Wellformed, m.Seq, want)
		}
		for i := range want {
			if !bytes.Equal(m.Frames[i], want[i]) {
				t.Fatalf("frame %d = %q, want %q", i, m.Frames[i], want[i])
			}
		}
	})
	t.Run("SendFrames sends anything as is", func(t *testing.T) {
		for _, frames := range [][][]byte{
			{{}, {1, 2, 3}, []byte("not msgpack")},                      // short sequence frame
			{{}, {0, 0, 0, 0, 0, 0, 0, 1}},                              // two frames
			{[]byte("topic"), {0, 0, 0, 0, 0, 0, 0, 2}, {0x80}, {0x80}}, // four frames, a topic
		} {
			if err := s.SendFrames(frames...); err != nil {
				t.Fatal(err)
			}
			m, err := sub.Recv(recvTimeout)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Frames) != len(frames) || m.Wellformed {
				t.Fatalf("sent %q, received %q (wellformed %v)", frames, m.Frames, m.Wellformed)
			}
			for i := range frames {
				if !bytes.Equal(m.Frames[i], frames[i]) {
					t.Fatalf("frame %d = %q, want %q", i, m.Frames[i], frames[i])
				}
			}
		}
		if err := s.SendFrames(); err == nil {
			t.Error("SendFrames() with no frames succeeded")
		}
	})
	t.Run("closed sender", func(t *testing.T) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := s.Send(1, nil); !errors.Is(err, producer.ErrClosed) {
			t.Fatalf("Send after Close = %v, want ErrClosed", err)
		}
	})
}

// TestSenderEAGAIN: with XPUB_NODROP and a subscriber that never reads, the PUB pipe fills up and a
// non-blocking send reports EAGAIN as ErrDropped. (Without NODROP libzmq drops silently: see
// TestPublisherSlowSubscriberGaps.)
func TestSenderEAGAIN(t *testing.T) {
	port := producertest.FreeBasePort(t, "", 1)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	s, err := producer.NewSender(nil, ep, 1, producer.WithNoDrop(true), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sub := producertest.NewSubscriber(t, ep, 1)
	sendUntilReceived(t, s, sub)

	payload := make([]byte, 64<<10)
	deadline := time.Now().Add(10 * time.Second)
	sent := 0
	for {
		err := s.Send(uint64(sent), payload)
		if errors.Is(err, producer.ErrDropped) {
			break
		}
		if err != nil {
			t.Fatalf("send %d: %v", sent, err)
		}
		sent++
		if time.Now().After(deadline) {
			t.Fatalf("no EAGAIN after %d sends of %d bytes", sent, len(payload))
		}
	}
	t.Logf("EAGAIN after %d messages", sent)
}

func TestSenderBindConflict(t *testing.T) {
	port := producertest.FreeBasePort(t, "", 1)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	_, err = producer.NewSender(nil, ep, 0)
	if want := "bind " + ep + ": address already in use"; err == nil || err.Error() != want {
		t.Fatalf("NewSender on a taken port: %v, want %q", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("error %v is not EADDRINUSE", err)
	}
	if _, err := producer.NewSender(nil, ep, 0, producer.WithLinger(-time.Second)); err == nil ||
		!strings.Contains(err.Error(), "linger") {
		t.Errorf("negative linger: %v", err)
	}
}
