package bridge

import (
	"os"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/fpmbus/fpmbus/internal/fdbudget"
	"github.com/fpmbus/fpmbus/producer"
)

// An endpoint's reader holds at most DescriptorsPerEndpoint descriptors: measured over 20 endpoints,
// each SUB socket connected to its publisher (whose accepted connection, one descriptor each, is
// counted and taken off), with its monitor and the duplicate of its ZMQ_FD, after the context's
// threads have started.
func TestEndpointDescriptorCost(t *testing.T) {
	const n = 20
	pubs := make([]*producer.Sender, n+1)
	for i := range pubs {
		s, err := producer.NewSender(nil, "tcp://127.0.0.1:*", -1, producer.WithLinger(0))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		pubs[i] = s
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	type opened struct {
		sock  *zmq.Socket
		watch *sessionWatch
		fd    *os.File
	}
	open := func(i int) opened {
		sock, err := newSubSocket(zctx, pubs[i].Endpoint(), 1000, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		w, err := watchSession(zctx, sock, 1000+i)
		if err != nil {
			t.Fatal(err)
		}
		if err := sock.Connect(pubs[i].Endpoint()); err != nil {
			t.Fatal(err)
		}
		f, _, err := pollFile(sock)
		if err != nil {
			t.Fatal(err)
		}
		// Connected and subscribed: a probe arrives.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := pubs[i].SendFrames([]byte("probe")); err != nil {
				t.Fatal(err)
			}
			if _, err := sock.RecvBytes(0); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("endpoint %d never connected", i)
			}
		}
		return opened{sock, w, f}
	}
	closeAll := func(os []opened) {
		for _, o := range os {
			o.fd.Close()
			o.sock.Close()
			o.watch.close()
		}
	}
	first := open(0) // starts the context's I/O thread
	defer closeAll([]opened{first})
	before, err := fdbudget.InUse()
	if err != nil {
		t.Fatal(err)
	}
	var all []opened
	for i := 1; i <= n; i++ {
		all = append(all, open(i))
	}
	defer closeAll(all)
	after, err := fdbudget.InUse()
	if err != nil {
		t.Fatal(err)
	}
	per := float64(after-before)/n - 1 // less the publisher's accepted connection
	if per > DescriptorsPerEndpoint {
		t.Fatalf("%d endpoints hold %d descriptors with their publishers' connections, %.2f each without; the budget says %d",
			n, after-before, per, DescriptorsPerEndpoint)
	}
	t.Logf("%.2f descriptors per endpoint (budget %d)", per, DescriptorsPerEndpoint)
}
