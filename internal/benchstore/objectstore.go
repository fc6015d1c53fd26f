package benchstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Large artefacts. A rank artefact of an 8-rank run with raw samples is tens of megabytes and a merged
// one twice that, beyond any sensible NATS max_payload (the embedded server allows 8 MiB; NATS
// recommends staying at or below that). Raising limits would push 60 MB messages through every
// consumer of fpmbench.> and the server's memory. Instead a body larger than the inline limit (default
// 1 MiB) goes to the JetStream object store bucket FPM_BENCH_OBJECTS (created idempotently, chunked in
// 128 KiB messages, replicas/storage/max-age taken from the stream settings), under a content-addressed
// name <kind>/<run>/<rank>/<sha256>. The FPM_BENCH message is then a small manifest: an empty body and
// headers naming the object, its sha256 and size. A smaller body is the message body itself, so
// `nats stream view FPM_BENCH` shows it. Either way the reader verifies the sha256 before use, and a
// conflicting re-publication can never overwrite the object the first publication names.

// DefaultBenchInlineMax is the largest body published inline on FPM_BENCH.
const DefaultBenchInlineMax = 1 << 20

// ErrDigestMismatch: a body read back from FPM_BENCH or the object store does not match its sha256.
var ErrDigestMismatch = errors.New("streams: artefact body does not match its sha256")

// BenchStore publishes benchmark artefact bodies to FPM_BENCH (inline or through BenchObjectBucket) and
// reads them back. It is safe for concurrent use.
type BenchStore struct {
	js        jetstream.JetStream
	inlineMax int
	cfg       jetstream.ObjectStoreConfig

	mu  sync.Mutex
	obs jetstream.ObjectStore
}

// NewBenchStore returns a BenchStore. inlineMax <= 0 means DefaultBenchInlineMax; sc gives the object
// bucket's replicas, storage and max age (FPM_BENCH's).
func NewBenchStore(js jetstream.JetStream, inlineMax int, sc streams.Config) *BenchStore {
	if inlineMax <= 0 {
		inlineMax = DefaultBenchInlineMax
	}
	return &BenchStore{js: js, inlineMax: inlineMax, cfg: jetstream.ObjectStoreConfig{
		Bucket:      streams.BenchObjectBucket,
		Description: "fpmbus benchmark artefact bodies larger than the inline limit of FPM_BENCH messages",
		TTL:         sc.BenchMaxAge,
		Storage:     sc.Storage,
		Replicas:    sc.Replicas,
	}}
}

// InlineMax is the largest body the store publishes inline.
func (s *BenchStore) InlineMax() int { return s.inlineMax }

// Object Put and overload. nats.go's Put publishes an object's chunks (128 KiB) asynchronously with up
// to 4,000 in flight and no flow control against the server: on a busy host the server can answer 429
// (its per-stream ingest queue of 128 MiB is full) or the client can give up waiting for acks ("stalled
// with too many outstanding async published messages"). Both mean "slow down", so putObject retries the
// whole Put with growing pauses; Put under the same name replaces the earlier partial object.

// Objects returns the object bucket, creating it (idempotently) on first use.
func (s *BenchStore) Objects(ctx context.Context) (jetstream.ObjectStore, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs != nil {
		return s.obs, nil
	}
	obs, err := streams.EnsureObjectStore(ctx, s.js, s.cfg)
	if err != nil {
		return nil, fmt.Errorf("streams: object store %s: %w", streams.BenchObjectBucket, err)
	}
	s.obs = obs
	return obs, nil
}

// benchBody is what publish sends: bytes in memory, or a file streamed into the object store.
type benchBody struct {
	data   []byte
	path   string
	digest string // hex sha256; computed when empty
	size   int64
}

