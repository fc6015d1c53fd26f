package streams_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/streams"
)

func TestBenchSubjects(t *testing.T) {
	run := "run.with*odd>chars"
	for _, c := range []struct {
		subject, kind string
		rank          int
	}{{streams.BenchRankSubject(run, 7), streams.BenchKindRank, 7}, {streams.BenchProbeSubject(run), streams.BenchKindProbe, -1}, {streams.BenchMergedSubject(run), streams.BenchKindMerged, -1}} {
		kind, id, rank, err := streams.ParseBenchSubject(c.subject)
		if err != nil || kind != c.kind || id != run || rank != c.rank {
			t.Errorf("%s: %s %q %d %v", c.subject, kind, id, rank, err)
		}
		if strings.Count(c.subject, ".") != map[bool]int{true: 3, false: 2}[c.kind == streams.BenchKindRank] {
			t.Errorf("%s: the run id is not one token", c.subject)
		}
	}
	for _, bad := range []string{"fpmbench.rank.r", "fpmbench.rank.r.-1", "fpmbench.other.r", "fpm.rank.r.0"} {
		if _, _, _, err := streams.ParseBenchSubject(bad); !errors.Is(err, streams.ErrBadSubject) {
			t.Errorf("%s accepted: %v", bad, err)
		}
	}
	for got, want := range map[string]string{
		streams.BenchProfileSubject(run):  "fpmbench.profile.run%2Ewith%2Aodd%3Echars",
		streams.BenchSidecarSubject(run):  "fpmbench.sidecar.run%2Ewith%2Aodd%3Echars",
		streams.BenchOutcomeSubject(run):  "fpmevents.bench.run%2Ewith%2Aodd%3Echars.outcome",
		streams.BenchConflictSubject(run): "fpmevents.bench.run%2Ewith%2Aodd%3Echars.conflict",
	} {
		if got != want {
			t.Errorf("subject %s, want %s", got, want)
		}
	}
}

func TestBenchRankDigestsRoundTrip(t *testing.T) {
	d := map[int]string{10: "c", 0: "a", 2: "b"}
	v := streams.FormatBenchRankDigests(d)
	if v != "0=a,2=b,10=c" {
		t.Fatalf("Fpm-Bench-Rank-Digests %q", v)
	}
	if back := streams.ParseBenchRankDigests(v + ",junk,x=y"); !reflect.DeepEqual(back, d) {
		t.Fatalf("parsed %v, want %v", back, d)
	}
}
