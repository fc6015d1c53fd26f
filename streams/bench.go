package streams

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
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
	BenchRankRoot    = BenchRoot + "." + BenchKindRank
	BenchProbeRoot   = BenchRoot + "." + BenchKindProbe
	BenchProfileRoot = BenchRoot + ".profile"
	BenchMergedRoot  = BenchRoot + "." + BenchKindMerged
	BenchSidecarRoot = BenchRoot + "." + BenchKindSidecar
	BenchEventsRoot  = EventsRoot + ".bench"

	// BenchRankWildcard and BenchProbeWildcard are the merger's filters, BenchMergedWildcard the
	// sealer's.
	BenchRankWildcard   = BenchRankRoot + ".>"
	BenchProbeWildcard  = BenchProbeRoot + ".>"
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
func BenchProfileSubject(runID string) string { return BenchProfileRoot + "." + EncodeToken(runID) }

// BenchMergedSubject carries run runID's merged artefact.
func BenchMergedSubject(runID string) string { return BenchMergedRoot + "." + EncodeToken(runID) }

// BenchSidecarSubject carries run runID's worker-probe sidecar.
func BenchSidecarSubject(runID string) string { return BenchSidecarRoot + "." + EncodeToken(runID) }

// BenchOutcomeSubject carries the one outcome event of run runID.
func BenchOutcomeSubject(runID string) string {
	return BenchEventsRoot + "." + EncodeToken(runID) + ".outcome"
}

// BenchConflictSubject carries conflict events of run runID.
func BenchConflictSubject(runID string) string {
	return BenchEventsRoot + "." + EncodeToken(runID) + ".conflict"
}