func (b *benchBody) prepare() error {
	if b.path == "" {
		b.size = int64(len(b.data))
		if b.digest == "" {
			b.digest = schemas.SHA256Hex(b.data)
		}
		return nil
	}
	f, err := os.Open(b.path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	b.size = st.Size()
	if b.digest == "" {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		b.digest = hex.EncodeToString(h.Sum(nil))
	}
	return nil
}

// BenchRankArtefact says which rank artefact a body is: it names the subject, the id and the headers.
type BenchRankArtefact struct {
	RunID  string
	Rank   int
	DPSize int
	File   string // the producer's path, recorded in the merged artefact's rank_files
}

// PublishRank publishes a rank artefact (already validated by the caller) on BenchRankSubject with
// Nats-Msg-Id BenchRankMsgID: a re-publication of identical bytes is deduplicated by JetStream
// (PubAck.Duplicate) within the duplicate window, and recognised by the merger after it.
func (s *BenchStore) PublishRank(ctx context.Context, r BenchRankArtefact, data []byte) (*jetstream.PubAck, error) {
	return s.publishRank(ctx, r, &benchBody{data: data, digest: schemas.SHA256Hex(data)})
}

// publishRank publishes body b (bytes, or a file whose digest the caller knows) as rank artefact r; b's
// size is set once it is sent.
func (s *BenchStore) publishRank(ctx context.Context, r BenchRankArtefact, b *benchBody) (*jetstream.PubAck, error) {
	hdr := artefactHeader(streams.BenchKindRank, r.RunID, r.File)
	hdr.Set(streams.HeaderBenchRank, strconv.Itoa(r.Rank))
	hdr.Set(streams.HeaderBenchDPSize, strconv.Itoa(r.DPSize))
	return s.publish(ctx, streams.BenchRankSubject(r.RunID, r.Rank), streams.BenchRankMsgID(r.RunID, r.Rank, b.digest),
		benchObjectName(streams.BenchKindRank, r.RunID, r.Rank, b.digest), hdr, b)
}

// PublishProbe publishes worker-probe replies (already checked by the caller) for run runID, read from
// file, on BenchProbeSubject.
func (s *BenchStore) PublishProbe(ctx context.Context, runID, file string, data []byte) (*jetstream.PubAck, error) {
	digest := schemas.SHA256Hex(data)
	return s.publish(ctx, streams.BenchProbeSubject(runID), streams.BenchProbeMsgID(runID, digest),
		benchObjectName(streams.BenchKindProbe, runID, -1, digest), artefactHeader(streams.BenchKindProbe, runID, file), &benchBody{data: data, digest: digest})
}

// BenchMerged is a merged artefact written by the merger, to publish with PublishMerged.
type BenchMerged struct {
	RunID  string
	Path   string // the file, streamed from disk (Fpm-Bench-File)
	Digest string // its hex sha256 as written
	// RankDigests are the merged ranks' sha256 by rank (Fpm-Bench-Rank-Digests).
	RankDigests map[int]string
	// ProbeContext is the merger's probe context as compact JSON (Fpm-Bench-Probe-Context); nil when
	// the artefact has no engine block (and so no sidecar).
	ProbeContext []byte
}

// PublishMerged publishes a run's merged artefact on BenchMergedSubject with Nats-Msg-Id
// BenchMergedMsgID: one per run.
func (s *BenchStore) PublishMerged(ctx context.Context, m BenchMerged) (*jetstream.PubAck, error) {
	hdr := artefactHeader(streams.BenchKindMerged, m.RunID, m.Path)
	hdr.Set(streams.HeaderBenchRankDigests, streams.FormatBenchRankDigests(m.RankDigests))
	if m.ProbeContext != nil {
		hdr.Set(streams.HeaderBenchProbeContext, string(m.ProbeContext))
	}
	return s.publish(ctx, streams.BenchMergedSubject(m.RunID), streams.BenchMergedMsgID(m.RunID),
		benchObjectName(streams.BenchKindMerged, m.RunID, -1, m.Digest), hdr, &benchBody{path: m.Path, digest: m.Digest})
}

// PublishSidecar publishes run runID's worker-probe sidecar, written at path, on BenchSidecarSubject.
func (s *BenchStore) PublishSidecar(ctx context.Context, runID, path string, data []byte) (*jetstream.PubAck, error) {
	digest := schemas.SHA256Hex(data)
	return s.publish(ctx, streams.BenchSidecarSubject(runID), streams.BenchSidecarMsgID(runID, digest),
		benchObjectName(streams.BenchKindSidecar, runID, -1, digest), artefactHeader(streams.BenchKindSidecar, runID, path), &benchBody{data: data, digest: digest})
}

// artefactHeader starts the headers of an artefact message: its kind, run and producer's file. publish
// adds the digest, size, id and, for a body in the object store, the object.
func artefactHeader(kind, runID, file string) nats.Header {
	hdr := nats.Header{}
	hdr.Set(streams.HeaderBenchKind, kind)
	hdr.Set(streams.HeaderBenchRun, runID)
	hdr.Set(streams.HeaderBenchFile, file)
	return hdr
}

// publish sends b on subject with headers hdr (artefactHeader and the kind's own) and message id msgID.
func (s *BenchStore) publish(ctx context.Context, subject, msgID, object string, hdr nats.Header, b *benchBody) (*jetstream.PubAck, error) {
	if err := b.prepare(); err != nil {
		return nil, fmt.Errorf("streams: read %s: %w", b.path, err)
	}
	hdr.Set(streams.HeaderBenchSHA256, b.digest)
	hdr.Set(streams.HeaderBenchSize, strconv.FormatInt(b.size, 10))
	hdr.Set(streams.HeaderMsgID, msgID)
	msg := &nats.Msg{Subject: subject, Header: hdr}
	if b.size <= int64(s.inlineMax) {
		if b.path != "" {
			data, err := os.ReadFile(b.path)
			if err != nil {
				return nil, err
			}
			if schemas.SHA256Hex(data) != b.digest {
				return nil, fmt.Errorf("%w: %s changed while publishing", ErrDigestMismatch, b.path)
			}
			b.data = data
		}
		msg.Data = b.data
	} else {
		if err := s.putObject(ctx, object, b); err != nil {
			return nil, err
		}
		hdr.Set(streams.HeaderBenchObject, object)
	}
	ack, err := s.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("streams: publish %s: %w", subject, err)
	}
	return ack, nil
}

