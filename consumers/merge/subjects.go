package merge

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/streams"
)

// Subjects, headers and the object bucket of the benchmark merger. They live here rather than in
// streams/ (owned elsewhere); every subject is under the roots streams declares, so FPM_BENCH
// (fpmbench.>) and FPM_EVENTS (fpmevents.>) store them without any stream change.
//
//	fpmbench.rank.<run>.<rank>     a rank artefact (bench publish)         Nats-Msg-Id fpmbench:rank:<run>:<rank>:<sha256>
//	fpmbench.probe.<run>           worker-probe replies (bench publish --probe)  fpmbench:probe:<run>:<sha256>
//	fpmbench.merged.<run>          the merged artefact (merge)             fpmbench:merged:<run>
//	fpmbench.sidecar.<run>         the worker-probe sidecar (merge)        fpmbench:sidecar:<run>:<sha256>
//	fpmevents.bench.<run>.outcome  merged | rejected | incomplete (one per run)  fpmevents:bench:<run>:outcome
//	fpmevents.bench.<run>.conflict a conflicting re-publication of a rank
//
// <run> is the run_id encoded with streams.EncodeToken, so any run_id is one subject token.
const (
	SubjectRankRoot    = streams.BenchRoot + ".rank"
	SubjectProbeRoot   = streams.BenchRoot + ".probe"
	SubjectMergedRoot  = streams.BenchRoot + ".merged"
	SubjectSidecarRoot = streams.BenchRoot + ".sidecar"
	SubjectEventsRoot  = streams.EventsRoot + ".bench"

	// RankWildcard and ProbeWildcard are the merger consumer's filters.
	RankWildcard  = SubjectRankRoot + ".>"
	ProbeWildcard = SubjectProbeRoot + ".>"

	// ObjectBucket is the JetStream object store holding artefact bodies too large to inline.
	ObjectBucket = "FPM_BENCH_OBJECTS"
)

// Header names on FPM_BENCH messages. Every artefact message carries Kind, Run, SHA256 and Size; a body
// kept in the object store is named by Object and the message body is empty.
const (
	HeaderKind   = "Fpm-Bench-Kind"    // rank | probe | merged | sidecar
	HeaderRun    = "Fpm-Bench-Run"     // the run_id, unencoded
	HeaderRank   = "Fpm-Bench-Rank"    // rank messages: the DP rank
	HeaderDPSize = "Fpm-Bench-Dp-Size" // rank messages: the artefact's dp.size
	HeaderFile   = "Fpm-Bench-File"    // the producer's path of the artefact (recorded in rank_files)
	HeaderSHA256 = "Fpm-Bench-Sha256"  // hex sha256 of the body
	HeaderSize   = "Fpm-Bench-Size"    // body size in bytes
	HeaderObject = "Fpm-Bench-Object"  // object name in ObjectBucket when the body is not inline
	// HeaderRankDigests (merged messages) lists the merged ranks' digests: "0=<sha256>,1=<sha256>,...".
	HeaderRankDigests = "Fpm-Bench-Rank-Digests"
	// HeaderProbeContext (merged messages) is the ProbeContext as compact JSON; absent without an engine
	// block (then there is no sidecar).
	HeaderProbeContext = "Fpm-Bench-Probe-Context"
)

// Message kinds (HeaderKind).
const (
	KindRank    = "rank"
	KindProbe   = "probe"
	KindMerged  = "merged"
	KindSidecar = "sidecar"
)

// Event types (streams.HeaderEventType) on fpmevents.bench.<run>.*.
const (
	EventMerged     = "bench_merged"
	EventRejected   = "bench_rejected"
	EventIncomplete = "bench_incomplete"
	EventConflict   = "bench_conflict"
)

// RankSubject is the subject of run runID's rank artefact.
func RankSubject(runID string, rank int) string {
	return SubjectRankRoot + "." + streams.EncodeToken(runID) + "." + strconv.Itoa(rank)
}

// ProbeSubject carries run runID's worker-probe replies.
func ProbeSubject(runID string) string { return SubjectProbeRoot + "." + streams.EncodeToken(runID) }

// MergedSubject carries run runID's merged artefact.
func MergedSubject(runID string) string { return SubjectMergedRoot + "." + streams.EncodeToken(runID) }

// SidecarSubject carries run runID's worker-probe sidecar.
func SidecarSubject(runID string) string {
	return SubjectSidecarRoot + "." + streams.EncodeToken(runID)
}

// OutcomeSubject carries the one outcome event of run runID.
func OutcomeSubject(runID string) string {
	return SubjectEventsRoot + "." + streams.EncodeToken(runID) + ".outcome"
}

// ConflictSubject carries conflict events of run runID.
func ConflictSubject(runID string) string {
	return SubjectEventsRoot + "." + streams.EncodeToken(runID) + ".conflict"
}

// ParseBenchSubject returns the kind (rank or probe), run_id and rank (-1 for probe) of a subject.
func ParseBenchSubject(subject string) (kind, runID string, rank int, err error) {
	toks := strings.Split(subject, ".")
	bad := func(why string) (string, string, int, error) {
		return "", "", 0, fmt.Errorf("%w: %q: %s", streams.ErrBadSubject, subject, why)
	}
	if len(toks) < 3 || toks[0] != streams.BenchRoot {
		return bad("not under " + streams.BenchRoot)
	}
	runID, err = streams.DecodeToken(toks[2])
	if err != nil {
		return "", "", 0, err
	}
	switch toks[1] {
	case KindRank:
		if len(toks) != 4 {
			return bad("want fpmbench.rank.<run>.<rank>")
		}
		r, err := strconv.Atoi(toks[3])
		if err != nil || r < 0 {
			return bad("rank is not a non-negative integer")
		}
		return KindRank, runID, r, nil
	case KindProbe, KindMerged, KindSidecar:
		if len(toks) != 3 {
			return bad("want fpmbench." + toks[1] + ".<run>")
		}
		return toks[1], runID, -1, nil
	}
	return bad("unknown kind " + strconv.Quote(toks[1]))
}

// Partition returns the partition (0..n-1) that owns run runID: fnv-1a(run_id) mod n.
func Partition(runID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(runID))
	return int(h.Sum32() % uint32(n))
}

func rankMsgID(runID string, rank int, digest string) string {
	return "fpmbench:rank:" + streams.EncodeToken(runID) + ":" + strconv.Itoa(rank) + ":" + digest
}

func probeMsgID(runID, digest string) string {
	return "fpmbench:probe:" + streams.EncodeToken(runID) + ":" + digest
}

func mergedMsgID(runID string) string { return "fpmbench:merged:" + streams.EncodeToken(runID) }

func sidecarMsgID(runID, digest string) string {
	return "fpmbench:sidecar:" + streams.EncodeToken(runID) + ":" + digest
}

func outcomeMsgID(runID string) string {
	return "fpmevents:bench:" + streams.EncodeToken(runID) + ":outcome"
}

// objectName is the content-addressed object of a body: a conflicting re-publication never overwrites
// the object the first publication's message names.
func objectName(kind, runID string, rank int, digest string) string {
	r := "-"
	if rank >= 0 {
		r = strconv.Itoa(rank)
	}
	return kind + "/" + streams.EncodeToken(runID) + "/" + r + "/" + digest
}
