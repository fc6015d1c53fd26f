package bridge

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// A backlog is committed in atomic batches: every FPM is stored once, in order, and each one's ack
// names the stream sequence it was stored at (the batch ack gives the last one and the count).
func TestBacklogIsCommittedInAtomicBatches(t *testing.T) {
	t.Parallel()
	const n = 5000
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	var mu sync.Mutex
	ackedAt := map[uint64]uint64{} // seq -> stream seq of its ack
	hold := make(chan struct{})
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, nil, withHold(hold),
		withAckHook(func(it *item, _ time.Time) {
			mu.Lock()
			ackedAt[it.seq] = it.streamSeq
			mu.Unlock()
		}))
	pub.waitSubscribed()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(30*time.Second, "the backlog received", func(s stats) bool { return s.Ranks[0].Received == n })
	close(hold) // the whole backlog is queued: the publisher takes it in batches
	h.waitStats(30*time.Second, "every FPM acknowledged", func(s stats) bool { return s.Ranks[0].Published == n })
	if got := counterValue(h.b.metrics.batches); got < n/maxBatch {
		t.Fatalf("%v batches for a backlog of %d, want at least %d", got, n, n/maxBatch)
	}
	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != n {
		t.Fatalf("stored %d, want %d", len(msgs), n)
	}
	batched := 0
	mu.Lock()
	defer mu.Unlock()
	for i, m := range msgs {
		seq := hdrUint(t, m, streams.HeaderSeq)
		if seq != uint64(i) {
			t.Fatalf("message %d holds seq %d: order or exactly-once broken", i, seq)
		}
		if got := ackedAt[seq]; got != m.raw.Sequence {
			t.Fatalf("seq %d stored at stream sequence %d, acknowledged at %d", seq, m.raw.Sequence, got)
		}
		if m.Headers().Get(headerBatchID) != "" {
			batched++
		}
	}
	if batched < n/2 {
		t.Fatalf("%d of %d FPMs stored by a batch commit", batched, n)
	}
}

// A batch holding ids the stream already stored is refused whole by the server: the bridge that lags
// behind its redundant peer republishes that batch's FPMs one by one, each acknowledged as a duplicate,
// and the stream holds every FPM once.
func TestBatchRefusedForStoredIdsIsRepublishedOneByOne(t *testing.T) {
	t.Parallel()
	const n = 3000
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	hold := make(chan struct{})
	a := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-a" })
	b := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = "bridge-b" }, withHold(hold))
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	a.waitStats(30*time.Second, "bridge-a stored everything", func(s stats) bool { return s.Ranks[0].Published == n })
	b.waitStats(30*time.Second, "bridge-b received everything", func(s stats) bool { return s.Ranks[0].Received == n })
	close(hold)
	s := b.waitStats(60*time.Second, "bridge-b acknowledged everything", func(s stats) bool { return s.Ranks[0].Published == n })
	if s.Ranks[0].Duplicates != n {
		t.Fatalf("bridge-b: %d duplicate acks, want %d (every FPM was stored by bridge-a)", s.Ranks[0].Duplicates, n)
	}
	if got := counterValue(b.b.metrics.batchesFailed); got < 1 {
		t.Fatalf("bridge-b: %v batches refused, want at least one", got)
	}
	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != n {
		t.Fatalf("stored %d, want %d: each FPM once", len(msgs), n)
	}
	for i, m := range msgs {
		if seq := hdrUint(t, m, streams.HeaderSeq); seq != uint64(i) || m.Headers().Get(streams.HeaderBridge) != "bridge-a" {
			t.Fatalf("message %d: seq %d from %s", i, seq, m.Headers().Get(streams.HeaderBridge))
		}
	}
}

