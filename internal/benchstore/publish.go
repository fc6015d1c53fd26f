package benchstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// benchObjectName is the content-addressed object of a body, <kind>/<run>/<rank or ->/<sha256>: a
// conflicting re-publication never overwrites the object the first publication's message names.
func benchObjectName(kind, runID string, rank int, digest string) string {
	r := "-"
	if rank >= 0 {
		r = strconv.Itoa(rank)
	}
	return kind + "/" + streams.EncodeToken(runID) + "/" + r + "/" + digest
}

// PublishProfile checks run runID's collection profile (schemas.DecodeProfile) and publishes it on
// BenchProfileSubject with header Fpm-Bench-Run and Nats-Msg-Id BenchProfileMsgID.
func PublishProfile(ctx context.Context, js jetstream.JetStream, runID string, body []byte) (*jetstream.PubAck, error) {
	if _, err := schemas.DecodeProfile(bytes.NewReader(body)); err != nil {
		return nil, err
	}
	msg := nats.NewMsg(streams.BenchProfileSubject(runID))
	msg.Data = body
	msg.Header.Set(streams.HeaderBenchRun, runID)
	msg.Header.Set(streams.HeaderMsgID, streams.BenchProfileMsgID(runID, schemas.SHA256Hex(body)))
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
		report(BenchPublished{Subject: streams.BenchProfileSubject(run), RunID: run, Profile: true, Probe: -1, Rank: -1,
			Size: len(p.Profile), Ack: ack})
	}
	limit := p.MaxSize
	if limit <= 0 {
		limit = streams.DefaultBenchMaxArtefact
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
		report(BenchPublished{Subject: streams.BenchProbeSubject(run), RunID: run, Probe: i, Rank: -1, Size: len(data),
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
		report(BenchPublished{Subject: streams.BenchRankSubject(r.RunID, r.Rank), RunID: r.RunID, Probe: -1, Rank: i, Size: int(b.size),
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
	if err := streams.CheckArtefactSize(path, st.Size(), limit); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if err := streams.CheckArtefactSize(path, int64(len(data)), limit); err != nil {
		return nil, err
	}
	return data, nil
}

// Describe is the line `fpmbus bench publish` prints for what was published (p): profile is the
// collection profile's file, points each rank's point count.
func (pub *BenchPublication) Describe(p BenchPublished, profile string, points []int) string {
	switch {
	case p.Profile:
		return fmt.Sprintf("published collection profile %s for run %s: %s", profile, p.RunID, p.Subject)
	case p.Probe >= 0:
		return fmt.Sprintf("published probe replies %s for run %s: %s seq %d%s", pub.Probes[p.Probe].Path, p.RunID, p.Subject, p.Ack.Sequence, dupNote(p.Ack))
	}
	r := pub.Ranks[p.Rank]
	where := "inline"
	if p.Object {
		where = "object store " + streams.BenchObjectBucket
	}
	return fmt.Sprintf("published rank %d of %d of run %s (%d points, %d bytes, %s): %s seq %d%s",
		r.Rank, r.DPSize, r.RunID, points[p.Rank], p.Size, where, p.Subject, p.Ack.Sequence, dupNote(p.Ack))
}

func dupNote(ack *jetstream.PubAck) string {
	if ack.Duplicate {
		return " (duplicate: already published)"
	}
	return ""
}
