package trace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Startup recovery. A message is acked only after its line is fsynced, but the ack itself may never
// reach the server: kill -9 between the fsync and the ack's departure, or a connection cut. Such a
// message is redelivered although its line is on disk; written again, it would be a duplicate. So,
// before pulling, Run asks the durable consumer which messages may come back — everything above its
// ack floor up to its last delivered sequence (at most MaxAckPending of them are unacked) — reads
// exactly that range of the stream with an ordered consumer (the durable is not touched), and looks
// for each message's line in the newest segments of its producer. The messages found are marked done
// in seqState: when they are redelivered they are acked and skipped.
//
// A line is matched by identity, since a line carries nothing fpmbus-specific (it must stay
// Dynamo-identical): its producer's segment prefix, observed_at_unix_ms, and a 64-bit hash of
// namespace, component, producer_id and the fpm object's bytes (the fpm object carries worker_id,
// dp_rank and counter_id, and is the message body verbatim). Two stream messages with the same
// identity are byte-identical lines; each line found accounts for one of them.
//
// Only segments that can hold such a line are read: newest first, stopping at the first segment last
// modified more than recoverySlack before the oldest candidate was stored (a line is written after its
// message is delivered). Lines in segments already pruned by MaxSegments cannot be found: those
// messages are written again, into the retained window.
//
// In sampled mode the same segments also seed the sampler with each key's last written line (its
// interval and counter_id), so that a redelivered message of an interval that already has its line is
// treated as late, not written as a second sample of that interval.

// recoverySlack tolerates clock skew between the server (stream timestamps) and this host (mtimes).
const recoverySlack = time.Minute

// maxRecoveryScan bounds how many stream messages the recovery reads. The unacked range is normally
// about MaxAckPending; a range beyond this is read from its newest end, and older redeliveries may be
// written twice (logged).
const maxRecoveryScan = 2_000_000

// identitySeed hashes line identities; it only has to be stable within one process.
var identitySeed = maphash.MakeSeed()

// lineIdentity identifies a trace line (see above).
type lineIdentity struct {
	prefix   string
	observed int64
	sum      uint64
}

func identityOf(prefix, namespace, component, producer string, observed int64, fpm []byte) lineIdentity {
	var h maphash.Hash
	h.SetSeed(identitySeed)
	h.WriteString(namespace)
	h.WriteByte(0)
	h.WriteString(component)
	h.WriteByte(0)
	h.WriteString(producer)
	h.WriteByte(0)
	h.Write(fpm)
	return lineIdentity{prefix: prefix, observed: observed, sum: h.Sum64()}
}

// RecoveryResult says what the startup recovery found.
type RecoveryResult struct {
	// AckFloor and Delivered are the durable consumer's state at start; Candidates the stream messages
	// in between (those that may be redelivered).
	AckFloor, Delivered uint64
	Candidates          int
	// Found is how many candidates already have their line on disk (skipped when redelivered).
	Found int
	// SegmentsRead and LinesRead measure the work done.
	SegmentsRead, LinesRead int
	// Seeded is the number of sampled-mode keys seeded from their last written line.
	Seeded int
}

// candidate is one stream message that may be redelivered.
type candidate struct {
	seq    uint64
	stored time.Time
}

// recoverSeeds are sampled-mode seeds: per key, the last written line's interval and counter_id.
type recoverSeed struct {
	interval, counter int64
}

// recover runs the startup recovery for the consumer state in ci (see above) and marks the candidates
// found on disk done in w.seqs.
func (w *Writer) recover(ctx context.Context, ci *jetstream.ConsumerInfo) (RecoveryResult, error) {
	res := RecoveryResult{AckFloor: ci.AckFloor.Stream, Delivered: ci.Delivered.Stream}
	if ci.NumAckPending == 0 || res.Delivered <= res.AckFloor {
		return res, nil
	}
	from := res.AckFloor + 1
	if res.Delivered-res.AckFloor > maxRecoveryScan {
		from = res.Delivered - maxRecoveryScan + 1
		w.logger.Warn("trace recovery: unacked range too long; older redelivered messages may be written twice",
			"ack_floor", res.AckFloor, "delivered", res.Delivered, "scanned_from", from)
	}
	byID := map[lineIdentity][]candidate{}
	oldest := map[string]time.Time{} // per prefix
	err := w.scanStream(ctx, from, res.Delivered, func(m jetstream.Msg) {
		r, err := parseRecord(m, w.cfg.ProducerID, nil)
		if err != nil {
			return // never written: terminated when redelivered
		}
		prefix := SegmentPrefix(w.cfg.OutputPath, r.producer)
		id := identityOf(prefix, r.key.Namespace, r.key.Component, r.producer, r.observed, r.body)
		byID[id] = append(byID[id], candidate{seq: r.seq, stored: r.stored})
		if t, ok := oldest[prefix]; !ok || r.stored.Before(t) {
			oldest[prefix] = r.stored
		}
		res.Candidates++
	})
	if err != nil {
		return res, fmt.Errorf("trace: recovery: read stream %s from sequence %d to %d: %w", streams.StreamFPM, from, res.Delivered, err)
	}
	left := map[string]int{}
	for id, cs := range byID {
		left[id.prefix] += len(cs)
	}
	seeds := map[sampleKey]recoverSeed{}
	for prefix, stored := range oldest {
		segs, err := ListSegments(prefix)
		if err != nil {
			return res, fmt.Errorf("trace: recovery: %w", err)
		}
		for i := len(segs) - 1; i >= 0 && left[prefix] > 0; i-- {
			s := segs[i]
			if !s.Regular {
				continue
			}
			fi, err := os.Stat(s.Path)
			if err != nil {
				return res, fmt.Errorf("trace: recovery: %w", err)
			}
			if fi.ModTime().Before(stored.Add(-recoverySlack)) {
				break // written before any candidate was stored
			}
			res.SegmentsRead++
			n, err := w.scanSegment(s.Path, prefix, seeds, func(id lineIdentity) {
				if cs := byID[id]; len(cs) > 0 {
					w.seqs.finish(cs[len(cs)-1].seq)
					byID[id] = cs[:len(cs)-1]
					left[prefix]--
					res.Found++
				}
			})
			res.LinesRead += n
			if err != nil {
				return res, fmt.Errorf("trace: recovery: %w", err)
			}
		}
	}
	res.Seeded = w.seedSampler(seeds)
	w.logger.Info("trace recovery: lines already written for unacked messages are skipped when redelivered",
		"ack_floor", res.AckFloor, "delivered", res.Delivered, "candidates", res.Candidates, "found", res.Found,
		"segments_read", res.SegmentsRead, "lines_read", res.LinesRead)
	return res, nil
}

