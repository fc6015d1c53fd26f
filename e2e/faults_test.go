package e2e

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// startBridge runs `fpmbus bridge` against an external server.
func startBridge(t *testing.T, name, url string, basePort, dpSize int, extra ...string) *proc {
	t.Helper()
	args := []string{"bridge", "--server", url, "--fpm-port", strconv.Itoa(basePort), "--dp-size", strconv.Itoa(dpSize)}
	p := fpmbus(t, name, append(args, extra...)...)
	p.waitOutput("bridge ready", 30*time.Second)
	return p
}

// A publisher restarted inside the duplicate window starts its sequence at 0 again; the bridge's
// epoch keeps the ids distinct, so nothing of the second run is lost to deduplication.
func TestPublisherRestartNothingLostToDedup(t *testing.T) {
	t.Parallel()
	const perRun = 1000
	up := startUp(t, 1)
	for run := 0; run < 2; run++ {
		p := publish(t, 1, up.basePort, 1, perRun, "restarting", "--rate", "2000", "--seed", strconv.Itoa(run))
		if err := p.wait(30 * time.Second); err != nil {
			t.Fatalf("publisher run %d: %v", run, err)
		}
	}
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, 2*perRun, 30*time.Second)
	runs := map[string]map[uint64]bool{}
	for _, m := range storedFPMs(t, js, ">") {
		if runs[m.epoch] == nil {
			runs[m.epoch] = map[uint64]bool{}
		}
		if runs[m.epoch][m.seq] {
			t.Fatalf("epoch %s seq %d stored twice", m.epoch, m.seq)
		}
		runs[m.epoch][m.seq] = true
	}
	if len(runs) != 2 {
		t.Fatalf("got %d publisher epochs, want 2", len(runs))
	}
	for epoch, seqs := range runs {
		for s := uint64(0); s < perRun; s++ {
			if !seqs[s] {
				t.Fatalf("epoch %s: seq %d missing", epoch, s)
			}
		}
	}
}

// A bridge killed with SIGKILL and restarted never stores a message twice: whatever it had stored
// stays once, and the new bridge only publishes what it receives after it connects.
func TestBridgeKill9RestartNoDuplicates(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	base := producertest.FreeBasePort(t, "", 2)
	b1 := startBridge(t, "bridge 1", url, base, 2)
	pub := publish(t, 1, base, 2, 6000, "k9", "--rate", "1500")
	time.Sleep(2 * time.Second)
	_ = b1.signal(syscall.SIGKILL, 10*time.Second)
	b2 := startBridge(t, "bridge 2", url, base, 2)
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	if err := b2.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge 2 exit: %v", err)
	}
	stored := storedFPMs(t, env.JS, ">")
	seen := map[string]bool{}
	bridges := map[string]bool{}
	for _, m := range stored {
		k := fmt.Sprintf("%d/%d", m.key.DPRank, m.seq) // the publisher never restarted: seq is unique per rank
		if seen[k] {
			t.Fatalf("rank %d seq %d stored twice", m.key.DPRank, m.seq)
		}
		seen[k] = true
		bridges[fmt.Sprintf("%d/%s", m.key.DPRank, m.header.Get(streams.HeaderBridge))] = true
	}
	if len(stored) < 2*6000/3 {
		t.Fatalf("only %d of %d messages stored: both bridges should have stored most", len(stored), 2*6000)
	}
	// (Whether the restarted bridge takes the run under the killed one's epoch, its numbers going on
	// from where that one stopped, or begins an epoch of its own changes how the gap detector reads the
	// run, not what is stored.)
	if len(bridges) != 2*2 {
		t.Fatalf("want each bridge's copies of each rank stored, got %d (rank, bridge) pairs: %v", len(bridges), bridges)
	}
}

// dropMarker is the bridge's JSON drop marker (FPM_EVENTS, fpmevents.drop.>).
type dropMarker struct {
	Type     string `json:"type"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Count    uint64 `json:"count"`
	Reason   string `json:"reason"`
	Key      struct {
		DPRank int `json:"dp_rank"`
	} `json:"key"`
}

// The broker goes away for several seconds: the bridge keeps reading ZMQ, buffers up to --max-buffer,
// then drops with exact accounting; once the broker is back every message is either stored once or
// covered by exactly one drop marker.
func TestBrokerOutageDropsAreCountedAndMarkedExactly(t *testing.T) {
	t.Parallel()
	const perRank, maxBuffer = 6000, 300
	env := natsservertest.Start(t)
	listen := env.Server.NATS().Addr().String()
	url := env.Server.ClientURL()
	store := env.StoreDir
	base := producertest.FreeBasePort(t, "", 1)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := startBridge(t, "bridge", url, base, 1, "--max-buffer", strconv.Itoa(maxBuffer), "--metrics-addr", metricsAddr)
	pub := publish(t, 1, base, 1, perRank, "outage", "--rate", "1000")
	time.Sleep(1500 * time.Millisecond)
	env.Stop()
	time.Sleep(4 * time.Second)
	env = natsservertest.StartAt(t, listen, store)
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	// Bounded memory: the bridge's own high-water mark, read from its /metrics endpoint.
	high := scrapeMetric(t, metricsAddr, "fpmbus_bridge_buffered_messages_high")
	if high < 1 || high > maxBuffer {
		t.Fatalf("buffer high-water mark %v, want 1..%d", high, maxBuffer)
	}
	if err := b.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge exit: %v", err)
	}

	stored := map[uint64]bool{}
	for _, m := range storedFPMs(t, env.JS, ">") {
		if stored[m.seq] {
			t.Fatalf("seq %d stored twice", m.seq)
		}
		stored[m.seq] = true
	}
	dropped := map[uint64]bool{}
	var markers []dropMarker
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.DropMarkerWildcard) {
		var dm dropMarker
		if err := json.Unmarshal(m.Data(), &dm); err != nil {
			t.Fatalf("drop marker %s: %v", m.Data(), err)
		}
		if dm.Type != "drop_marker" || dm.Reason != "buffer_full" || dm.LastSeq-dm.FirstSeq+1 != dm.Count {
			t.Fatalf("drop marker %+v", dm)
		}
		markers = append(markers, dm)
		for s := dm.FirstSeq; s <= dm.LastSeq; s++ {
			if dropped[s] || stored[s] {
				t.Fatalf("seq %d covered twice (marker %+v)", s, dm)
			}
			dropped[s] = true
		}
	}
	if len(dropped) == 0 {
		t.Fatal("a 4 s outage at 1000 msg/s with a 300-message buffer must drop")
	}
	for s := uint64(0); s < perRank; s++ {
		if !stored[s] && !dropped[s] {
			t.Fatalf("seq %d neither stored nor marked dropped", s)
		}
	}
	if len(stored)+len(dropped) != perRank {
		t.Fatalf("stored %d + dropped %d != sent %d", len(stored), len(dropped), perRank)
	}
	sort.Slice(markers, func(i, j int) bool { return markers[i].FirstSeq < markers[j].FirstSeq })
	t.Logf("stored %d, dropped %d in %d marker(s), first %+v", len(stored), len(dropped), len(markers), markers[0])
}

// scrapeMetric reads one sample from a Prometheus text endpoint (summed over its label sets).
func scrapeMetric(t *testing.T, addr, name string) float64 {
	t.Helper()
	m, err := scrapeSamples(addr)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	if len(m[name]) == 0 {
		t.Fatalf("metric %s not served by %s", name, addr)
	}
	return sumSamples(m, name)
}
