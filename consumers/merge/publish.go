package merge

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

// DefaultInlineMax is the largest body published inline on FPM_BENCH.
const DefaultInlineMax = 1 << 20

// ErrDigestMismatch: a body read back from FPM_BENCH or the object store does not match its sha256.
var ErrDigestMismatch = errors.New("merge: artefact body does not match its sha256")

// Store publishes artefact bodies to FPM_BENCH and reads them back. It is safe for concurrent use.
type Store struct {
	js        jetstream.JetStream
	inlineMax int
	cfg       jetstream.ObjectStoreConfig

	mu  sync.Mutex
	obs jetstream.ObjectStore
}

// NewStore returns a Store. inlineMax <= 0 means DefaultInlineMax; sc gives the object bucket's
// replicas, storage and max age (FPM_BENCH's).
func NewStore(js jetstream.JetStream, inlineMax int, sc streams.Config) *Store {
	if inlineMax <= 0 {
		inlineMax = DefaultInlineMax
	}
	return &Store{js: js, inlineMax: inlineMax, cfg: jetstream.ObjectStoreConfig{
		Bucket:      ObjectBucket,
		Description: "fpmbus benchmark artefact bodies larger than the inline limit of FPM_BENCH messages",
		TTL:         sc.BenchMaxAge,
		Storage:     sc.Storage,
		Replicas:    sc.Replicas,
	}}
}

// Object Put and overload. nats.go's Put publishes an object's chunks (128 KiB) asynchronously with up
// to 4,000 in flight and no flow control against the server: on a busy host the server can answer 429
// (its per-stream ingest queue of 128 MiB is full) or the client can give up waiting for acks ("stalled
// with too many outstanding async published messages"). Both mean "slow down", so putObject retries the
// whole Put with growing pauses; Put under the same name replaces the earlier partial object.

func (s *Store) objects(ctx context.Context) (jetstream.ObjectStore, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs != nil {
		return s.obs, nil
	}
	obs, err := s.js.CreateOrUpdateObjectStore(ctx, s.cfg)
	if err != nil {
		return nil, fmt.Errorf("merge: object store %s: %w", ObjectBucket, err)
	}
	s.obs = obs
	return obs, nil
}

// body is what Publish sends: bytes in memory, or a file streamed into the object store.
type body struct {
	data   []byte
	path   string
	digest string // hex sha256; computed when empty
	size   int64
}