// scanStream passes every message of stream FPM from sequence from to to (inclusive) on the writer's
// filter subject to fn, in order, through an ordered consumer.
func (w *Writer) scanStream(ctx context.Context, from, to uint64, fn func(jetstream.Msg)) error {
	s, err := w.js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{w.cfg.FilterSubject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from,
	})
	if err != nil {
		return err
	}
	for end := false; !end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := oc.FetchNoWait(1000)
		if err != nil {
			return err
		}
		n := 0
		var merr error
		for m := range batch.Messages() { // read to the end: the fetch's goroutine ends with it
			n++
			if end || merr != nil {
				continue
			}
			md, err := m.Metadata()
			if err != nil {
				merr = err
				continue
			}
			if md.Sequence.Stream > to {
				end = true
				continue
			}
			fn(m)
			end = md.Sequence.Stream == to || md.NumPending == 0
		}
		if merr != nil {
			return merr
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return err
		}
		if n == 0 {
			return nil // nothing more on the filter (the range's end was deleted or filtered out)
		}
	}
	return nil
}

// sortSampleKeys sorts seeded keys: a deterministic emission order.
func sortSampleKeys(ks []sampleKey) {
	slices.SortFunc(ks, func(a, b sampleKey) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.component, b.component),
			strings.Compare(a.producer, b.producer), strings.Compare(a.workerID, b.workerID), cmp.Compare(a.dpRank, b.dpRank))
	})
}

// scanSegment reads one segment the writer wrote, calls onID with every line's identity and, when
// sampling, records in seeds the newest sample of each key it holds (seeds already present — from newer
// segments, read first — are kept). A torn tail ends the read without error: repair reports it. It
// returns the lines read.
func (w *Writer) scanSegment(path, prefix string, seeds map[sampleKey]recoverSeed, onID func(lineIdentity)) (int, error) {
	lines := 0
	segSeeds := map[sampleKey]recoverSeed{}
	err := ReadSegment(path, func(line []byte) error {
		lines++
		tl, err := schemas.ParseTraceLine(line)
		if err != nil {
			return nil // not a line this writer wrote; info reports it
		}
		e := &tl.Event
		onID(identityOf(prefix, e.Source.Namespace, e.Source.Component, e.Source.ProducerID, e.ObservedAtUnixMs, e.FPM))
		if w.sampler != nil {
			if f, err := schemas.ParseFPMJSON(e.FPM); err == nil {
				k := sampleKey{namespace: e.Source.Namespace, component: e.Source.Component,
					producer: e.Source.ProducerID, workerID: f.WorkerID, dpRank: f.DPRank}
				segSeeds[k] = recoverSeed{interval: e.ObservedAtUnixMs / w.sampler.intervalMs, counter: f.CounterID}
			}
		}
		return nil
	})
	var ce *CorruptError
	if err != nil && !errors.As(err, &ce) {
		return lines, err
	}
	for k, sd := range segSeeds {
		if _, ok := seeds[k]; !ok {
			seeds[k] = sd
		}
	}
	return lines, nil
}

// seedSampler hands the newest recovered sample of every key to the sampler, in a stable order, so
// no interval gets a second sample after a restart or takeover. It returns the keys seeded.
func (w *Writer) seedSampler(seeds map[sampleKey]recoverSeed) int {
	if w.sampler == nil {
		return 0
	}
	ks := make([]sampleKey, 0, len(seeds))
	for k := range seeds {
		ks = append(ks, k)
	}
	sortSampleKeys(ks)
	for _, k := range ks {
		w.sampler.seed(k, seeds[k])
	}
	return len(ks)
}