// transferTimeout is the deadline given to one object transfer: nats.go bounds a whole Get (and each
// chunk of a Put) by the 5 s default JetStream timeout when the context has none, which a 170 MB rank
// artefact on a busy host does not meet. 30 s plus 1 s per 4 MB.
func transferTimeout(size int64) time.Duration {
	return 30*time.Second + time.Duration(size/(4<<20))*time.Second
}

// putObject stores b under name unless an object of that name with the same digest exists.
func (s *BenchStore) putObject(ctx context.Context, name string, b *benchBody) error {
	obs, err := s.Objects(ctx)
	if err != nil {
		return err
	}
	want := objectDigest(b.digest)
	if info, err := obs.GetInfo(ctx, name); err == nil && info.Digest == want && info.Size == uint64(b.size) {
		return nil
	}
	put := func() (*jetstream.ObjectInfo, error) {
		var r io.Reader = bytes.NewReader(b.data)
		if b.path != "" {
			f, err := os.Open(b.path)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			r = f
		}
		pctx, cancel := context.WithTimeout(ctx, transferTimeout(b.size))
		defer cancel()
		return obs.Put(pctx, jetstream.ObjectMeta{Name: name}, r)
	}
	info, err := put()
	for attempt := 1; err != nil && attempt < 6 && isOverloaded(err); attempt++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt*attempt) * time.Second):
		}
		info, err = put()
	}
	if err != nil {
		return fmt.Errorf("streams: put object %s: %w", name, err)
	}
	if info.Digest != want {
		return fmt.Errorf("%w: object %s stored with %s", ErrDigestMismatch, name, info.Digest)
	}
	return nil
}

// objectDigest converts a hex sha256 to the object store's "SHA-256=<base64url>" form.
func objectDigest(hexDigest string) string {
	raw, _ := hex.DecodeString(hexDigest)
	return "SHA-256=" + base64.URLEncoding.EncodeToString(raw)
}

// Fetch returns the body of an FPM_BENCH message (inline, or from the object store) after checking its
// sha256 and size against the headers.
func (s *BenchStore) Fetch(ctx context.Context, hdr nats.Header, inline []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := s.FetchTo(ctx, hdr, inline, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// FetchTo writes the body of an FPM_BENCH message to w, verifying it (w may have received a bad body
// when an error wraps ErrDigestMismatch). An object is read up to one byte past the size its
// Fpm-Bench-Size header announces, never further.
func (s *BenchStore) FetchTo(ctx context.Context, hdr nats.Header, inline []byte, w io.Writer) error {
	digest := hdr.Get(streams.HeaderBenchSHA256)
	size, _ := strconv.ParseInt(hdr.Get(streams.HeaderBenchSize), 10, 64)
	h := sha256.New()
	mw := io.MultiWriter(w, h)
	var n int64
	if name := hdr.Get(streams.HeaderBenchObject); name != "" {
		ctx, cancel := context.WithTimeout(ctx, transferTimeout(size))
		defer cancel()
		obs, err := s.Objects(ctx)
		if err != nil {
			return err
		}
		res, err := obs.Get(ctx, name)
		if err != nil {
			return fmt.Errorf("streams: get object %s: %w", name, err)
		}
		// Never more than the headers announce (and one byte to tell a longer body): a body is read
		// only after its announced size was checked against the reader's limit.
		n, err = io.Copy(mw, io.LimitReader(res, size+1))
		res.Close()
		if err != nil {
			return fmt.Errorf("streams: read object %s: %w", name, err)
		}
	} else {
		k, err := mw.Write(inline)
		if err != nil {
			return err
		}
		n = int64(k)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest || n != size {
		return fmt.Errorf("%w: got sha256 %s (%d bytes), headers say %s (%d bytes)", ErrDigestMismatch, got, n, digest, size)
	}
	return nil
}

// isOverloaded reports a server that sheds load (429, stream ingest queue full, err_code 10167) or a
// client that stalled waiting for its acks.
func isOverloaded(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.Code == 429 || apiErr.ErrorCode == 10167) {
		return true
	}
	return errors.Is(err, jetstream.ErrTooManyStalledMsgs)
}
