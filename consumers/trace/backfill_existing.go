package trace

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/tracefile"
)

// What a backfill finds already written. A backfill may run over an output that holds lines of the
// range already: a rerun, a resumed run, an earlier backfill of an overlapping range, the live writer's
// own lines. It writes none of them twice. The lines carry nothing fpmbus-specific (no stream
// sequence: they stay Dynamo-identical), so the rule is decided from the lines on disk alone:
//
//   - Full mode: a message is not written when its line is in the producer's files: a line with its
//     identity (tracefile.LineIdentity: the producer's files, observed_at_unix_ms and a hash of
//     namespace, component, producer_id and the fpm object, which is the message body verbatim). Two messages with
//     one identity have byte-identical lines, so the rule counts: n such lines on disk account for n
//     messages, and a further one is written.
//   - Sampled mode: one line per key (namespace, component, producer_id, worker_id, dp_rank) and
//     interval (observed_at_unix_ms / SampleInterval). An interval of a key that has a sampled line
//     already gets none, and a sample whose message has a line of either mode is not written either.
//     The unchanged-counter rule compares with the key's last line before the interval, on disk or
//     written by this run, as the run that wrote those lines did.
//
// A producer's files are read at its first message of the range, as the takeover recovery reads them:
// only segments last modified at or after that message was stored (less recoverySlack for clock skew)
// can hold a line of it or of any later message of the range (a line is written after its message is
// stored). About 100 bytes are held per line read.

// existingLines is a backfill's record of the lines its output already holds, per producer prefix.
// Owned by the backfill's goroutine.
type existingLines struct {
	w        *writer
	byPrefix map[string]*existingProducer
	found    uint64 // messages (full) or samples (sampled) not written: their line was on disk
}

// existingProducer is what one producer's files held when the backfill first wrote to it.
type existingProducer struct {
	ids     map[tracefile.LineIdentity]int
	samples map[sampleKey][]existingSample // sampled lines per key, by interval ascending
}

// existingSample is the newest sampled line of a key in one interval.
type existingSample struct {
	interval, observed, counter int64
}

func newExistingLines(w *writer) *existingLines {
	return &existingLines{w: w, byPrefix: map[string]*existingProducer{}}
}

// producer returns what prefix's files hold, reading them at r, the producer's first message.
func (x *existingLines) producer(prefix string, r *record) (*existingProducer, error) {
	if ep := x.byPrefix[prefix]; ep != nil {
		return ep, nil
	}
	ep, err := x.load(prefix, r.Stored)
	if err != nil {
		return nil, err
	}
	x.byPrefix[prefix] = ep
	return ep, nil
}

// written reports whether full-mode record r has its line on disk already; that line then accounts for
// r and no other message.
func (x *existingLines) written(r *record) (bool, error) {
	prefix := tracefile.SegmentPrefix(x.w.cfg.OutputPath, r.Producer)
	ep, err := x.producer(prefix, r)
	if err != nil {
		return false, err
	}
	id := tracefile.IdentityOf(prefix, r.Key.Namespace, r.Key.Component, r.Producer, r.Observed, r.Body)
	if n := ep.ids[id]; n > 0 {
		if n == 1 {
			delete(ep.ids, id)
		} else {
			ep.ids[id] = n - 1
		}
		x.found++
		return true, nil
	}
	return false, nil
}

// sampled reports whether key k's interval iv has its line on disk already, or sample r has a line of
// either mode; counter is then the counter_id the key's last line has (the rule's next comparison).
func (x *existingLines) sampled(prefix string, k sampleKey, iv int64, r *record) (counter int64, ok bool) {
	ep := x.byPrefix[prefix]
	if ep == nil {
		return 0, false
	}
	ss := ep.samples[k]
	if i, found := slices.BinarySearchFunc(ss, iv, func(s existingSample, iv int64) int { return cmp.Compare(s.interval, iv) }); found {
		x.found++
		return ss[i].counter, true
	}
	if ep.ids[tracefile.IdentityOf(prefix, r.Key.Namespace, r.Key.Component, r.Producer, r.Observed, r.Body)] > 0 {
		x.found++
		return r.FPM.CounterID, true
	}
	return 0, false
}

// before returns key k's last sampled line on disk in an interval before iv.
func (x *existingLines) before(prefix string, k sampleKey, iv int64) (existingSample, bool) {
	ep := x.byPrefix[prefix]
	if ep == nil {
		return existingSample{}, false
	}
	ss := ep.samples[k]
	i, _ := slices.BinarySearchFunc(ss, iv, func(s existingSample, iv int64) int { return cmp.Compare(s.interval, iv) })
	if i == 0 {
		return existingSample{}, false
	}
	return ss[i-1], true
}

// load reads the lines of prefix's segments that can belong to messages stored at or after stored.
func (x *existingLines) load(prefix string, stored time.Time) (*existingProducer, error) {
	ep := &existingProducer{ids: map[tracefile.LineIdentity]int{}}
	sampling := x.w.sampler != nil
	if sampling {
		ep.samples = map[sampleKey][]existingSample{}
	}
	segs, err := tracefile.ListSegments(prefix)
	if err != nil {
		return nil, fmt.Errorf("trace: backfill: %w", err)
	}
	lines, read := 0, 0
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		if !s.Regular {
			continue
		}
		fi, err := os.Stat(s.Path)
		if err != nil {
			return nil, fmt.Errorf("trace: backfill: %w", err)
		}
		if !stored.IsZero() && fi.ModTime().Before(stored.Add(-tracefile.RecoverySlack)) {
			break // written before the range's first message of the producer was stored
		}
		read++
		err = tracefile.ReadSegment(s.Path, func(line []byte) error {
			tl, err := schemas.ParseTraceLine(line)
			if err != nil {
				return nil // not a line a writer wrote; verify and info report it
			}
			lines++
			e := &tl.Event
			ep.ids[tracefile.IdentityOf(prefix, e.Source.Namespace, e.Source.Component, e.Source.ProducerID, e.ObservedAtUnixMs, e.FPM)]++
			if !sampling || e.CaptureMode != schemas.CaptureSampled {
				return nil
			}
			f, err := schemas.ParseFPMJSON(e.FPM)
			if err != nil {
				return nil
			}
			k := sampleKey{namespace: e.Source.Namespace, component: e.Source.Component, producer: e.Source.ProducerID, workerID: f.WorkerID, dpRank: f.DPRank}
			ep.samples[k] = append(ep.samples[k], existingSample{interval: e.ObservedAtUnixMs / x.w.sampler.intervalMs, observed: e.ObservedAtUnixMs, counter: f.CounterID})
			return nil
		})
		var ce *tracefile.CorruptError
		if err != nil && !errors.As(err, &ce) {
			return nil, fmt.Errorf("trace: backfill: %w", err)
		}
	}
	for k, ss := range ep.samples {
		// By interval, the newest observation of each interval last; one entry per interval.
		slices.SortStableFunc(ss, func(a, b existingSample) int {
			if c := cmp.Compare(a.interval, b.interval); c != 0 {
				return c
			}
			return cmp.Compare(a.observed, b.observed)
		})
		out := ss[:0]
		for _, s := range ss {
			if n := len(out); n > 0 && out[n-1].interval == s.interval {
				out[n-1] = s
				continue
			}
			out = append(out, s)
		}
		ep.samples[k] = out
	}
	if lines > 0 {
		x.w.log.Info("trace backfill: the output holds lines of this producer; none is written twice",
			"prefix", prefix, "segments_read", read, "lines", lines)
	}
	return ep, nil
}
