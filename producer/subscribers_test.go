package producer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/producer/producertest"
)

// waitCount waits until s.Subscribers() is want (libzmq reports joins and leaves asynchronously).
func waitCount(t *testing.T, s *producer.Sender, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	got := -1
	for time.Now().Before(deadline) {
		var err error
		if got, err = s.Subscribers(); err != nil {
			t.Fatal(err)
		}
		if got == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s has %d subscribers, want %d", s.Endpoint(), got, want)
}

// rawSub is a SUB socket with the given subscriptions, closed at cleanup or by its close func.
func rawSub(t *testing.T, ep string, topics ...string) func() {
	t.Helper()
	zctx, err := zmq4.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq4.SUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	for _, tp := range topics {
		if err := sock.SetSubscribe(tp); err != nil {
			t.Fatal(err)
		}
	}
	if err := sock.Connect(ep); err != nil {
		t.Fatal(err)
	}
	closed := false
	closeFn := func() {
		if !closed {
			closed = true
			sock.Close()
			zctx.Term()
		}
	}
	t.Cleanup(closeFn)
	return closeFn
}

// A counted sender knows, at any time, how many subscribers receive what it sends: joins and leaves
// (a subscriber's process going away included) are counted; a subscriber to another topic receives no
// FPM and is not counted; one that subscribed twice still leaves once.
func TestSenderCountsItsSubscribers(t *testing.T) {
	ep := "tcp://127.0.0.1:" + strconv.Itoa(producertest.FreeBasePort(t, "", 1))
	s, err := producer.NewSender(nil, ep, 0, producer.WithSubscriberCount(), producer.WithLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitCount(t, s, 0)
	a := rawSub(t, ep, "")
	waitCount(t, s, 1)
	b := rawSub(t, ep, "", "")
	waitCount(t, s, 2)
	other := rawSub(t, ep, "x")
	c := rawSub(t, ep, "")
	waitCount(t, s, 3)
	b()
	waitCount(t, s, 2)
	a()
	c()
	waitCount(t, s, 0)
	other()
	// A sender without the count says so.
	plain, err := producer.NewSender(nil, "tcp://127.0.0.1:"+strconv.Itoa(producertest.FreeBasePort(t, "", 1)), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Subscribers(); err == nil || !strings.Contains(err.Error(), "WithSubscriberCount") {
		t.Fatalf("plain sender: %v", err)
	}
}

// AwaitSubscribers waits for every sender under one deadline and names, by label, the ones short of
// subscribers; a subscriber that joined and left does not count.
func TestAwaitSubscribersNamesTheSocketsShortOfSubscribers(t *testing.T) {
	base := producertest.FreeBasePort(t, "", 3)
	var senders []*producer.Sender
	for i := range 3 {
		s, err := producer.NewSender(nil, "tcp://127.0.0.1:"+strconv.Itoa(base+i), 0, producer.WithSubscriberCount(), producer.WithLinger(0))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		senders = append(senders, s)
	}
	rawSub(t, senders[1].Endpoint(), "")
	gone := rawSub(t, senders[2].Endpoint(), "")
	waitCount(t, senders[2], 1)
	gone()
	// The leave reaches the sender's monitor asynchronously; once it is counted the subscriber that
	// joined and left must not count (on a loaded machine it may take longer than the await below).
	waitCount(t, senders[2], 0)
	labels := []string{"r/0", "r/1", "r/2"}
	err := producer.AwaitSubscribers(context.Background(), senders, labels, 1, 200*time.Millisecond)
	want := "2 of 3 sockets have fewer than 1 subscribers after 200ms: r/0 (" + senders[0].Endpoint() + ") has 0, r/2 (" + senders[2].Endpoint() + ") has 0"
	if !errors.Is(err, producer.ErrNoSubscribers) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want ErrNoSubscribers saying %q", err, want)
	}
	rawSub(t, senders[0].Endpoint(), "")
	rawSub(t, senders[2].Endpoint(), "")
	if err := producer.AwaitSubscribers(context.Background(), senders, labels, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The descriptors a sender holds are at most what fdbudget is told: measured over 20 bound senders
// in one context, after the context's threads have started.
func TestSenderDescriptorCost(t *testing.T) {
	for name, tc := range map[string]struct {
		opts []producer.SenderOption
		max  int
	}{
		"plain":   {nil, producer.DescriptorsPerSocket},
		"counted": {[]producer.SenderOption{producer.WithSubscriberCount()}, producer.DescriptorsPerSocketCounted},
	} {
		t.Run(name, func(t *testing.T) {
			zctx, err := zmq4.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			defer zctx.Term()
			const n = 20
			base := producertest.FreeBasePort(t, "", n+1)
			open := func(port int) *producer.Sender {
				s, err := producer.NewSender(zctx, "tcp://127.0.0.1:"+strconv.Itoa(port), 0, append(tc.opts, producer.WithLinger(0))...)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			first := open(base) // starts the context's I/O thread
			defer first.Close()
			before, err := fdbudget.InUse()
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= n; i++ {
				defer open(base + i).Close()
			}
			after, err := fdbudget.InUse()
			if err != nil {
				t.Fatal(err)
			}
			if per := float64(after-before) / n; per > float64(tc.max) {
				t.Fatalf("%d senders hold %d descriptors, %.2f each; the budget says %d", n, after-before, per, tc.max)
			} else {
				t.Logf("%.2f descriptors per sender (budget %d)", per, tc.max)
			}
		})
	}
}