// The server process (fpmbus's embedded server, sync_interval: always) is SIGKILLed while atomic
// batches are in flight and restarted on its store. Every FPM the bridge saw acknowledged is stored
// once, at the stream sequence its ack named; every FPM sent is stored once or named by a drop marker.
func TestServerKilledMidAtomicBatch(t *testing.T) {
	t.Parallel()
	const n = 40000
	cfg := nodeConfig{Store: t.TempDir(), Port: natsservertest.FreePort(t)}
	node := startNode(t, cfg)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	var mu sync.Mutex
	ackedAt := map[uint64]uint64{}
	h := startBridgeAt(t, natsconn.ConnConfig{URL: node.url}, []Endpoint{{URL: pub.URL, DPRank: 0}},
		func(c *Config) { c.AckTimeout = 2 * time.Second },
		withAckHook(func(it *item, _ time.Time) {
			mu.Lock()
			ackedAt[it.seq] = it.streamSeq
			mu.Unlock()
		}))
	pub.waitSubscribed()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for seq := uint64(0); seq < n; seq++ {
			pub.send(seq, payload("w", 0, seq))
			if seq%200 == 199 {
				time.Sleep(2 * time.Millisecond) // about 50,000 FPM/s: a backlog, committed in batches
			}
		}
	}()
	// Kill while batches are in flight: some acknowledged, FPMs in batches awaiting their ack. The
	// server is frozen first (SIGSTOP) so that what is in flight then stays in flight until the kill,
	// however slowly a loaded machine gets from the check to the kill; if nothing was in flight at the
	// freeze, it is thawed and caught again.
	checkFor(t, 60*time.Second, time.Millisecond, func() error {
		mu.Lock()
		acked := len(ackedAt)
		mu.Unlock()
		if c := counterValue(h.b.metrics.batches); c < 3 || acked < minBatch || h.b.pub.inBatchesN.Load() < minBatch {
			return fmt.Errorf("%v batches sent, %d FPMs in batches in flight: %s", c, h.b.pub.inBatchesN.Load(), fmtStats(h.b.Stats()))
		}
		node.signal(syscall.SIGSTOP)
		// Acks the server sent just before it froze are still on their way: let them arrive, so that
		// what is in flight now is what the kill finds in flight.
		time.Sleep(200 * time.Millisecond)
		if h.b.pub.inBatchesN.Load() == 0 {
			node.signal(syscall.SIGCONT)
			return errors.New("every batch was acknowledged before the server froze")
		}
		return nil
	})
	node.kill9()
	mu.Lock()
	ackedBefore := len(ackedAt)
	mu.Unlock()
	node = startNode(t, cfg)
	<-sent
	h.waitStats(60*time.Second, "every FPM acknowledged or dropped", func(s stats) bool {
		return s.Ranks[0].Received == n && s.Ranks[0].Published+s.Ranks[0].Dropped == n
	})
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(h.b.metrics.batchesFailed); got < 1 {
		t.Fatalf("no batch was in flight at the kill (%v failed)", got)
	}
	nc, err := natsconn.Connect(natsconn.ConnConfig{URL: node.url, Name: "check"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	msgs := messages(t, js, streams.StreamFPM, ">")
	stored := map[uint64]uint64{} // seq -> stream sequence
	for _, m := range msgs {
		seq := hdrUint(t, m, streams.HeaderSeq)
		if _, dup := stored[seq]; dup {
			t.Fatalf("seq %d stored twice", seq)
		}
		stored[seq] = m.raw.Sequence
	}
	marked := map[uint64]bool{}
	for _, m := range messages(t, js, streams.StreamEvents, streams.DropMarkerWildcard) {
		var dm streams.DropMarker
		if err := json.Unmarshal(m.Data(), &dm); err != nil {
			t.Fatal(err)
		}
		for s := dm.FirstSeq; s <= dm.LastSeq; s++ {
			marked[s] = true
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for seq, at := range ackedAt {
		if stored[seq] != at {
			t.Fatalf("seq %d acknowledged at stream sequence %d, stored at %d", seq, at, stored[seq])
		}
	}
	for seq := uint64(0); seq < n; seq++ {
		_, ok := stored[seq]
		if ok == marked[seq] {
			t.Fatalf("seq %d: stored %v, in a drop marker %v: want exactly one", seq, ok, marked[seq])
		}
	}
	t.Logf("%d acknowledged before the kill, %d stored, %d in drop markers, %v batches, %v failed", ackedBefore,
		len(stored), len(marked), counterValue(h.b.metrics.batches), counterValue(h.b.metrics.batchesFailed))
}

// nodeEnv carries a node process's configuration (JSON nodeConfig): the test binary then runs
// fpmbus's embedded server instead of the tests (TestMain).
const nodeEnv = "FPMBUS_TEST_BRIDGE_NODE"

type nodeConfig struct {
	Store string `json:"store"`
	Port  int    `json:"port"`
}

// runNode runs the server nodeEnv describes (natsserver.StartServer: the embedded server of `fpmbus up`,
// sync_interval always) until SIGTERM or SIGKILL, printing "READY <url>" once it accepts clients.
func runNode() {
	var c nodeConfig
	if err := json.Unmarshal([]byte(os.Getenv(nodeEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, "node config:", err)
		os.Exit(2)
	}
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:" + strconv.Itoa(c.Port), StoreDir: c.Store})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("READY", srv.ClientURL())
	<-sig
	_ = srv.Shutdown(context.Background())
	os.Exit(0)
}

// node is a running server process.
type node struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

// startNode starts cfg as a process and waits until it accepts clients; Cleanup kills it.
func startNode(t testing.TB, cfg nodeConfig) *node {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &node{cmd: cmd, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		defer close(n.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if url, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- url
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(n.kill9)
	select {
	case n.url = <-ready:
	case <-n.done:
		t.Fatalf("node %s exited before it was ready", raw)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s not ready after 30s", raw)
	}
	return n
}

// kill9 SIGKILLs the process and waits until it is gone.
// signal sends sig to the node's process while it runs.
func (n *node) signal(sig syscall.Signal) {
	select {
	case <-n.done:
	default:
		_ = n.cmd.Process.Signal(sig)
	}
}

func (n *node) kill9() {
	select {
	case <-n.done:
		return
	default:
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.done
}

// An operator turns atomic publish off on the FPM stream while the bridge runs: the first batch is
// refused (JSAtomicPublishDisabledErr), its FPMs and every later one go one by one, each stored once.
func TestAtomicPublishTurnedOffFallsBackToOneByOne(t *testing.T) {
	t.Parallel()
	const n = 2000
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	hold := make(chan struct{})
	h := startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, nil, withHold(hold))
	s, err := env.JS.Stream(t.Context(), streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.AllowAtomicPublish {
		t.Fatal("the bridge's start did not turn atomic publish on")
	}
	cfg.AllowAtomicPublish = false
	if _, err := env.JS.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	pub.waitSubscribed()
	for seq := uint64(0); seq < n; seq++ {
		pub.send(seq, payload("w", 0, seq))
	}
	h.waitStats(30*time.Second, "the backlog received", func(s stats) bool { return s.Ranks[0].Received == n })
	close(hold)
	st := h.waitStats(60*time.Second, "every FPM acknowledged", func(s stats) bool { return s.Ranks[0].Published == n })
	if st.Ranks[0].Duplicates != 0 || counterValue(h.b.metrics.batchesFailed) < 1 {
		t.Fatalf("%d duplicates, %v batches refused: want none and at least one", st.Ranks[0].Duplicates,
			counterValue(h.b.metrics.batchesFailed))
	}
	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != n {
		t.Fatalf("stored %d, want %d", len(msgs), n)
	}
	for i, m := range msgs {
		if seq := hdrUint(t, m, streams.HeaderSeq); seq != uint64(i) || m.Headers().Get(headerBatchID) != "" {
			t.Fatalf("message %d: seq %d, batch %q: want every FPM once, none in a batch", i, seq, m.Headers().Get(headerBatchID))
		}
	}
}
