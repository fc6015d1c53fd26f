package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// shardWorker is a worker id whose ranks 0..ranks-1 cover every one of n shards.
func shardWorker(n, ranks int) string {
	for i := 0; ; i++ {
		w := "shard-w" + strconv.Itoa(i)
		seen := map[int]bool{}
		for r := range ranks {
			seen[streams.ShardOf(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: w, DPRank: r}, n)] = true
		}
		if len(seen) == n {
			return w
		}
	}
}

// `fpmbus up --fpm-shards 3` through the real binary: the server gets FPM_0..FPM_2 and no FPM, every
// FPM of four ranks is stored once in its key's shard, the README's recipes work (`nats sub
// 'fpm.*.*.*.0'` sees rank 0's, `nats stream subjects FPM_<i>` lists the keys of shard i), the trace
// writer's lines are the stored FPMs once each, the gap detector (reading each shard as its
// partition) has every publisher at its last number with no gap, and `trace backfill` of the time
// range writes the same lines from the three shards (a sequence range is refused).
func TestUpWithThreeShards(t *testing.T) {
	const shards, ranks, perRank = 3, 4, 300
	up := startUp(t, ranks, "--fpm-shards", strconv.Itoa(shards))
	since := time.Now().Add(-time.Second)
	worker := shardWorker(shards, ranks)
	var sub *proc
	if natsBin != "" {
		sub = start(t, "nats sub", natsBin, "--server", up.url, "sub", "fpm.*.*.*.0", "--count", strconv.Itoa(perRank))
		sub.waitOutput("Subscribing on", 15*time.Second)
	}
	if err := publish(t, 1, up.basePort, ranks, perRank, worker, "--rate", "1000", "--seed", "3").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	js := jsClient(t, up.url)
	if _, err := js.Stream(t.Context(), streams.StreamFPM); err == nil {
		t.Fatalf("stream %s exists next to the shards", streams.StreamFPM)
	}
	stored := map[string]bool{} // bodies: each carries its dp_rank and counter_id
	perKey := map[streams.Key]int{}
	for i := range shards {
		name := streams.ShardStreamName(i)
		eventually(t, 30*time.Second, func() error {
			var want uint64
			for r := range ranks {
				if streams.ShardOf(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: r}, shards) == i {
					want += perRank
				}
			}
			if n, err := streamCount(t, js, name); err != nil || n != want {
				return fmt.Errorf("%s holds %d FPMs (%v), want %d", name, n, err, want)
			}
			return nil
		})
		for _, m := range streamstest.Messages(t, js, name, ">") {
			k, err := streams.ParseFPMSubject(m.Subject())
			if err != nil || streams.ShardOf(k, shards) != i {
				t.Fatalf("%s holds %s (%v)", name, m.Subject(), err)
			}
			if stored[string(m.Data())] {
				t.Fatalf("%s: FPM stored twice: %s", name, m.Data())
			}
			stored[string(m.Data())] = true
			perKey[k]++
		}
	}
	if len(perKey) != ranks || len(stored) != ranks*perRank {
		t.Fatalf("stored %d FPMs of %d keys, want %d of %d", len(stored), len(perKey), ranks*perRank, ranks)
	}
	if sub != nil {
		if err := sub.wait(30 * time.Second); err != nil {
			t.Fatalf("nats sub: %v\n%s", err, sub.Output())
		}
		got := receivedOn.FindAllStringSubmatch(sub.Output(), -1)
		if len(got) != perRank {
			t.Fatalf("nats sub 'fpm.*.*.*.0' printed %d messages, want %d", len(got), perRank)
		}
		for _, m := range got {
			if want := "fpm.dynamo.backend." + worker + ".0"; m[1] != want {
				t.Fatalf("nats sub received on %q, want %q", m[1], want)
			}
		}
	}

	if natsBin != "" { // the README's recipes: which keys a shard holds
		for i := range shards {
			out, err := run(t, 15*time.Second, natsBin, "--server", up.url, "stream", "subjects", streams.ShardStreamName(i))
			if err != nil {
				t.Fatalf("nats stream subjects %s: %v\n%s", streams.ShardStreamName(i), err, out)
			}
			for k := range perKey {
				if held := strings.Contains(out, streams.FPMSubject(k)); held != (streams.ShardOf(k, shards) == i) {
					t.Fatalf("nats stream subjects %s lists %s: %v, want %v:\n%s", streams.ShardStreamName(i), streams.FPMSubject(k), held, !held, out)
				}
			}
		}
	}

	// The gap detector reads shard p as partition p: everything acknowledged, each publisher at its
	// last number, no gap.
	for i := range shards {
		eventually(t, 30*time.Second, func() error {
			return consumerAcked(js, streams.ShardStreamName(i), "fpm-gaps-"+strconv.Itoa(i))
		})
	}
	// The trace writer's files are per worker, whose ranks span shards: its group reads a partition
	// stream sourcing every shard.
	eventually(t, 30*time.Second, func() error { return consumerAcked(js, "FPM_PART_fpm-trace", "fpm-trace") })
	out, err := run(t, 30*time.Second, fpmbusBin, "gaps", "report", "--server", up.url, "--since", "1h", "--json")
	if err != nil {
		t.Fatalf("gaps report: %v\n%s", err, out)
	}
	var rep gaps.Report
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
		t.Fatalf("gaps report: %v\n%s", err, out)
	}
	if len(rep.Publishers) != ranks {
		t.Fatalf("gaps report has %d publishers, want %d:\n%s", len(rep.Publishers), ranks, out)
	}
	for _, p := range rep.Publishers {
		if p.Messages != perRank || p.LastSeq != perRank-1 || p.GapsTotal != 0 || p.MissingTotal != 0 || p.PendingGaps != 0 {
			t.Fatalf("gaps report for %s: %d messages, last %d, %d gaps, %d missing, %d pending; want %d, %d, none",
				p.Key, p.Messages, p.LastSeq, p.GapsTotal, p.MissingTotal, p.PendingGaps, perRank, perRank-1)
		}
	}

	// trace backfill across the shards, by time; by sequence it is refused.
	backOut := filepath.Join(t.TempDir(), "back", "fpm")
	if out, err := run(t, 60*time.Second, fpmbusBin, "trace", "backfill", "--server", up.url, "--trace-mode", "full",
		"--trace-output", backOut, "--since", since.UTC().Format(time.RFC3339Nano)); err != nil {
		t.Fatalf("trace backfill: %v\n%s", err, out)
	}
	if out, err := run(t, 30*time.Second, fpmbusBin, "trace", "backfill", "--server", up.url, "--trace-mode", "full",
		"--trace-output", filepath.Join(t.TempDir(), "seq", "fpm"), "--start-seq", "1"); err == nil || !strings.Contains(out, "select the range by time") {
		t.Fatalf("trace backfill --start-seq with shards: %v\n%s", err, out)
	}

	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	for name, pattern := range map[string]string{"trace writer": up.traceOut, "backfill": backOut} {
		lines := traceLines(t, pattern+"."+worker+".*.jsonl.gz")
		checkLinesAreStored(t, name, lines, stored)
	}
}

// checkLinesAreStored asserts that lines hold every stored FPM body exactly once, and, per key, in
// counter order (a key's order is its shard's).
func checkLinesAreStored(t *testing.T, who string, lines []*schemas.TraceLine, stored map[string]bool) {
	t.Helper()
	if len(lines) != len(stored) {
		t.Fatalf("%s wrote %d lines, want %d", who, len(lines), len(stored))
	}
	seen := map[string]bool{}
	last := map[int64]int64{}
	for _, l := range lines {
		body := string(l.Event.FPM)
		if !stored[body] || seen[body] {
			t.Fatalf("%s: line not stored, or twice: %s", who, body)
		}
		seen[body] = true
		var f struct {
			DPRank    int64 `json:"dp_rank"`
			CounterID int64 `json:"counter_id"`
		}
		if err := json.Unmarshal(l.Event.FPM, &f); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[f.DPRank]; ok && f.CounterID <= prev {
			t.Fatalf("%s: rank %d counter %d after %d", who, f.DPRank, f.CounterID, prev)
		}
		last[f.DPRank] = f.CounterID
		if !bytes.Equal(l.Event.FPM, []byte(body)) {
			t.Fatal("line body changed")
		}
	}
}