// ParseBenchSubject returns the kind (a BenchKind* constant), run_id and rank (-1 but for rank
// artefacts) of an artefact subject.
func ParseBenchSubject(subject string) (kind, runID string, rank int, err error) {
	toks := strings.Split(subject, ".")
	bad := func(why string) (string, string, int, error) {
		return "", "", 0, fmt.Errorf("%w: %q: %s", ErrBadSubject, subject, why)
	}
	if len(toks) < 3 || toks[0] != BenchRoot {
		return bad("not under " + BenchRoot)
	}
	runID, err = DecodeToken(toks[2])
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

// benchObjectName is the content-addressed object of a body, <kind>/<run>/<rank or ->/<sha256>: a
// conflicting re-publication never overwrites the object the first publication's message names.
func benchObjectName(kind, runID string, rank int, digest string) string {
	r := "-"
	if rank >= 0 {
		r = strconv.Itoa(rank)
	}
	return kind + "/" + EncodeToken(runID) + "/" + r + "/" + digest
}

// PublishProfile checks run runID's collection profile (schemas.DecodeProfile) and publishes it on
// BenchProfileSubject with header Fpm-Bench-Run and Nats-Msg-Id BenchProfileMsgID.
func PublishProfile(ctx context.Context, js jetstream.JetStream, runID string, body []byte) (*jetstream.PubAck, error) {
	if _, err := schemas.DecodeProfile(bytes.NewReader(body)); err != nil {
		return nil, err
	}
	msg := nats.NewMsg(BenchProfileSubject(runID))
	msg.Data = body
	msg.Header.Set(HeaderBenchRun, runID)
	msg.Header.Set(HeaderMsgID, BenchProfileMsgID(runID, schemas.SHA256Hex(body)))
	return js.PublishMsg(ctx, msg)
}

// BenchRank is a rank artefact for PublishBench, validated by the caller from the bytes whose sha256
// is Digest.
type BenchRank struct {
	BenchRankArtefact
	Path   string // read again to publish: it must still have Digest
	Digest string
}

// BenchProbe is a worker-probe replies file for PublishBench.
type BenchProbe struct {
	Path string // where to read it
	File string // the path recorded in Fpm-Bench-File (absolute)
}

// BenchPublication is what one `fpmbus bench publish` sends.
type BenchPublication struct {
	// Profile is the run's collection profile (JSON), or nil. Its run is the ranks' (Ranks[0].RunID),
	// so a profile needs Ranks.
	Profile []byte
	// Probes are worker-probe reply files; ProbeRun names the run of one (file, data) and checks it
	// (the merger's rules), before it is published.
	Probes   []BenchProbe
	ProbeRun func(file string, data []byte) (string, error)
	// Ranks are rank artefacts.
	Ranks []BenchRank
	// MaxSize bounds every file read (DefaultBenchMaxArtefact when 0): a probe replies file larger
	// than it is refused (ErrArtefactTooLarge) before it is read.
	MaxSize int64
}

// BenchPublished reports one message PublishBench stored (or found stored: Ack.Duplicate).
type BenchPublished struct {
	Subject string
	RunID   string
	// Profile is set for the profile; otherwise Probe or Rank is the index of the file in Probes or
	// Ranks (-1 for the other kind).
	Profile     bool
	Probe, Rank int
	Size        int
	Object      bool // the body is in BenchObjectBucket
	Ack         *jetstream.PubAck
}

// PublishBench publishes p in the order the consumers rely on: the collection profile first, so the
// sealer finds it when the run's merged artefact appears; then the worker-probe replies, so the merger
// has them when the run's last rank arrives; then the rank artefacts, each read again from disk (one in
// memory at a time) and refused if it no longer has the digest it was validated with. published, when
// not nil, is told of each message stored. It stops at the first error (returned as it is: the step
// that failed is the one after the last reported); what was published before it stays published.
func (s *BenchStore) PublishBench(ctx context.Context, p BenchPublication, published func(BenchPublished)) error {
	report := func(r BenchPublished) {
		if published != nil {
			published(r)
		}
	}
	if p.Profile != nil {
		if len(p.Ranks) == 0 {
			return fmt.Errorf("streams: a collection profile needs the run's rank artefacts (their run_id names the run)")
		}
		run := p.Ranks[0].RunID
		ack, err := PublishProfile(ctx, s.js, run, p.Profile)
		if err != nil {
			return err
		}
		report(BenchPublished{Subject: BenchProfileSubject(run), RunID: run, Profile: true, Probe: -1, Rank: -1,
			Size: len(p.Profile), Ack: ack})
	}
	limit := p.MaxSize
	if limit <= 0 {
		limit = DefaultBenchMaxArtefact
	}
	for i, pr := range p.Probes {
		data, err := readLimited(pr.Path, limit)
		if err != nil {
			return err
		}
		run, err := p.ProbeRun(pr.File, data)
		if err != nil {
			return err
		}
		ack, err := s.PublishProbe(ctx, run, pr.File, data)
		if err != nil {
			return err
		}
		report(BenchPublished{Subject: BenchProbeSubject(run), RunID: run, Probe: i, Rank: -1, Size: len(data),
			Object: len(data) > s.inlineMax, Ack: ack})
	}
	for i, r := range p.Ranks {
		// Streamed from the file (a body for the object store is never held whole), and refused if
		// it no longer has the digest it was validated with.
		b := benchBody{path: r.Path, digest: r.Digest}
		ack, err := s.publishRank(ctx, r.BenchRankArtefact, &b)
		if errors.Is(err, ErrDigestMismatch) {
			return fmt.Errorf("%s changed while it was being published; nothing more was published: %w", r.Path, err)
		}
		if err != nil {
			return err
		}
		report(BenchPublished{Subject: BenchRankSubject(r.RunID, r.Rank), RunID: r.RunID, Probe: -1, Rank: i, Size: int(b.size),
			Object: b.size > int64(s.inlineMax), Ack: ack})
	}
	return nil
}

// readLimited reads file path, refusing it unread (ErrArtefactTooLarge) when it is larger than limit
// bytes, and never reading more than that.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := CheckArtefactSize(path, st.Size(), limit); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if err := CheckArtefactSize(path, int64(len(data)), limit); err != nil {
		return nil, err
	}
	return data, nil
}
