package bridge

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/streams"
)

// A publisher restarts while the bridge is connected, and its new run's first number the bridge
// receives is above the old run's last (it sent those before the bridge was connected again): the
// sequence never goes back, but the connection ended and a new one began, so the bridge starts a new
// run (a new epoch, Fpm-Run-Start: reconnect) instead of filing the new run under the old one. The old
// run ends in a burst still queued in libzmq when its connection ends: every one of those messages is
// the old run's, none is taken for the new connection's.
func TestReconnectFurtherOnStartsARun(t *testing.T) {
	t.Parallel()
	const burst, newN = 3000, 40
	const newFirst = burst + 500
	env := natsservertest.Start(t)
	// Linger: closing waits until the burst has left for the bridge.
	pub, err := producer.NewSender(nil, "tcp://127.0.0.1:*", -1, producer.WithSubscriberCount(), producer.WithLinger(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	url := pub.Endpoint()
	h := startBridge(t, env, []Endpoint{{URL: url, DPRank: 0}}, nil)
	if err := pub.WaitSubscribers(1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(burst) {
		if err := pub.Send(seq, payload("w", 0, seq)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	// The restarted publisher sent 0..newFirst-1 before the bridge was connected again.
	pub2 := newTestPub(t, url)
	pub2.waitSubscribed()
	for seq := uint64(newFirst); seq < newFirst+newN; seq++ {
		pub2.send(seq, payload("w", 0, seq))
	}
	h.waitStats(30*time.Second, "both runs published", func(s stats) bool { return s.Ranks[0].Published == burst+newN })

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != burst+newN {
		t.Fatalf("stored %d FPMs, want %d", len(msgs), burst+newN)
	}
	epochOf := map[bool]map[string]int{false: {}, true: {}} // new run? -> epoch -> FPMs
	for _, m := range msgs {
		seq := hdrUint(t, m, streams.HeaderSeq)
		newRun := seq >= newFirst
		epochOf[newRun][m.Headers().Get(streams.HeaderEpoch)]++
		want := ""
		if newRun {
			want = streams.RunStartReconnect
		}
		if got := m.Headers().Get(streams.HeaderRunStart); got != want {
			t.Fatalf("seq %d: %s %q, want %q", seq, streams.HeaderRunStart, got, want)
		}
	}
	if len(epochOf[false]) != 1 || len(epochOf[true]) != 1 {
		t.Fatalf("epochs of the old run %v and of the new %v: want one each", epochOf[false], epochOf[true])
	}
	var oldE, newE int64
	for e := range epochOf[false] {
		oldE, _ = strconv.ParseInt(e, 10, 64)
	}
	for e := range epochOf[true] {
		newE, _ = strconv.ParseInt(e, 10, 64)
	}
	if newE <= oldE {
		t.Fatalf("the new run's epoch %d is not after the old run's %d", newE, oldE)
	}
}

// tcpProxy forwards TCP connections from its own port to target; hold drops every connection and
// refuses new ones until release.
type tcpProxy struct {
	t      testing.TB
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	p := &tcpProxy{t: t, addr: fmt.Sprintf("127.0.0.1:%d", freeport.Block(t, "", 1)), target: target}
	p.release()
	t.Cleanup(func() {
		p.hold()
		p.wg.Wait()
	})
	return p
}

func (p *tcpProxy) release() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
}

func (p *tcpProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Two bridges on one publisher, one of them through a connection that breaks while the publisher goes
// on: that bridge sees a reconnect with the sequence further on, which alone it would take for a new
// run; the other bridge's FPMs of the messages both received since show the run goes on, so it keeps
// the run's epoch and the stream holds every FPM once, under one epoch.
func TestReconnectSeenByOneBridgeKeepsTheRun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	proxy := newTCPProxy(t, pub.URL[len("tcp://"):])
	a := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-a" })
	b := startBridge(t, env, []Endpoint{{URL: "tcp://" + proxy.addr, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-b" })
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	send := func(from, to uint64) {
		for seq := from; seq < to; seq++ {
			pub.send(seq, payload("w", 0, seq))
		}
	}
	send(0, 20)
	b.waitStats(15*time.Second, "b received the first 20", func(s stats) bool { return s.Ranks[0].Received == 20 })
	proxy.hold() // b's connection breaks; the publisher goes on
	send(20, 40)
	a.waitStats(15*time.Second, "a published 40", func(s stats) bool { return s.Ranks[0].Published == 40 })
	proxy.release()
	if err := pub.s.WaitSubscribers(1, 15*time.Second); err != nil { // b's new subscription
		t.Fatal(err)
	}
	// Sent one by one so that a stores each before b, whose run waits for that evidence, decides.
	for seq := uint64(40); seq < 80; seq++ {
		pub.send(seq, payload("w", 0, seq))
		time.Sleep(2 * time.Millisecond)
	}
	a.waitStats(15*time.Second, "a published 80", func(s stats) bool { return s.Ranks[0].Published == 80 })
	b.waitStats(15*time.Second, "b published 60", func(s stats) bool { return s.Ranks[0].Published == 60 })

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	epochs := map[string]int{}
	seen := map[uint64]int{}
	for _, m := range msgs {
		epochs[m.Headers().Get(streams.HeaderEpoch)]++
		seen[hdrUint(t, m, streams.HeaderSeq)]++
	}
	if len(msgs) != 80 || len(epochs) != 1 {
		t.Fatalf("stored %d FPMs under epochs %v: want 80 under one", len(msgs), epochs)
	}
	for seq := range uint64(80) {
		if seen[seq] != 1 {
			t.Fatalf("seq %d stored %d times", seq, seen[seq])
		}
	}
}

// A bridge whose reader stalls (its process stopped, as SIGSTOP does) while the other redundant bridge
// stops and a third starts after numbers nobody received: the starting bridge sees none of the stalled
// one's FPMs, and its first number is not where the run the stopped bridge stored goes on, so it
// records the run anew from its first message. Once the stalled bridge runs again it notices the
// stall and re-agrees its run (its connection survived, so the publisher did not restart): the new
// bridge's FPMs show that epoch, and it takes it from the new bridge's first message on, keeping the
// old epoch for what it received before (which the bridge that stopped stored under it, and the
// numbers only the stalled bridge received). The stream holds every FPM once instead of two copies of
// the rest of the run.
func TestStalledBridgeTakesTheRunAnotherRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	var mu sync.Mutex
	held, release := false, make(chan struct{})
	stalled := make(chan struct{}, 1)
	hold := func(int) {
		mu.Lock()
		h := held
		mu.Unlock()
		if h {
			select {
			case stalled <- struct{}{}:
			default:
			}
			<-release
		}
	}
	a := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-a" }, withReaderHold(hold))
	t.Cleanup(func() {
		mu.Lock()
		if held {
			held = false
			close(release)
		}
		mu.Unlock()
	})
	c := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-c" })
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	send := func(from, to uint64) {
		for seq := from; seq < to; seq++ {
			pub.send(seq, payload("w", 0, seq))
			time.Sleep(5 * time.Millisecond)
		}
	}
	send(0, 20)
	a.waitStats(15*time.Second, "a published 20", func(s stats) bool { return s.Ranks[0].Published == 20 })
	mu.Lock()
	held = true
	mu.Unlock()
	<-stalled // a's reader is stopped
	send(20, 30)
	c.waitStats(15*time.Second, "c published 30", func(s stats) bool { return s.Ranks[0].Published == 30 })
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	// Received by the stalled bridge alone (held in its socket's queue): the run's pace does not carry
	// c's last copy, 29, to b's first, 45, when b receives it (b starts after these were sent).
	send(30, 45)
	b := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-b" })
	if err := pub.s.WaitSubscribers(1, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	send(45, 60)
	b.waitStats(15*time.Second, "b published 15", func(s stats) bool { return s.Ranks[0].Published == 15 })
	mu.Lock()
	held = false
	close(release)
	mu.Unlock()
	send(60, 100)
	a.waitStats(15*time.Second, "a published 100", func(s stats) bool { return s.Ranks[0].Published == 100 })
	b.waitStats(15*time.Second, "b published 55", func(s stats) bool { return s.Ranks[0].Published == 55 })

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	seen := map[uint64]int{}
	epochOf := map[uint64]string{}
	for _, m := range msgs {
		q := hdrUint(t, m, streams.HeaderSeq)
		seen[q]++
		epochOf[q] = m.Headers().Get(streams.HeaderEpoch)
	}
	for seq := range uint64(100) {
		if seen[seq] != 1 {
			t.Fatalf("seq %d stored %d times (%d FPMs stored)", seq, seen[seq], len(msgs))
		}
	}
	if epochOf[0] != epochOf[44] || epochOf[44] == epochOf[45] || epochOf[45] != epochOf[99] {
		t.Fatalf("epochs: seq 0 %s, 44 %s, 45 %s, 99 %s: want the first run's up to 44, the one b recorded from 45 on",
			epochOf[0], epochOf[44], epochOf[45], epochOf[99])
	}
}

// As above, and the publisher restarts while the bridge is stalled: once running again the stalled
// bridge reconnects and sees the sequence go back, and takes the restart's epoch the other bridge
// recorded, though it never received that run's first messages.
func TestStalledBridgeTakesTheRestartAnotherRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	url := pub.URL
	var mu sync.Mutex
	held, release := false, make(chan struct{})
	stalled := make(chan struct{}, 1)
	hold := func(int) {
		mu.Lock()
		h := held
		mu.Unlock()
		if h {
			select {
			case stalled <- struct{}{}:
			default:
			}
			<-release
		}
	}
	a := startBridge(t, env, []Endpoint{{URL: url, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-a" }, withReaderHold(hold))
	t.Cleanup(func() {
		mu.Lock()
		if held {
			held = false
			close(release)
		}
		mu.Unlock()
	})
	pub.waitSubscribed()
	send := func(p *testPub, from, to uint64) {
		for seq := from; seq < to; seq++ {
			p.send(seq, payload("w", 0, seq))
			time.Sleep(5 * time.Millisecond)
		}
	}
	send(pub, 0, 200)
	a.waitStats(15*time.Second, "a published 200", func(s stats) bool { return s.Ranks[0].Published == 200 })
	mu.Lock()
	held = true
	mu.Unlock()
	<-stalled
	pub.Close()
	b := startBridge(t, env, []Endpoint{{URL: url, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-b" })
	pub2 := newTestPub(t, url)
	pub2.waitSubscribed() // b
	send(pub2, 0, 60)
	b.waitStats(15*time.Second, "b published 60", func(s stats) bool { return s.Ranks[0].Published == 60 })
	mu.Lock()
	held = false
	close(release)
	mu.Unlock()
	if err := pub2.s.WaitSubscribers(1, 15*time.Second); err != nil { // a, reconnected
		t.Fatal(err)
	}
	send(pub2, 60, 120)
	b.waitStats(15*time.Second, "b published 120", func(s stats) bool { return s.Ranks[0].Published == 120 })
	a.waitStats(15*time.Second, "a published the new run's last 60", func(s stats) bool { return s.Ranks[0].Published >= 260 })

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	epochs := map[string]map[uint64]int{}
	for _, m := range msgs {
		e := m.Headers().Get(streams.HeaderEpoch)
		if epochs[e] == nil {
			epochs[e] = map[uint64]int{}
		}
		epochs[e][hdrUint(t, m, streams.HeaderSeq)]++
	}
	if len(msgs) != 320 || len(epochs) != 2 {
		t.Fatalf("stored %d FPMs under %d epochs: want 320 under two (one per publisher run)", len(msgs), len(epochs))
	}
}
