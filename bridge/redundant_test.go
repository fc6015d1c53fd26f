package bridge

import (
	"strconv"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Two bridges on one publisher store every FPM once, busy ones and heartbeats, under one epoch per
// publisher run: the run they agreed on in streams.BucketBridgeRuns. A publisher restart both see is
// one new run, with one new epoch.
func TestRedundantBridgesStoreEveryFPMOnce(t *testing.T) {
	t.Parallel()
	const n = 400
	env := natsservertest.Start(t)
	pub := newTestPub(t, "tcp://127.0.0.1:*")
	var hs []*harness
	for _, id := range []string{"bridge-a", "bridge-b"} {
		hs = append(hs, startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = id }))
	}
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	// Even numbers are busy FPMs, odd ones idle heartbeats; the second run's busy ones measure other
	// passes, its heartbeats are byte for byte the first run's.
	fpm := func(run int, seq uint64) []byte {
		if seq%2 == 1 {
			return schemas.EncodeMsgpack(&schemas.FPM{Version: 1, WorkerID: "w", CounterID: int64(seq)})
		}
		f := testFPM("w", 0, seq)
		f.WallTime += float64(run) * 0.001
		return schemas.EncodeMsgpack(f)
	}
	sendRun := func(run int) {
		for seq := uint64(0); seq < n; seq++ {
			pub.send(seq, fpm(run, seq))
		}
		for _, h := range hs {
			h.waitStats(15*time.Second, "run published", func(s stats) bool { return s.Ranks[0].Published == uint64(run+1)*n })
		}
	}
	sendRun(0)
	url := pub.URL
	pub.Close()
	pub = newTestPub(t, url)
	if err := pub.s.WaitSubscribers(2, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	sendRun(1)

	msgs := messages(t, env.JS, streams.StreamFPM, ">")
	if len(msgs) != 2*n {
		t.Fatalf("stored %d, want %d: each FPM of the two runs once", len(msgs), 2*n)
	}
	perRun := map[string]map[uint64]int{} // epoch -> seq -> copies
	var epochs []string
	bridges := map[string]int{}
	for _, m := range msgs {
		e := m.Headers().Get(streams.HeaderEpoch)
		if perRun[e] == nil {
			perRun[e] = map[uint64]int{}
			epochs = append(epochs, e)
		}
		perRun[e][hdrUint(t, m, streams.HeaderSeq)]++
		bridges[m.Headers().Get(streams.HeaderBridge)]++
	}
	if len(epochs) != 2 {
		t.Fatalf("epochs %v: want one per publisher run", epochs)
	}
	e0, _ := strconv.ParseInt(epochs[0], 10, 64)
	e1, _ := strconv.ParseInt(epochs[1], 10, 64)
	if e0 <= 0 || e1 <= e0 {
		t.Fatalf("epochs %v: want positive and increasing", epochs)
	}
	for _, e := range epochs {
		for seq := uint64(0); seq < n; seq++ {
			if perRun[e][seq] != 1 {
				t.Fatalf("epoch %s seq %d stored %d times", e, seq, perRun[e][seq])
			}
		}
	}
	t.Logf("stored per bridge: %v", bridges)
}

// Two publisher runs whose bytes agree (a recording replayed twice, a deterministic publisher restarted
// within the duplicate window) are two runs: each is stored whole, under its own epoch, by one bridge
// as by two redundant bridges, which still store each FPM of a run once.
func TestTwoRunsOfIdenticalBytesAreBothStored(t *testing.T) {
	t.Parallel()
	const n = 200
	for name, bridges := range map[string][]string{
		"one bridge":  {"bridge-a"},
		"two bridges": {"bridge-a", "bridge-b"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := natsservertest.Start(t)
			pub := newTestPub(t, "tcp://127.0.0.1:*")
			var hs []*harness
			for _, id := range bridges {
				hs = append(hs, startBridge(t, env, []Endpoint{{URL: pub.URL, DPRank: 0}}, func(c *Config) { c.BridgeID = id }))
			}
			// Every third FPM an idle heartbeat; the second run sends the first run's bytes exactly.
			body := func(seq uint64) []byte {
				if seq%3 == 2 {
					return schemas.EncodeMsgpack(&schemas.FPM{Version: 1, WorkerID: "w", CounterID: int64(seq)})
				}
				return payload("w", 0, seq)
			}
			sendRun := func(run int) {
				if err := pub.s.WaitSubscribers(len(hs), 15*time.Second); err != nil {
					t.Fatal(err)
				}
				for seq := uint64(0); seq < n; seq++ {
					pub.send(seq, body(seq))
				}
				for _, h := range hs {
					h.waitStats(15*time.Second, "run received", func(s stats) bool { return s.Ranks[0].Received == uint64(run+1)*n })
					h.waitStats(15*time.Second, "run acknowledged", func(s stats) bool { return s.Ranks[0].Published == uint64(run+1)*n })
				}
			}
			sendRun(0)
			url := pub.URL
			pub.Close()
			pub = newTestPub(t, url)
			sendRun(1)

			msgs := messages(t, env.JS, streams.StreamFPM, ">")
			perRun := map[string]map[uint64]int{} // epoch -> seq -> copies
			var epochs []string
			for _, m := range msgs {
				e := m.Headers().Get(streams.HeaderEpoch)
				if perRun[e] == nil {
					perRun[e] = map[uint64]int{}
					epochs = append(epochs, e)
				}
				seq := hdrUint(t, m, streams.HeaderSeq)
				perRun[e][seq]++
				if want, err := schemas.DecodeFPM(body(seq)); err != nil || string(m.Data()) != string(want.JSON) {
					t.Fatalf("epoch %s seq %d: body %s (%v)", e, seq, m.Data(), err)
				}
			}
			if len(msgs) != 2*n || len(epochs) != 2 {
				t.Fatalf("stored %d FPMs under epochs %v, want %d: each FPM of the two runs once, one epoch per run", len(msgs), epochs, 2*n)
			}
			for _, e := range epochs {
				for seq := uint64(0); seq < n; seq++ {
					if perRun[e][seq] != 1 {
						t.Fatalf("epoch %s seq %d stored %d times", e, seq, perRun[e][seq])
					}
				}
			}
		})
	}
}
