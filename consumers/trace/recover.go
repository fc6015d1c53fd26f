package trace

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// Takeover recovery. A message is done only after its line is fsynced, but its acknowledgement may
// never reach the server: kill -9 between the fsync and the ack's departure, a connection cut, or,
// under cumulative acks, a message durable while an earlier one of the partition was not yet. Such a
// message comes again to the partition's next owner (this process restarted, or another instance:
// the partition consumer is reset to its ack floor when a writer takes it over) although its line is
// on disk; written again, it would be a duplicate. So when a writer sees a producer's first message
// after a takeover, it repairs the producer's newest segment (a crashed owner may have left a torn
// tail; only now, with the partition owned, is nobody else writing it) and reads the identities of
// the lines of the producer's segments that can hold such a line; seqState then skips the redelivered
// messages whose lines are among them.
//
// A line is matched by its identity (tracefile.LineIdentity: prefix, observed_at_unix_ms and a hash of
// namespace, component, producer_id and the fpm object), since a line carries nothing fpmbus-specific.
//
// Only segments that can hold such a line are read: newest first, stopping at the first segment last
// modified more than tracefile.RecoverySlack before the producer's first redelivered message was stored (a line
// is written after its message is delivered). Lines in segments already pruned by MaxSegments cannot
// be found: those messages are written again, into the retained window.
//
// In sampled mode the same segments also seed the sampler with each key's last written line (its
// interval and counter_id), so that a redelivered message of an interval that already has its line is
// treated as late, not written as a second sample of that interval.

// recoveryResult says what the takeovers of a Consumer found, summed over its partitions and
// producers.
type recoveryResult struct {
	// Producers is how many producers were checked after a takeover.
	Producers int
	// Found is how many redelivered messages already had their line on disk (skipped, not written
	// again).
	Found int
	// SegmentsRead and LinesRead measure the work done.
	SegmentsRead, LinesRead int
	// Seeded is the number of sampled-mode keys seeded from their last written line.
	Seeded int
}

// recoveryTotals sums RecoveryResults from the runner's goroutine for readers on others.
type recoveryTotals struct {
	mu  sync.Mutex
	sum recoveryResult
}

func (t *recoveryTotals) add(r recoveryResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sum.Producers += r.Producers
	t.sum.Found += r.Found
	t.sum.SegmentsRead += r.SegmentsRead
	t.sum.LinesRead += r.LinesRead
	t.sum.Seeded += r.Seeded
}

func (t *recoveryTotals) get() recoveryResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sum
}

// recoverSeed is a sampled-mode seed: a key's last written line's interval and counter_id.
type recoverSeed struct {
	interval, counter int64
}

// takeover is the recovery of one writer, a partition's ownership: per producer, on its first
// message, load its seqState; then check each message against it.
type takeover struct {
	w           *writer
	checkWorker bool                 // P > 1: a producer must be its worker_id, the partition key
	byID        map[string]*seqState // by unsanitized producer id
	byPrefix    map[string]*seqState // ids that sanitize alike share files, hence one state
	totals      *recoveryTotals
}

func newTakeover(w *writer, partitions int, totals *recoveryTotals) *takeover {
	return &takeover{w: w, checkWorker: partitions > 1, byID: map[string]*seqState{}, byPrefix: map[string]*seqState{}, totals: totals}
}

// written reports whether r's line is already on disk. A message the group cannot write safely is a
// *messageError.
func (t *takeover) written(r *record) (bool, error) {
	if t.checkWorker && r.Producer != r.Key.WorkerID {
		return false, &messageError{fmt.Errorf("%w: message %s has producer id %q (Fpm-Producer header), not its worker_id %q: with --partitions > 1 "+
			"its file could get two writers; run the bridges without --producer-id, or use --partitions 1",
			errGroupUnsupported, r.d.Subject(), r.Producer, r.Key.WorkerID)}
	}
	st := t.byID[r.Producer]
	if st == nil {
		prefix := tracefile.SegmentPrefix(t.w.cfg.OutputPath, r.Producer)
		if st = t.byPrefix[prefix]; st == nil {
			var err error
			if st, err = t.load(prefix, r.Stored); err != nil {
				return false, err
			}
			t.byPrefix[prefix] = st
		}
		t.byID[r.Producer] = st
	}
	if !st.checking() {
		return false, nil
	}
	found := st.written(r)
	if found {
		t.totals.add(recoveryResult{Found: 1})
	}
	if !st.checking() && st.skipped > 0 {
		t.w.log.Info("trace takeover: redelivered messages whose lines the previous owner wrote are skipped",
			"prefix", st.prefix, "skipped", st.skipped, "last_written_seq", st.last)
	}
	return found, nil
}

