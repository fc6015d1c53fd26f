package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/internal/smalldisk"
	"github.com/fpmbus/fpmbus/streams"
)

// Figures of the edge outage test: the outage an edge must ride out, at a fleet-node's FPM rate.
const (
	edgeOutage      = 60 * time.Second
	edgeRanks       = 4
	edgeRatePerRank = 1250 // 5,000 FPM/s over edgeRanks
	edgeLead        = 2 * time.Second
	edgeTail        = 2 * time.Second
)

// freeAddr returns a loopback host:port that was free a moment ago (to restart a server at it).
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// centralServer is the central JetStream of the edge topology: domain "central", a leafnode listener.
type centralServer struct {
	t        testing.TB
	listen   string
	leafAddr string
	store    string
	srv      *natsserver.Server
}

func newCentral(t testing.TB) *centralServer {
	c := &centralServer{t: t, listen: freeAddr(t), leafAddr: freeAddr(t), store: t.TempDir()}
	c.start()
	t.Cleanup(c.stop)
	return c
}

func (c *centralServer) start() {
	c.t.Helper()
	host, port, _ := net.SplitHostPort(c.leafAddr)
	p, _ := strconv.Atoi(port)
	base := &server.Options{JetStreamDomain: edgenode.DefaultCentralDomain,
		LeafNode: server.LeafNodeOpts{Host: host, Port: p}}
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: c.listen, StoreDir: c.store, Name: "central",
		Base: base, Sync: natsserver.SyncPolicy{Interval: time.Second}})
	if err != nil {
		c.t.Fatal(err)
	}
	c.srv = srv
}

func (c *centralServer) stop() {
	if c.srv != nil {
		_ = c.srv.Shutdown(context.Background())
		c.srv = nil
	}
}

// streamMsg is what a consumer of a stream sees of one message.
type streamMsg struct {
	subject string
	header  nats.Header
	data    []byte
}

// readStream reads the first n messages of stream in order with an ordered consumer and hands each
// to each, stopping at its first error.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, n uint64, each func(i uint64, m streamMsg) error) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	// One pull request after the other, each for the next 20,000 messages, fetched while the caller
	// works on the previous ones.
	it, err := cons.Messages(jetstream.PullMaxMessages(20000))
	if err != nil {
		return err
	}
	defer it.Stop()
	for i := uint64(0); i < n; i++ {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return fmt.Errorf("read %d of %d messages of %s: %w", i, n, stream, err)
		}
		if err := each(i, streamMsg{subject: m.Subject(), header: m.Headers(), data: m.Data()}); err != nil {
			return err
		}
	}
	return nil
}

// streamLen is how many messages stream holds.
func streamLen(js jetstream.JetStream, stream string) (uint64, error) {
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CachedInfo().State.Msgs, nil
}