func (b *body) prepare() error {
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

// publish sends b on subject with headers hdr (Kind and Run set by the caller) and message id msgID.
func (s *Store) publish(ctx context.Context, subject, msgID, object string, hdr nats.Header, b body) (*jetstream.PubAck, error) {
	if err := b.prepare(); err != nil {
		return nil, fmt.Errorf("merge: read %s: %w", b.path, err)
	}
	hdr.Set(HeaderSHA256, b.digest)
	hdr.Set(HeaderSize, strconv.FormatInt(b.size, 10))
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
		name := object
		if err := s.putObject(ctx, name, b); err != nil {
			return nil, err
		}
		hdr.Set(HeaderObject, name)
	}
	ack, err := s.js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("merge: publish %s: %w", subject, err)
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
func (s *Store) putObject(ctx context.Context, name string, b body) error {
	obs, err := s.objects(ctx)
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
		return fmt.Errorf("merge: put object %s: %w", name, err)
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
func (s *Store) Fetch(ctx context.Context, hdr nats.Header, inline []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := s.FetchTo(ctx, hdr, inline, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// FetchTo writes the body of an FPM_BENCH message to w, verifying it (w may have received a bad body
// when an error wraps ErrDigestMismatch).
func (s *Store) FetchTo(ctx context.Context, hdr nats.Header, inline []byte, w io.Writer) error {
	digest := hdr.Get(HeaderSHA256)
	size, _ := strconv.ParseInt(hdr.Get(HeaderSize), 10, 64)
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	if name := hdr.Get(HeaderObject); name != "" {
		ctx, cancel := context.WithTimeout(ctx, transferTimeout(size))
		defer cancel()
		obs, err := s.objects(ctx)
		if err != nil {
			return err
		}
		res, err := obs.Get(ctx, name)
		if err != nil {
			return fmt.Errorf("merge: get object %s: %w", name, err)
		}
		_, err = io.Copy(cw, res)
		res.Close()
		if err != nil {
			return fmt.Errorf("merge: read object %s: %w", name, err)
		}
	} else if _, err := cw.Write(inline); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest || cw.n != size {
		return fmt.Errorf("%w: got sha256 %s (%d bytes), headers say %s (%d bytes)", ErrDigestMismatch, got, cw.n, digest, size)
	}
	return nil
}

// RankSummary describes a rank artefact that passed ValidateRank.
type RankSummary struct {
	RunID  string
	Rank   int
	DPSize int
	Points int
}

// ValidateRank applies every rule that one rank artefact can be checked against on its own: the document
// and status/coverage rules, and every point rule over its synchronised groups (which carry every rank's
// FPMs). Rules that compare ranks are left to the merge.
func ValidateRank(rf RankFile) (RankSummary, error) {
	info, err := loadRankInfo(&rf)
	if err != nil {
		return RankSummary{}, err
	}
	rf.Rank = info.rank
	res, err := Merge([]RankFile{rf}, nil, Options{})
	if err != nil {
		return RankSummary{}, err
	}
	return RankSummary{RunID: res.RunID, Rank: info.rank, DPSize: info.size, Points: res.Points}, nil
}

// PublishRank validates a rank artefact and publishes it on RankSubject(run, rank). file is the
// producer's path recorded in rank_files. A re-publication of identical bytes is deduplicated by
// JetStream (PubAck.Duplicate) within the duplicate window, and recognised by the merger after it.
func (s *Store) PublishRank(ctx context.Context, file string, data []byte) (RankSummary, *jetstream.PubAck, error) {
	sum, err := ValidateRank(RankFile{Rank: RankFromPath(file), Path: file, Data: data})
	if err != nil {
		return RankSummary{}, nil, err
	}
	ack, err := s.PublishRankChecked(ctx, file, data, sum)
	return sum, ack, err
}

// PublishRankChecked publishes a rank artefact that already passed ValidateRank with summary sum.
func (s *Store) PublishRankChecked(ctx context.Context, file string, data []byte, sum RankSummary) (*jetstream.PubAck, error) {
	digest := schemas.SHA256Hex(data)
	hdr := nats.Header{}
	hdr.Set(HeaderKind, KindRank)
	hdr.Set(HeaderRun, sum.RunID)
	hdr.Set(HeaderRank, strconv.Itoa(sum.Rank))
	hdr.Set(HeaderDPSize, strconv.Itoa(sum.DPSize))
	hdr.Set(HeaderFile, file)
	return s.publish(ctx, RankSubject(sum.RunID, sum.Rank), rankMsgID(sum.RunID, sum.Rank, digest),
		objectName(KindRank, sum.RunID, sum.Rank, digest), hdr, body{data: data, digest: digest})
}

// PublishProbe publishes worker-probe replies for run runID (the file's own run_id when runID is "").
func (s *Store) PublishProbe(ctx context.Context, runID, file string, data []byte) (*jetstream.PubAck, string, error) {
	pr, err := ParseProbeReplies(data, file)
	if err != nil {
		return nil, "", err
	}
	switch {
	case runID == "" && pr.RunID == "":
		return nil, "", fmt.Errorf("merge: probe replies %s name no run_id; give the run explicitly", file)
	case runID == "":
		runID = pr.RunID
	case pr.RunID != "" && pr.RunID != runID:
		return nil, "", fmt.Errorf("merge: probe replies %s are for run %q, not %q", file, pr.RunID, runID)
	}
	digest := schemas.SHA256Hex(data)
	hdr := nats.Header{}
	hdr.Set(HeaderKind, KindProbe)
	hdr.Set(HeaderRun, runID)
	hdr.Set(HeaderFile, file)
	ack, err := s.publish(ctx, ProbeSubject(runID), probeMsgID(runID, digest), objectName(KindProbe, runID, -1, digest), hdr, body{data: data, digest: digest})
	return ack, runID, err
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