// load repairs prefix's newest segment and reads the identities of the lines that can belong to
// messages stored at or after stored.
func (t *takeover) load(prefix string, stored time.Time) (*seqState, error) {
	w := t.w
	if err := tracefile.RemoveRepairLeftovers(prefix, w.log); err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	segs, err := tracefile.ListSegments(prefix)
	if err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	for i := len(segs) - 1; i >= 0; i-- {
		if segs[i].Regular {
			if _, err := tracefile.Repair(segs[i].Path, w.log); err != nil {
				if repairRefused(err) && w.unrepaired != nil { // this producer alone (unrepaired.go)
					return nil, &messageError{w.unrepaired.refuse(prefix, err, w.log)}
				}
				return nil, fmt.Errorf("trace: takeover: %w", err)
			}
			break
		}
	}
	if segs, err = tracefile.ListSegments(prefix); err != nil {
		return nil, fmt.Errorf("trace: takeover: %w", err)
	}
	st := &seqState{prefix: prefix, ids: map[tracefile.LineIdentity]int{}, sampled: w.sampler != nil}
	res := recoveryResult{Producers: 1}
	seeds := map[sampleKey]recoverSeed{}
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		if !s.Regular {
			continue
		}
		fi, err := os.Stat(s.Path)
		if err != nil {
			return nil, fmt.Errorf("trace: takeover: %w", err)
		}
		if fi.ModTime().After(st.lastWrite) {
			st.lastWrite = fi.ModTime()
		}
		if !stored.IsZero() && fi.ModTime().Before(stored.Add(-tracefile.RecoverySlack)) {
			break // written before the first redelivered message was stored
		}
		res.SegmentsRead++
		n, err := w.readLineIdentities(s.Path, prefix, seeds, func(id tracefile.LineIdentity) { st.ids[id]++ })
		res.LinesRead += n
		if err != nil {
			return nil, fmt.Errorf("trace: takeover: %w", err)
		}
	}
	res.Seeded = w.seedSampler(seeds)
	if len(st.ids) == 0 {
		st.ids = nil
	}
	t.totals.add(res)
	w.log.Debug("trace takeover: producer's recent lines read", "prefix", prefix, "segments", res.SegmentsRead, "lines", res.LinesRead)
	return st, nil
}

// sortSampleKeys sorts seeded keys: a deterministic emission order.
func sortSampleKeys(ks []sampleKey) {
	slices.SortFunc(ks, func(a, b sampleKey) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.component, b.component),
			strings.Compare(a.producer, b.producer), strings.Compare(a.workerID, b.workerID), cmp.Compare(a.dpRank, b.dpRank))
	})
}

// readLineIdentities reads one segment a writer wrote, calls onID with every line's identity and, when
// sampling, records in seeds the newest sample of each key it holds (seeds already present — from newer
// segments, read first — are kept). A torn tail ends the read without error: repair reports it. It
// returns the lines read.
func (w *writer) readLineIdentities(path, prefix string, seeds map[sampleKey]recoverSeed, onID func(tracefile.LineIdentity)) (int, error) {
	lines := 0
	segSeeds := map[sampleKey]recoverSeed{}
	err := tracefile.ReadSegment(path, func(line []byte) error {
		lines++
		tl, err := schemas.ParseTraceLine(line)
		if err != nil {
			return nil // not a line this writer wrote; info reports it
		}
		e := &tl.Event
		onID(tracefile.IdentityOf(prefix, e.Source.Namespace, e.Source.Component, e.Source.ProducerID, e.ObservedAtUnixMs, e.FPM))
		if w.sampler != nil {
			if f, err := schemas.ParseFPMJSON(e.FPM); err == nil {
				k := sampleKey{namespace: e.Source.Namespace, component: e.Source.Component,
					producer: e.Source.ProducerID, workerID: f.WorkerID, dpRank: f.DPRank}
				segSeeds[k] = recoverSeed{interval: e.ObservedAtUnixMs / w.sampler.intervalMs, counter: f.CounterID}
			}
		}
		return nil
	})
	var ce *tracefile.CorruptError
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
func (w *writer) seedSampler(seeds map[sampleKey]recoverSeed) int {
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

// seqState is one producer's dedup after a takeover: which of its redelivered messages already have
// their line in its files. The partition consumer is reset to its ack floor when a writer takes it
// over, so every message the previous owner did not acknowledge comes again, in stream order; the
// previous owner may have made some of their lines durable without its acknowledgement reaching the
// server (a crash between the fsync and the ack, a connection cut). An owner writes a producer's
// messages in stream order and says none done before its line is durable, so in full mode those
// lines are exactly a prefix of the producer's redelivered messages: the check skips messages while
// their line identity (tracefile/identity.go) is among the lines read, and the first one that is not ends it.
// Every message skipped is therefore at or below the last stream sequence found written (last), and
// every later one is written.
//
// In sampled mode most messages have no line of their own, so there is no prefix: a message whose
// identity is found is skipped, the others go to the sampler, which the same lines seeded with each
// key's last written interval (a redelivered message of an interval already written is late). The
// check ends once every identity was found, or at the first message stored after the producer's last
// write (less recoverySlack for clock skew): nothing stored later can have a line.
type seqState struct {
	prefix    string
	ids       map[tracefile.LineIdentity]int // lines read and not matched yet; nil once the check is over
	sampled   bool
	lastWrite time.Time // modification time of the producer's newest segment
	last      uint64    // last stream sequence found written
	skipped   int
}

// written reports whether r's line is already on disk (r is then done without a line) and ends the
// check when nothing later can be.
func (s *seqState) written(r *record) bool {
	if s.ids == nil {
		return false
	}
	id := tracefile.IdentityOf(s.prefix, r.Key.Namespace, r.Key.Component, r.Producer, r.Observed, r.Body)
	if n := s.ids[id]; n > 0 {
		if n == 1 {
			delete(s.ids, id)
		} else {
			s.ids[id] = n - 1
		}
		s.last = max(s.last, r.Seq)
		s.skipped++
		if len(s.ids) == 0 {
			s.ids = nil
		}
		return true
	}
	if !s.sampled || r.Stored.After(s.lastWrite.Add(tracefile.RecoverySlack)) {
		s.ids = nil
	}
	return false
}

// checking reports whether the check is still on.
func (s *seqState) checking() bool { return s.ids != nil }
