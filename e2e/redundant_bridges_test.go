package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
)

// sentRe matches a rank's line of `fpmbus publish`'s final report.
var sentRe = regexp.MustCompile(`rank (\d+) \S+: sent (\d+) \(heartbeats (\d+)\).*last seq (\d+)`)

// redundantBridge is one of the two `fpmbus bridge` processes subscribed to the same publishers.
type redundantBridge struct {
	id, metrics string
	p           *proc
}

// start runs the bridge and waits until it is ready.
func (b *redundantBridge) start(t *testing.T, url string, base, ranks, incarnation int) {
	t.Helper()
	b.p = startBridge(t, fmt.Sprintf("bridge %s #%d", b.id, incarnation), url, base, ranks,
		"--bridge-id", b.id, "--metrics-addr", b.metrics)
}

// waitReceiving waits until the bridge receives on every rank: only then is it subscribed (ZMQ
// connects in the background after "bridge ready"), so only then may the other bridge go down.
func (b *redundantBridge) waitReceiving(t *testing.T, ranks int) {
	t.Helper()
	eventually(t, 20*time.Second, func() error {
		m, err := scrapeSamples(b.metrics)
		if err != nil {
			return err
		}
		for r := range ranks {
			if sumSamples(m, "fpmbus_bridge_received_total", "rank", strconv.Itoa(r)) == 0 {
				return fmt.Errorf("bridge %s: nothing received on rank %d yet", b.id, r)
			}
		}
		return nil
	})
}

// Two bridges on the same four ranks, each SIGKILLed and restarted at random moments ten times, never
// both down at once, while the publisher sends busy FPMs and then idle heartbeats: the stream holds
// every FPM sent exactly once (per rank, every counter_id from 0 to the last, none twice), and the real
// gap detector reports nothing: no publisher_restart (the bridges agree on the run's epoch, whichever
// restarted), and no gap (what one bridge missed while down, the other stored).
func TestRedundantBridgesKilledInTurnStoreEveryFPMOnce(t *testing.T) {
	t.Parallel()
	const ranks, busy, kills = 4, 3000, 10
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	base := producertest.FreeBasePort(t, "", ranks)
	gapsMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startGaps(t, "fpmbus gaps", gapsArgs(url, gapsMetrics, "2s"))

	bridges := []*redundantBridge{
		{id: "bridge-a", metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))},
		{id: "bridge-b", metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))},
	}
	// Busy FPMs for about 8 s at 400 per second per rank, then heartbeats every 20 ms (same idle
	// payload at the same counter_id in every run of a publisher) until the test stops it, after the
	// kills (about 12 s).
	pub := publish(t, 2, base, ranks, busy, "redundant", "--rate", "400", "--seed", "11",
		"--idle-after-count", "--heartbeat", "20ms")
	for _, b := range bridges {
		b.start(t, url, base, ranks, 0)
	}
	for _, b := range bridges {
		b.waitReceiving(t, ranks)
	}

	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	began := time.Now()
	for i := range 2 * kills {
		b := bridges[i%2]
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
		_ = b.p.signal(syscall.SIGKILL, 10*time.Second)
		b.start(t, url, base, ranks, i/2+1)
		b.waitReceiving(t, ranks)
	}
	t.Logf("%d kills and restarts in %v", 2*kills, time.Since(began).Round(time.Millisecond))
	if err := pub.signal(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	// What the publisher sent, per rank, from its final report.
	sent := map[int][3]uint64{} // rank -> messages, heartbeats, last seq
	for _, m := range sentRe.FindAllStringSubmatch(pub.Output(), -1) {
		var v [4]uint64
		for i := range v {
			v[i], _ = strconv.ParseUint(m[i+1], 10, 64)
		}
		sent[int(v[0])] = [3]uint64{v[1], v[2], v[3]}
	}
	if len(sent) != ranks {
		t.Fatalf("publisher report for %d ranks, want %d:\n%s", len(sent), ranks, pub.Output())
	}
	for _, b := range bridges {
		if err := b.p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s exit: %v", b.p.name, err)
		}
	}

	stored := storedFPMs(t, env.JS, ">")
	seqs := make([]map[uint64]bool, ranks)
	last := make([]uint64, ranks)
	busySeen, heartbeats := make([]int, ranks), 0
	for r := range seqs {
		seqs[r] = map[uint64]bool{}
	}
	for _, m := range stored {
		var body struct {
			CounterID uint64  `json:"counter_id"`
			WallTime  float64 `json:"wall_time"`
		}
		if err := json.Unmarshal(m.body, &body); err != nil {
			t.Fatalf("body %s: %v", m.body, err)
		}
		r := m.key.DPRank
		if body.CounterID != m.seq {
			t.Fatalf("rank %d: counter_id %d under seq %d", r, body.CounterID, m.seq)
		}
		if seqs[r][m.seq] {
			t.Fatalf("rank %d counter_id %d stored twice", r, m.seq)
		}
		seqs[r][m.seq] = true
		last[r] = max(last[r], m.seq)
		if body.WallTime != 0 {
			busySeen[r]++
		} else {
			heartbeats++
		}
	}
	for r := range ranks {
		n, hb, lastSent := sent[r][0], sent[r][1], sent[r][2]
		for s := uint64(0); s <= lastSent; s++ {
			if !seqs[r][s] {
				t.Fatalf("rank %d counter_id %d missing (sent 0..%d)", r, s, lastSent)
			}
		}
		if last[r] != lastSent || uint64(len(seqs[r])) != n || uint64(busySeen[r]) != n-hb || busySeen[r] != busy {
			t.Fatalf("rank %d: stored %d FPMs (%d busy) up to counter_id %d; sent %d (%d heartbeats) up to %d, %d busy",
				r, len(seqs[r]), busySeen[r], last[r], n, hb, lastSent, busy)
		}
	}
	if heartbeats == 0 {
		t.Fatal("no heartbeat stored: the idle phase was not exercised")
	}
	t.Logf("stored %d FPMs (%d heartbeats) on %d ranks", len(stored), heartbeats, ranks)

	// The detector has read everything, and its marker grace has passed: no event at all.
	eventually(t, 30*time.Second, func() error {
		m, err := scrapeSamples(gapsMetrics)
		if err != nil {
			return err
		}
		if got := sumSamples(m, "fpmbus_gaps_messages_total"); got != float64(len(stored)) {
			return fmt.Errorf("detector read %v of %d FPMs", got, len(stored))
		}
		if p := sumSamples(m, "fpmbus_gaps_pending_gaps"); p != 0 {
			return fmt.Errorf("%v gaps pending", p)
		}
		return nil
	})
	time.Sleep(2500 * time.Millisecond) // a gap revealed last would be classified after the 2 s grace
	if evs := gapEvents(t, env.JS); len(evs) != 0 {
		for _, e := range evs {
			if e.Cause == gaps.CausePublisherRestart {
				t.Errorf("publisher_restart invented: %s", e.Evidence.Summary)
			}
		}
		t.Fatalf("gap events with every FPM stored: %s", describeEvents(evs))
	}
}
