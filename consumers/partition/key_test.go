package partition

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// The key -> partition map is part of the contract (documented in the package comment): FNV-1a 32 of
// the concatenated key-token values, modulo P. These values must never change for a given config.
func TestPartitionOfGolden(t *testing.T) {
	t.Parallel()
	fpm := FPMConfig("g") // tokens 1-4, P=16
	byWorker := FPMConfig("g")
	byWorker.Filters = []Filter{{Subject: "fpm.*.*.*.*", KeyTokens: []int{3}}}
	bench := Config{Stream: streams.StreamBench, Group: "merge", Partitions: 16, Filters: []Filter{
		{Subject: "fpmbench.rank.*.*", KeyTokens: []int{1}},
		{Subject: "fpmbench.probe.*", KeyTokens: []int{1}},
	}}
	single := FPMConfig("g")
	single.Partitions = 1
	tests := []struct {
		cfg     Config
		subject string
		want    int
	}{
		{fpm, "fpm.dynamo.backend.w0.0", 14},
		{fpm, "fpm.dynamo.backend.w1.0", 7},
		{fpm, "fpm.dynamo.backend.w1.1", 4},
		{fpm, "fpm.dynamo.backend.%.0", 8},
		{fpm, "fpm.dyn%2Eamo.prefill.worker-7.3", 14},
		{byWorker, "fpm.dynamo.backend.w1.0", 5}, // every rank of worker w1, in any namespace: one partition
		{byWorker, "fpm.dynamo.backend.w1.1", 5},
		{byWorker, "fpm.other.x.w1.5", 5},
		{bench, "fpmbench.rank.run-42.0", 3}, // a run's rank artefacts and its probe replies: one partition
		{bench, "fpmbench.rank.run-42.3", 3},
		{bench, "fpmbench.probe.run-42", 3},
		{bench, "fpmbench.rank.run-43.0", 0},
		{single, "fpm.dynamo.backend.w1.0", 0},
	}
	for _, tc := range tests {
		got, err := tc.cfg.PartitionOf(tc.subject)
		if err != nil || got != tc.want {
			t.Errorf("%v PartitionOf(%q) = %d, %v; want %d", tc.cfg.Filters, tc.subject, got, err, tc.want)
		}
	}
	for _, s := range []string{"fpm.dynamo.backend.w1", "fpmevents.gap.a.b.c.0", "fpm.a.b.c.0.extra"} {
		if _, err := fpm.PartitionOf(s); err == nil {
			t.Errorf("PartitionOf(%q): want ErrNoPartition", s)
		}
	}
}

// The server's partition transform and Config.PartitionOf agree on every message, for token keys, a
// whole-subject key (filter ending in '>') and two filters sharing one key (bench runs).
func TestPartitionOfMatchesServerTransform(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	whole := FPMConfig("whole")
	whole.Partitions = 8
	whole.Filters = []Filter{{Subject: "fpm.>"}}
	bench := Config{Stream: streams.StreamBench, Group: "merge", Partitions: 16, Filters: []Filter{
		{Subject: "fpmbench.rank.*.*", KeyTokens: []int{1}},
		{Subject: "fpmbench.probe.*", KeyTokens: []int{1}},
	}}
	cfgs := []Config{FPMConfig("tokens"), whole, bench}
	for _, c := range cfgs {
		if _, err := Join(ctx, env.JS, c, WithLogger(testLogger())); err != nil {
			t.Fatalf("join %s: %v", c.Group, err)
		}
	}
	var fpmSubjects, benchSubjects []string
	for i := range 300 {
		k := streams.Key{Namespace: "ns" + strconv.Itoa(i%3), Component: "c.omp", WorkerID: fmt.Sprintf("w %d", i), DPRank: i % 8}
		fpmSubjects = append(fpmSubjects, streams.FPMSubject(k))
	}
	for r := range 40 {
		run := streams.EncodeToken(fmt.Sprintf("run/%d", r))
		benchSubjects = append(benchSubjects, "fpmbench.rank."+run+".0", "fpmbench.rank."+run+".1", "fpmbench.probe."+run)
	}
	for _, s := range append(fpmSubjects, benchSubjects...) {
		if _, err := env.JS.Publish(ctx, s, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cfgs {
		want := len(fpmSubjects)
		if c.Stream == streams.StreamBench {
			want = len(benchSubjects)
		}
		ps, err := env.JS.Stream(ctx, c.PartitionStream())
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, c.PartitionStream()+" to source every message", func() bool {
			i, err := ps.Info(ctx)
			return err == nil && i.State.Msgs == uint64(want)
		})
		srcSeq := map[string]uint64{}
		src, _ := env.JS.Stream(ctx, c.Stream)
		for seq := uint64(1); ; seq++ {
			m, err := src.GetMsg(ctx, seq)
			if err != nil {
				break
			}
			srcSeq[m.Subject] = seq
		}
		for seq := uint64(1); seq <= uint64(want); seq++ {
			m, err := ps.GetMsg(ctx, seq)
			if err != nil {
				t.Fatalf("%s seq %d: %v", c.PartitionStream(), seq, err)
			}
			pStr, orig, _ := strings.Cut(m.Subject, ".")
			got, _ := strconv.Atoi(pStr)
			if p, err := c.PartitionOf(orig); err != nil || p != got {
				t.Errorf("%s: server put %q in partition %d, PartitionOf says %d (%v)", c.Group, orig, got, p, err)
			}
			// The source header carries the original sequence StreamSequence reports.
			f := strings.Fields(m.Header.Get(headerStreamSource))
			if len(f) < 2 || f[1] != strconv.FormatUint(srcSeq[orig], 10) {
				t.Errorf("%s: %s header %q, want source sequence %d", c.Group, headerStreamSource, m.Header.Get(headerStreamSource), srcSeq[orig])
			}
		}
	}
}
