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
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// shardWorkers are n worker ids, worker i in shard i of n: two ranks each, the test's publishers then
// cover every shard.
func shardWorkers(n int) []string {
	out := make([]string, n)
	for i := range n {
		for j := 0; ; j++ {
			w := "shard-w" + strconv.Itoa(j)
			if streams.ShardOf(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: w}, n) == i {
				out[i] = w
				break
			}
		}
	}
	return out
}

// `fpmbus up --fpm-shards 3` through the real binary, three workers of two ranks each (one worker per
// shard): the server gets FPM_0..FPM_2 and no FPM, every FPM is stored once in its worker's shard, the
// README's recipes work (`nats sub 'fpm.*.*.*.0'` sees every worker's rank 0, `nats stream subjects
// FPM_<i>` lists the keys of shard i), the trace writer (reading shard p as its partition p, no copy)
// writes the stored FPMs once each, the gap detector (likewise) has every publisher at its last number
// with no gap, `trace backfill` of the time range writes the same lines from the three shards (a
// sequence range is refused), `trace replay --to stream` of those files stores each key in its shard
// (and the live writer writes them once), and `trace verify --stream` is refused with what to do
// instead.
func TestUpWithThreeShards(t *testing.T) {
	t.Parallel()
	const shards, ranksPerWorker, perRank = 3, 2, 300
	workers := shardWorkers(shards)
	ranks := len(workers) * ranksPerWorker
	up := startUp(t, ranks, "--fpm-shards", strconv.Itoa(shards))
	since := time.Now().Add(-time.Second)
	var sub *proc
	if natsBin != "" {
		sub = start(t, "nats sub", natsBin, "--server", up.url, "sub", "fpm.*.*.*.0", "--count", strconv.Itoa(len(workers)*perRank))
		sub.waitOutput("Subscribing on", 15*time.Second)
	}
	pubs := make([]*proc, len(workers))
	for i, w := range workers { // worker i on the bridge's ports 2i, 2i+1 (its ranks 0 and 1)
		pubs[i] = publish(t, 1, up.basePort+i*ranksPerWorker, ranksPerWorker, perRank, w, "--rate", "1000", "--seed", strconv.Itoa(3+i))
	}
	for i, p := range pubs {
		if err := p.wait(30 * time.Second); err != nil {
			t.Fatalf("publisher of %s: %v", workers[i], err)
		}
	}
	js := jsClient(t, up.url)
	if _, err := js.Stream(t.Context(), streams.StreamFPM); err == nil {
		t.Fatalf("stream %s exists next to the shards", streams.StreamFPM)
	}
	stored := map[string]map[string]bool{} // worker -> bodies: each carries its dp_rank and counter_id
	perKey := map[streams.Key]int{}
	for i := range shards {
		name := streams.ShardStreamName(i)
		eventually(t, 30*time.Second, func() error {
			want := uint64(ranksPerWorker * perRank) // worker i's
			if n, err := streamCount(t, js, name); err != nil || n != want {
				return fmt.Errorf("%s holds %d FPMs (%v), want %d", name, n, err, want)
			}
			return nil
		})
		for _, m := range natsservertest.Messages(t, js, name, ">") {
			k, err := streams.ParseFPMSubject(m.Subject())
			if err != nil || streams.ShardOf(k, shards) != i {
				t.Fatalf("%s holds %s (%v)", name, m.Subject(), err)
			}
			if k.WorkerID != workers[i] {
				t.Fatalf("%s holds %s, want only worker %s", name, m.Subject(), workers[i])
			}
			if stored[k.WorkerID] == nil {
				stored[k.WorkerID] = map[string]bool{}
			}
			if stored[k.WorkerID][string(m.Data())] {
				t.Fatalf("%s: FPM stored twice: %s", name, m.Data())
			}
			stored[k.WorkerID][string(m.Data())] = true
			perKey[k]++
		}
	}
	for _, w := range workers {
		if len(stored[w]) != ranksPerWorker*perRank {
			t.Fatalf("stored %d FPMs of worker %s, want %d", len(stored[w]), w, ranksPerWorker*perRank)
		}
	}
	if len(perKey) != ranks {
		t.Fatalf("stored FPMs of %d keys, want %d", len(perKey), ranks)
	}
	if sub != nil {
		if err := sub.wait(30 * time.Second); err != nil {
			t.Fatalf("nats sub: %v\n%s", err, sub.Output())
		}
		got := receivedOn.FindAllStringSubmatch(sub.Output(), -1)
		if len(got) != len(workers)*perRank {
			t.Fatalf("nats sub 'fpm.*.*.*.0' printed %d messages, want %d", len(got), len(workers)*perRank)
		}
		perSubject := map[string]int{}
		for _, m := range got {
			perSubject[m[1]]++
		}
		for _, w := range workers {
			if subj := "fpm.dynamo.backend." + w + ".0"; perSubject[subj] != perRank {
				t.Fatalf("nats sub received %d on %s, want %d (all: %v)", perSubject[subj], subj, perRank, perSubject)
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

	// The gap detector and the trace writer read shard p as partition p (both keyed by worker_id, as
	// the shards): everything acknowledged, and no copy of the shards.
	for i := range shards {
		eventually(t, 30*time.Second, func() error {
			return consumerAcked(js, streams.ShardStreamName(i), "fpm-gaps-"+strconv.Itoa(i))
		})
		eventually(t, 30*time.Second, func() error {
			return consumerAcked(js, streams.ShardStreamName(i), "fpm-trace-"+strconv.Itoa(i))
		})
	}
	names := js.StreamNames(t.Context())
	for name := range names.Name() {
		if strings.HasPrefix(name, streams.StreamFPM+"_PART_") {
			t.Fatalf("partition stream %s exists: a group copies the shards", name)
		}
	}
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

	// trace verify against the stream is refused over shards, naming what to do instead.
	if out, err := run(t, 30*time.Second, fpmbusBin, "trace", "verify", "--server", up.url, "--stream", up.traceOut); err == nil ||
		!strings.Contains(out, "without --stream and --repair") {
		t.Fatalf("trace verify --stream with shards: %v\n%s", err, out)
	}
	// trace replay --to stream of the backfilled files publishes each key to its shard (namespace
	// replay), the same bodies again.
	if out, err := run(t, 60*time.Second, fpmbusBin, "trace", "replay", "--server", up.url, "--to", "stream", "--speed", "20",
		backOut); err != nil {
		t.Fatalf("trace replay --to stream: %v\n%s", err, out)
	}
	for i := range shards {
		replayed := map[string]bool{}
		for _, m := range natsservertest.Messages(t, js, streams.ShardStreamName(i), "fpm.replay.>") {
			k, err := streams.ParseFPMSubject(m.Subject())
			if err != nil || k.WorkerID != workers[i] {
				t.Fatalf("%s holds replayed %s (%v), want only worker %s", streams.ShardStreamName(i), m.Subject(), err, workers[i])
			}
			replayed[string(m.Data())] = true
		}
		if len(replayed) != len(stored[workers[i]]) {
			t.Fatalf("%s holds %d replayed FPMs, want %d", streams.ShardStreamName(i), len(replayed), len(stored[workers[i]]))
		}
		for body := range stored[workers[i]] {
			if !replayed[body] {
				t.Fatalf("%s: FPM not replayed: %s", streams.ShardStreamName(i), body)
			}
		}
	}
	for i := range shards { // the live writer has the replayed FPMs too
		eventually(t, 30*time.Second, func() error {
			return consumerAcked(js, streams.ShardStreamName(i), "fpm-trace-"+strconv.Itoa(i))
		})
	}

	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	// The live writer's files hold each worker's FPMs once, and (namespace replay) the replayed ones
	// once again; the backfill's only the former.
	for _, w := range workers {
		for name, pattern := range map[string]string{"trace writer": up.traceOut, "backfill": backOut} {
			byNamespace := map[string][]*schemas.TraceLine{}
			for _, l := range traceLines(t, pattern+"."+w+".*.jsonl.gz") {
				byNamespace[l.Event.Source.Namespace] = append(byNamespace[l.Event.Source.Namespace], l)
			}
			checkLinesAreStored(t, name+" ("+w+")", byNamespace["dynamo"], stored[w])
			if name == "trace writer" {
				checkLinesAreStored(t, name+" ("+w+", replayed)", byNamespace["replay"], stored[w])
			} else if len(byNamespace) != 1 {
				t.Fatalf("%s (%s): lines of namespaces %v", name, w, byNamespace)
			}
		}
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
