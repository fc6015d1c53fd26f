package streams

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Benchmark subjects. Every one is under the roots FPM_BENCH (fpmbench.>) and FPM_EVENTS (fpmevents.>)
// store, so no stream change is needed for them:
//
//	fpmbench.rank.<run>.<rank>     a rank artefact (bench publish)               Nats-Msg-Id fpmbench:rank:<run>:<rank>:<sha256>
//	fpmbench.probe.<run>           worker-probe replies (bench publish --probe)  fpmbench:probe:<run>:<sha256>
//	fpmbench.profile.<run>         the collection profile (bench publish --profile)  fpmbench:profile:<run>:<sha256>
//	fpmbench.merged.<run>          the merged artefact (merge)                   fpmbench:merged:<run>
//	fpmbench.sidecar.<run>         the worker-probe sidecar (merge)              fpmbench:sidecar:<run>:<sha256>
//	fpmevents.bench.<run>.outcome  merged | rejected | incomplete (one per run)  fpmevents:bench:<run>:outcome
//	fpmevents.bench.<run>.conflict a conflicting re-publication of a rank        fpmevents:bench:<run>:conflict:<rank>:<sha256>
//
// <run> is the run_id encoded with EncodeToken, so any run_id is one subject token.
const (
	BenchRankRoot    = benchRoot + "." + BenchKindRank
	BenchProbeRoot   = benchRoot + "." + BenchKindProbe
	benchProfileRoot = benchRoot + ".profile"
	BenchMergedRoot  = benchRoot + "." + BenchKindMerged
	benchSidecarRoot = benchRoot + "." + BenchKindSidecar
	benchEventsRoot  = eventsRoot + ".bench"

	// benchRankWildcard and benchProbeWildcard are the merger's filters, BenchMergedWildcard the
	// sealer's.
	benchRankWildcard   = BenchRankRoot + ".>"
	benchProbeWildcard  = BenchProbeRoot + ".>"
	BenchMergedWildcard = BenchMergedRoot + ".>"

	// BenchObjectBucket is the JetStream object store holding artefact bodies too large to inline.
	BenchObjectBucket = "FPM_BENCH_OBJECTS"
)

// Artefact kinds (header Fpm-Bench-Kind, and the second token of their subjects).
const (
	BenchKindRank    = "rank"
	BenchKindProbe   = "probe"
	BenchKindMerged  = "merged"
	BenchKindSidecar = "sidecar"
)

// BenchRankSubject is the subject of run runID's rank artefact.
func BenchRankSubject(runID string, rank int) string {
	return BenchRankRoot + "." + EncodeToken(runID) + "." + strconv.Itoa(rank)
}

// BenchProbeSubject carries run runID's worker-probe replies.
func BenchProbeSubject(runID string) string { return BenchProbeRoot + "." + EncodeToken(runID) }

// BenchProfileSubject carries run runID's collection profile: body the profile JSON
// (schemas.CollectionProfile), header Fpm-Bench-Run. The last message on the subject is the run's
// profile.
func BenchProfileSubject(runID string) string { return benchProfileRoot + "." + EncodeToken(runID) }

// BenchMergedSubject carries run runID's merged artefact.
func BenchMergedSubject(runID string) string { return BenchMergedRoot + "." + EncodeToken(runID) }

// BenchSidecarSubject carries run runID's worker-probe sidecar.
func BenchSidecarSubject(runID string) string { return benchSidecarRoot + "." + EncodeToken(runID) }

// BenchOutcomeSubject carries the one outcome event of run runID.
func BenchOutcomeSubject(runID string) string {
	return benchEventsRoot + "." + EncodeToken(runID) + ".outcome"
}

// BenchConflictSubject carries conflict events of run runID.
func BenchConflictSubject(runID string) string {
	return benchEventsRoot + "." + EncodeToken(runID) + ".conflict"
}

// ParseBenchSubject returns the kind (a BenchKind* constant), run_id and rank (-1 but for rank
// artefacts) of an artefact subject.
func ParseBenchSubject(subject string) (kind, runID string, rank int, err error) {
	toks := strings.Split(subject, ".")
	bad := func(why string) (string, string, int, error) {
		return "", "", 0, fmt.Errorf("%w: %q: %s", ErrBadSubject, subject, why)
	}
	if len(toks) < 3 || toks[0] != benchRoot {
		return bad("not under " + benchRoot)
	}
	runID, err = decodeToken(toks[2])
	if err != nil {
		return "", "", 0, err
	}
	switch toks[1] {
	case BenchKindRank:
		if len(toks) != 4 {
			return bad("want fpmbench.rank.<run>.<rank>")
		}
		r, err := strconv.Atoi(toks[3])
		if err != nil || r < 0 {
			return bad("rank is not a non-negative integer")
		}
		return BenchKindRank, runID, r, nil
	case BenchKindProbe, BenchKindMerged, BenchKindSidecar:
		if len(toks) != 3 {
			return bad("want fpmbench." + toks[1] + ".<run>")
		}
		return toks[1], runID, -1, nil
	}
	return bad("unknown kind " + strconv.Quote(toks[1]))
}

// FormatBenchRankDigests is the Fpm-Bench-Rank-Digests value of digests (rank -> sha256):
// "0=<sha256>,1=<sha256>,..." in rank order.
func FormatBenchRankDigests(digests map[int]string) string {
	ranks := make([]int, 0, len(digests))
	for r := range digests {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = strconv.Itoa(r) + "=" + digests[r]
	}
	return strings.Join(parts, ",")
}

// ParseBenchRankDigests reads an Fpm-Bench-Rank-Digests value; entries that are not <rank>=<sha256>
// are skipped.
func ParseBenchRankDigests(v string) map[int]string {
	out := map[int]string{}
	for _, kv := range strings.Split(v, ",") {
		r, dg, ok := strings.Cut(kv, "=")
		if n, err := strconv.Atoi(r); ok && err == nil {
			out[n] = dg
		}
	}
	return out
}