// TestEdgeRidesOutCentralOutage cuts the edge from the central server for edgeOutage at 5,000 FPM/s
// (the central server is stopped and restarted on the same store and ports). Afterwards the central
// FPM stream holds every FPM exactly once, per rank in order, each message as the bridge published it
// at the edge (subject, body, every header including Nats-Msg-Id), and the bridge dropped nothing.
func TestEdgeRidesOutCentralOutage(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("rides out a 60 s outage")
	}
	t.Cleanup(func() { natsservertest.WaitSourceSetups(t, 40*time.Second) }) // runs after the servers stopped
	central := newCentral(t)
	edge, err := StartEdge(edgenode.EdgeConfig{Node: "node1", StoreDir: t.TempDir(), Remotes: "nats-leaf://" + central.leafAddr,
		Listen: "127.0.0.1:0", Sync: natsserver.SyncPolicy{Interval: time.Second}}, streams.Config{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Close(context.Background()) })

	pubs := make([]*testPub, edgeRanks)
	eps := make([]Endpoint, edgeRanks)
	for r := range pubs {
		pubs[r] = newTestPub(t, "tcp://127.0.0.1:*")
		eps[r] = Endpoint{URL: pubs[r].URL, DPRank: r}
	}
	nc := edge.Conn()
	cfg := Config{Endpoints: eps, BridgeID: "edge-bridge", Logger: testLogger()}
	b, err := New(cfg, nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, nc: nc, b: b, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- b.Run(ctx) }()
	t.Cleanup(func() { _ = h.stop() })
	select {
	case <-b.Ready():
	case <-time.After(15 * time.Second):
		t.Fatal("bridge not ready after 15s")
	}
	select {
	case <-edge.Sourced():
	case <-time.After(20 * time.Second):
		t.Fatal("central streams do not source the edge after 20s")
	}
	for _, p := range pubs {
		p.waitSubscribed()
	}

	// Each rank publishes at edgeRatePerRank until stop, seq 1, 2, ...
	stop := make(chan struct{})
	sent := make([]uint64, edgeRanks)
	var wg sync.WaitGroup
	for r, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				due := uint64(time.Since(start).Seconds() * edgeRatePerRank)
				for sent[r] < due {
					sent[r]++
					if err := p.s.SendFrames(nil, seqFrame(sent[r]), payload("w-edge", r, sent[r])); err != nil {
						t.Errorf("rank %d send %d: %v", r, sent[r], err)
						return
					}
				}
			}
		}()
	}
	time.Sleep(edgeLead)
	central.stop()
	cutAt := time.Now()
	time.Sleep(edgeOutage)
	central.start()
	restartedAt := time.Now()
	t.Logf("central server away for %v", time.Since(cutAt).Round(time.Millisecond))

	time.Sleep(edgeTail)
	close(stop)
	wg.Wait()
	var total uint64
	for _, n := range sent {
		total += n
	}
	t.Logf("sent %d FPMs over %d ranks", total, edgeRanks)

	// The bridge published everything to the edge and dropped nothing.
	st := h.waitStats(30*time.Second, "every FPM acknowledged at the edge", func(s stats) bool {
		return s.Total().Published == total
	})
	if tot := st.Total(); tot.Dropped != 0 || tot.Invalid != 0 || tot.DeadLettersLost != 0 || tot.Duplicates != 0 || st.MarkersPublished != 0 {
		t.Fatalf("bridge stats: %s", fmtStats(st))
	}

	// The central stream catches up: it holds as many FPMs as were sent. The central server asks for
	// its source again 5 s after its first request, which it sent before the leaf reconnected and
	// which therefore went unanswered (the source is durable, see edgenode.EdgeSourceConsumer); the
	// backlog then drains at the central server's store rate.
	cnc, err := nats.Connect(central.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer cnc.Close()
	cjs, err := jetstream.New(cnc)
	if err != nil {
		t.Fatal(err)
	}
	var before uint64 // what the central stream held when it first answered after the restart
	resumed := false
	checkFor(t, 90*time.Second, 100*time.Millisecond, func() error {
		s, err := cjs.Stream(context.Background(), streams.StreamFPM)
		if err != nil {
			return err
		}
		n := s.CachedInfo().State.Msgs
		if before == 0 {
			before = n
		} else if !resumed && n > before {
			resumed = true
			t.Logf("central sourcing resumed %v after the restart (from %d FPMs)", time.Since(restartedAt).Round(time.Millisecond), before)
		}
		if n < total {
			return fmt.Errorf("central FPM holds %d of %d FPMs", n, total)
		}
		return nil
	})
	t.Logf("central caught up %v after the restart", time.Since(restartedAt).Round(time.Millisecond))

	ejs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	nEdge, err := streamLen(ejs, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	nCentral, err := streamLen(cjs, streams.StreamFPM)
	if err != nil {
		t.Fatal(err)
	}
	if nEdge != total || nCentral != total {
		t.Fatalf("sent %d FPMs; the edge stream holds %d, the central stream %d", total, nEdge, nCentral)
	}

	// Both copies are read at once (two readers, each on its own server) and compared message by
	// message as they arrive, the central one against the edge's.
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	fromEdge := make(chan streamMsg, 20000)
	var edgeErr error
	var rg sync.WaitGroup
	rg.Go(func() {
		defer close(fromEdge)
		edgeErr = readStream(rctx, ejs, streams.StreamFPM, total, func(_ uint64, m streamMsg) error {
			select {
			case fromEdge <- m:
				return nil
			case <-rctx.Done():
				return rctx.Err()
			}
		})
	})
	ids := make(map[string]bool, total)
	next := make(map[string]uint64, edgeRanks) // subject -> next Fpm-Seq
	centralErr := readStream(rctx, cjs, streams.StreamFPM, total, func(i uint64, c streamMsg) error {
		e, ok := <-fromEdge
		if !ok {
			return fmt.Errorf("central message %d: the edge's copy ended", i)
		}
		if c.subject != e.subject || string(c.data) != string(e.data) {
			return fmt.Errorf("central message %d: subject %s, body %q; the edge stored subject %s, body %q", i, c.subject, c.data, e.subject, e.data)
		}
		for k, v := range e.header {
			if strings.HasPrefix(k, "Nats-Batch-") {
				continue // the atomic batch the edge stored it in; sourcing drops the batch headers
			}
			if got := c.header.Values(k); !slices.Equal(got, v) {
				return fmt.Errorf("central message %d (%s): header %s is %q, the edge stored %q", i, c.subject, k, got, v)
			}
		}
		for k := range c.header {
			if _, ok := e.header[k]; !ok && k != "Nats-Stream-Source" {
				return fmt.Errorf("central message %d: header %s that the edge's message does not have", i, k)
			}
		}
		id := c.header.Get(streams.HeaderMsgID)
		if id == "" || ids[id] {
			return fmt.Errorf("central message %d (%s): Nats-Msg-Id %q is empty or stored twice", i, c.subject, id)
		}
		ids[id] = true
		seq, err := strconv.ParseUint(c.header.Get(streams.HeaderSeq), 10, 64)
		if err != nil {
			return fmt.Errorf("central message %d: %s: %v", i, streams.HeaderSeq, err)
		}
		if want := next[c.subject] + 1; seq != want {
			return fmt.Errorf("central message %d (%s): seq %d, want %d (per-rank order)", i, c.subject, seq, want)
		}
		next[c.subject] = seq
		return nil
	})
	rcancel() // the edge's reader stops if the comparison did
	rg.Wait()
	if edgeErr != nil || centralErr != nil {
		t.Fatalf("read the edge's FPM: %v; the central FPM, compared with it: %v", edgeErr, centralErr)
	}
	t.Logf("read and compared both copies")
	if len(next) != edgeRanks {
		t.Fatalf("central stream holds %d publisher subjects, want %d", len(next), edgeRanks)
	}
	for subj, last := range next {
		r, _ := strconv.Atoi(subj[len(subj)-1:])
		if last != sent[r] {
			t.Fatalf("%s: last seq %d, sent %d", subj, last, sent[r])
		}
	}
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("bridge stopped")
}

// Two edge servers on one store would corrupt it: the directory has one owner, a second edge is refused
// naming the first, and once the first has closed the directory is free again.
func TestEdgeDirectoryHasOneOwner(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := func(node string) edgenode.EdgeConfig {
		return edgenode.EdgeConfig{Node: node, StoreDir: dir, Remotes: "nats-leaf://127.0.0.1:" + strconv.Itoa(freeport.Ports(t, 1)[0]), Listen: "127.0.0.1:0"}
	}
	first, err := StartEdge(cfg("node1"), streams.Config{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	_, err = StartEdge(cfg("node2"), streams.Config{}, testLogger())
	var held *fsutil.HeldError
	if !errors.As(err, &held) || held.Holder == nil || held.Holder.Role != "bridge edge server" || !strings.Contains(err.Error(), filepath.Join(dir, fsutil.DirLockName)) {
		t.Fatalf("second edge on %s: %v, want it refused naming the first", dir, err)
	}
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	again, err := StartEdge(cfg("node1"), streams.Config{}, testLogger())
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	if err := again.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The edge's own disk fills: its store watch names the fault and, once the disk has room again,
// restarts the edge's JetStream, so publishing to it resumes without restarting the bridge.
func TestEdgeRidesOutItsFullDisk(t *testing.T) {
	t.Parallel()
	central := newCentral(t)
	mnt := smalldisk.Mount(t, 32<<20)
	edge, err := StartEdge(edgenode.EdgeConfig{Node: "full", StoreDir: filepath.Join(mnt, "edge"), Remotes: "nats-leaf://" + central.leafAddr,
		Listen: "127.0.0.1:0"}, streams.Config{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Close(context.Background()) })
	js, err := jetstream.New(edge.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOCAL", Subjects: []string{"local.>"}, MaxBytes: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	pub := func(i int) error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "local.x", fmt.Appendf(nil, "message %d %0400d", i, i), jetstream.WithMsgID(strconv.Itoa(i)))
		return err
	}
	i := 0
	for ; i < 10; i++ {
		if err := pub(i); err != nil {
			t.Fatal(err)
		}
	}
	free := smalldisk.Fill(t, mnt)
	for ; pub(i) == nil; i++ {
		if i == 200 {
			t.Fatal("190 publishes on a full disk were acknowledged")
		}
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := edge.Server().StoreStatus(); st.State != natsserver.StoreDiskFull {
			return fmt.Errorf("store %+v, want disk_full", st)
		}
		return nil
	})
	free()
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := edge.Server().StoreStatus(); st.State != natsserver.StoreOK || st.Recoveries != 1 {
			return fmt.Errorf("store %+v, want ok after one restart", st)
		}
		return nil
	})
	if err := pub(i); err != nil {
		t.Fatalf("publish after the edge's disk had room again: %v", err)
	}
}
