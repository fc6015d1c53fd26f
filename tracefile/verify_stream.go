package tracefile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Matching a trace output to stream FPM. The stream is read once, in order, with an ordered consumer
// (ephemeral, acknowledging nothing, invisible to the writer's durable consumers), from the earliest
// observation of any line less recoverySlack (a message is stored after its bridge received it, up to
// clock skew) to the stream's last message when the read starts; the files are read first, so every
// line read has its message at or below that. Each message is filed under its producer and line
// identity exactly as the writer files it (ParseRecord with the writer's --producer-id, --filter):
// messages the writer could never write (invalid ones, and those it dead-lettered on
// fpmevents.deadletter.consumer.trace) have no line and are left out.
//
// A full-mode producer's lines are in stream order, so its matched lines must have increasing stream
// sequences (else FindingOrder, and nothing of that producer is restored: where a message belongs would
// be a guess). A sampled writer writes a key's line when the key's interval ends, so one producer's
// lines of several keys follow no stream order and are not held to one. Messages without a line that fall between two matched lines are kept; between two adjacent
// lines of full mode they are missing lines (FindingMissing), between the lines around one damaged
// region they are that region's lines. A full-mode writer writes every message it is given, in order,
// so the region's lines are exactly the producer's messages between the two lines' messages — provided
// the stream still holds both of them and deleted nothing in between (a limit or a purge removes the
// oldest messages first; an interior delete is reported by the stream). Otherwise the damage is
// incomplete: what is lost is listed per key as the counter_ids between the key's lines around it. In
// sampled mode the writer keeps one message per key and interval, chosen partly by its clock: which
// messages had lines cannot be told, and nothing is restored.

// ErrStreamSharded: matching lines to the stream (Verify with js: VerifyConfig.Stream, Repair) needs
// the single stream FPM, and the server spreads FPMs over shards.
var ErrStreamSharded = errors.New("trace: verify: matching to the stream needs the single stream FPM")

// refuseShards returns ErrStreamSharded when the server has FPM shards. The matching is defined on
// one stream's sequences: a producer's lines in increasing sequence, the damaged region between two
// lines' messages, the stream's first sequence and interior deletes deciding what can be restored. A
// producer's messages may span shards (the Fpm-Producer header need not be the worker), and each
// shard is numbered on its own, so none of it carries over.
func refuseShards(ctx context.Context, js jetstream.JetStream) error {
	n, err := streams.FPMShardsOf(ctx, js)
	if err != nil {
		return fmt.Errorf("trace: verify: %w", err)
	}
	if n > 1 {
		return fmt.Errorf("%w: the server spreads FPMs over %d shard streams (%s … %s), each numbered on its own; "+
			"check the files alone (`fpmbus trace verify` without --stream and --repair), and rewrite a damaged "+
			"time range from the shards with `fpmbus trace backfill --trace-mode full --since T --until T` into another --trace-output",
			ErrStreamSharded, n, streams.ShardStreamName(0), streams.ShardStreamName(n-1))
	}
	return nil
}

// WriterName names the trace writer (consumers/trace) in the durable runner: its metrics label, and
// its dead letters on streams.ConsumerDeadLetterSubject(WriterName) =
// fpmevents.deadletter.consumer.trace (the runner's durable.RejectedSubject),
// which Verify reads (messages the writer never wrote).
const WriterName = "trace"

// candidate is a stream message without a line: what is needed to rebuild its line.
type candidate struct {
	seq uint64
	rec Record // Body is a copy
}

// scanIdleWait ends a stream read that gets nothing for this long (messages removed while it reads).
const scanIdleWait = 30 * time.Second

// matchStream reads stream FPM and matches its messages to the lines read (see above).
func (v *verifier) matchStream(ctx context.Context, js jetstream.JetStream) error {
	s, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return fmt.Errorf("trace: verify: stream %s: %w", streams.StreamFPM, err)
	}
	info, err := s.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return fmt.Errorf("trace: verify: stream %s: %w", streams.StreamFPM, err)
	}
	v.firstSeq, v.lastSeq = info.State.FirstSeq, info.State.LastSeq
	v.deleted = slices.Sorted(slices.Values(info.State.Deleted))
	if info.State.Msgs == 0 {
		return nil
	}
	dead, err := writerRejects(ctx, js)
	if err != nil {
		return err
	}
	earliest := int64(-1)
	for _, p := range v.producers {
		for i := range p.lines {
			if l := &p.lines[i]; l.valid && (!l.salvaged || i == 0 && p.head != nil) && (earliest < 0 || l.id.observed < earliest) {
				earliest = l.id.observed
			}
		}
	}
	cc := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if earliest >= 0 {
		since := time.UnixMilli(earliest).Add(-RecoverySlack)
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	pending, err := streams.CountPending(ctx, s, v.cfg.FilterSubject, cc)
	if err != nil {
		return fmt.Errorf("trace: verify: read %s: %w", streams.StreamFPM, err)
	}
	if pending == 0 {
		return nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{v.cfg.FilterSubject},
		DeliverPolicy: cc.DeliverPolicy, OptStartTime: cc.OptStartTime})
	if err != nil {
		return fmt.Errorf("trace: verify: read %s: %w", streams.StreamFPM, err)
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		return fmt.Errorf("trace: verify: read %s: %w", streams.StreamFPM, err)
	}
	defer it.Stop()
	unblock := context.AfterFunc(ctx, it.Stop)
	defer unblock()
	keys := SubjectKeys{}
	read := 0
	for {
		raw, err := it.Next(jetstream.NextMaxWait(scanIdleWait))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, nats.ErrTimeout) {
				v.log.Warn("trace verify: stream read ended early: no message for a while", "stream", streams.StreamFPM, "read", read, "wait", scanIdleWait)
				break
			}
			return fmt.Errorf("trace: verify: read %s: %w", streams.StreamFPM, err)
		}
		md, err := raw.Metadata()
		if err != nil {
			return fmt.Errorf("trace: verify: read %s: %w", streams.StreamFPM, err)
		}
		if md.Sequence.Stream > v.lastSeq {
			break
		}
		read++
		if read%1000 == 0 {
			v.progress("stream", md.Sequence.Stream-v.firstSeq+1, v.lastSeq-v.firstSeq+1)
		}
		v.take(raw, md, keys, dead)
		if md.Sequence.Stream >= v.lastSeq || md.NumPending == 0 {
			break
		}
	}
	if v.lastSeq >= v.firstSeq && v.lastSeq > 0 {
		v.progress("stream", v.lastSeq-v.firstSeq+1, v.lastSeq-v.firstSeq+1)
	}
	v.log.Info("trace verify: stream read", "stream", streams.StreamFPM, "messages", read, "first_seq", v.firstSeq, "last_seq", v.lastSeq)
	return nil
}

// take files one stream message: its line's stream sequence, or a candidate.
func (v *verifier) take(raw jetstream.Msg, md *jetstream.MsgMetadata, keys SubjectKeys, dead map[string]int) {
	r, err := ParseRecord(raw, MsgMeta{Seq: md.Sequence.Stream, Stored: md.Timestamp}, v.cfg.ProducerID, keys)
	if err != nil {
		return // the writer rejects it: it never has a line
	}
	if len(dead) > 0 {
		if k := deadLetterKey(raw.Subject(), raw.Data()); dead[k] > 0 {
			dead[k]--
			return
		}
	}
	prefix := SegmentPrefix(v.cfg.OutputPath, r.Producer)
	p := v.byPrefix[prefix]
	if p == nil {
		return
	}
	id := IdentityOf(prefix, r.Key.Namespace, r.Key.Component, r.Producer, r.Observed, r.Body)
	if e := p.ids[id]; e != nil {
		e.seen++
		if e.next < len(e.lines) {
			li := e.lines[e.next]
			e.next++
			p.lines[li].seq = r.Seq
			p.started = true
			p.done = p.done || li == p.lastLine
			return
		}
	}
	if !p.started && p.head != nil && id == *p.head {
		// The first line, read from damaged bytes, is confirmed: the damaged region's lines begin here.
		p.started, p.headSeq = true, r.Seq
	}
	// Only messages between the first and the last line can be missing lines; later ones are the
	// writer's backlog.
	if !p.started || p.done || r.Observed > p.maxObserved+RecoverySlack.Milliseconds() {
		return
	}
	r.Body = bytes.Clone(r.Body)
	p.cands = append(p.cands, candidate{seq: r.Seq, rec: r})
}

// writerRejects counts the trace writer's dead letters by subject and body: those messages never got a
// line. No FPM_EVENTS stream: none.
func writerRejects(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	s, err := js.Stream(ctx, streams.StreamEvents)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("trace: verify: stream %s: %w", streams.StreamEvents, err)
	}
	subject := streams.ConsumerDeadLetterSubject(WriterName)
	n, err := streams.CountPending(ctx, s, subject, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil || n == 0 {
		return nil, err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		return nil, fmt.Errorf("trace: verify: read dead letters: %w", err)
	}
	out := map[string]int{}
	for read := uint64(0); read < n; {
		b, err := oc.Fetch(int(min(n-read, 1000)), jetstream.FetchMaxWait(scanIdleWait))
		if err != nil {
			return nil, fmt.Errorf("trace: verify: read dead letters: %w", err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			out[deadLetterKey(m.Headers().Get(streams.HeaderSubject), m.Data())]++
		}
		if b.Error() != nil && !errors.Is(b.Error(), nats.ErrTimeout) {
			return nil, fmt.Errorf("trace: verify: read dead letters: %w", b.Error())
		}
		if got == 0 {
			break // removed meanwhile
		}
		read += uint64(got)
	}
	return out, nil
}

func deadLetterKey(subject string, data []byte) string { return subject + "\x00" + string(data) }

// span is two matched lines (indices in vproducer.lines) with no matched line between them.
type span struct{ i, j int }

// heal matches what the stream holds to p's damage: order and duplicate findings, missing lines, and
// for each damaged region in a checked segment its Heal and, when the stream can restore it, an edit.
func (v *verifier) heal(p *vproducer) {
	var matched []int
	var seqs []uint64
	var prevSeq uint64
	prevIdx := -1
	for i := range p.lines {
		l := &p.lines[i]
		if !l.valid || l.salvaged {
			continue
		}
		if l.seq == 0 {
			p.notInStream++
			if e := p.ids[l.id]; e != nil && e.seen > 0 {
				v.duplicate(p, i, e)
			}
			continue
		}
		p.inStream++
		if l.full { // a sampled line is written when its key's interval ends: in key order, not the stream's
			if l.seq <= prevSeq {
				pl := &p.lines[prevIdx]
				v.addFinding(p, i, Finding{Kind: FindingOrder, Reason: fmt.Sprintf("its message is stream sequence %d, stored before the message of line %d of %s (sequence %d): the writer writes in stream order",
					l.seq, pl.lineNo, p.segs[pl.seg].Path, pl.seq)})
				p.orderBroken = true
			}
			if l.seq > prevSeq {
				prevSeq, prevIdx = l.seq, i
			}
		}
		matched = append(matched, i)
		seqs = append(seqs, l.seq)
	}
	groups := map[span][]candidate{}
	if !p.orderBroken {
		for _, c := range p.cands {
			k := sort.Search(len(seqs), func(x int) bool { return seqs[x] > c.seq })
			if k == len(seqs) || k == 0 && (p.headSeq == 0 || c.seq < p.headSeq) {
				continue
			}
			sp := span{-1, matched[k]} // k == 0: the confirmed first line's region, before any intact line
			if k > 0 {
				sp.i = matched[k-1]
			}
			groups[sp] = append(groups[sp], c)
		}
	}
	// The damaged regions, by the intact lines around them.
	type region struct {
		seg, piece int
		prev, next int // intact lines around it (-1, len(p.lines): none)
	}
	var regions []region
	inGap := map[span]int{}
	for si, s := range p.segs {
		for k, pc := range s.chk.pieces {
			if !pc.damaged {
				continue
			}
			at := s.firstLine + pc.first
			r := region{seg: si, piece: k, prev: -1, next: len(p.lines)}
			for i := at - 1; i >= 0; i-- {
				if !p.lines[i].salvaged {
					r.prev = i
					break
				}
			}
			for i := at + pc.n; i < len(p.lines); i++ {
				if !p.lines[i].salvaged {
					r.next = i
					break
				}
			}
			regions = append(regions, r)
			inGap[span{r.prev, r.next}]++
		}
	}
	// Missing lines: messages between two adjacent full-mode lines with no damage between them.
	spans := make([]span, 0, len(groups))
	for sp := range groups {
		spans = append(spans, sp)
	}
	slices.SortFunc(spans, func(x, y span) int { return x.i - y.i })
	for _, sp := range spans {
		cands := groups[sp]
		if inGap[sp] > 0 {
			continue
		}
		a, b := &p.lines[sp.i], &p.lines[sp.j]
		if !a.full || !b.full {
			continue // sampled mode: most messages have no line
		}
		adjacent := true
		for i := sp.i + 1; i < sp.j; i++ {
			adjacent = adjacent && p.lines[i].salvaged
		}
		if !adjacent && slices.ContainsFunc(regions, func(r region) bool { return r.prev >= sp.i && r.next <= sp.j }) {
			continue // the damage between them reports these messages
		}
		h := &heal{StreamAfter: a.seq, StreamBefore: b.seq, Lines: len(cands)}
		f := Finding{Kind: FindingMissing, Heal: h}
		d := v.deletedBetween(a.seq, b.seq)
		switch {
		case !adjacent:
			f.Reason = fmt.Sprintf("%d stream message(s) between the messages of line %d and line %d of %s have no line, around lines whose messages the stream does not hold",
				len(cands), a.lineNo, b.lineNo, p.segs[b.seg].Path)
			h.Status, h.Reason = HealUnknown, "where their lines belong cannot be told"
		case d != 0:
			f.Reason = fmt.Sprintf("%d stream message(s) between the messages of this line and line %d of %s have no line", len(cands), b.lineNo, p.segs[b.seg].Path)
			h.Status, h.Reason = HealIncomplete, fmt.Sprintf("stream sequence %d (and maybe more) between them was deleted: lines may be missing there too", d)
			h.Missing = v.missing(p, sp.i, sp.j, cands)
		default:
			f.Reason = fmt.Sprintf("%d stream message(s) between the messages of this line and line %d of %s have no line", len(cands), b.lineNo, p.segs[b.seg].Path)
			h.Status = HealRestorable
		}
		fi := v.addFinding(p, sp.i, f)
		if fi >= 0 && h.Status == HealRestorable {
			e := v.rebuild(p, a.seg, sp.i, sp.j, cands, nil, nil, h)
			e.after, e.finding = sp.i, fi
			p.segs[a.seg].edits = append(p.segs[a.seg].edits, e)
		}
	}
	for _, r := range regions {
		s := p.segs[r.seg]
		if !s.checked {
			continue
		}
		pc := s.chk.pieces[r.piece]
		h := &heal{}
		s.findings[pc.finding].Heal = h
		salvaged := p.lines[s.firstLine+pc.first : s.firstLine+pc.first+pc.n]
		sampled := false
		for i := range salvaged {
			sampled = sampled || salvaged[i].valid && !salvaged[i].full
		}
		var a, b *vline
		if r.prev >= 0 {
			a = &p.lines[r.prev]
			h.StreamAfter = a.seq
			sampled = sampled || a.valid && !a.full
		}
		if r.next < len(p.lines) {
			b = &p.lines[r.next]
			h.StreamBefore = b.seq
			sampled = sampled || b.valid && !b.full
		}
		held := groups[span{r.prev, r.next}]
		after := uint64(0) // the region's lines are the messages after this sequence
		if a != nil {
			after = a.seq
		} else if p.headSeq != 0 {
			after = p.headSeq - 1
		}
		switch {
		case !s.Regular:
			h.Status, h.Reason = HealUnknown, "not a regular file: what it holds is not read, and it is never rewritten"
		case sampled:
			h.Status, h.Reason = HealUnknown, "sampled mode: which messages had a line cannot be told from the stream"
		case p.orderBroken:
			h.Status, h.Reason = HealUnknown, "the producer's lines are not in stream order (see the order findings)"
		case a == nil && p.headSeq == 0:
			// With its first line read from the damaged bytes and in the stream, a region that
			// starts the producer's lines (its segments before were pruned) begins at that line.
			h.Status, h.Reason = HealUnknown, "no line before it, and no line read from it that the stream holds as its first: where its lines begin cannot be told"
		case b == nil:
			h.Status, h.Reason = HealUnknown, "no line after it: how many lines it held cannot be told (a writer rewrites the unacknowledged lines of a torn tail itself)"
		case a != nil && !a.valid || !b.valid:
			h.Status, h.Reason = HealUnknown, "a line next to it is not a valid trace line"
		case inGap[span{r.prev, r.next}] > 1:
			h.Status, h.Reason = HealUnknown, "several damaged regions without a line between them: which lines belong to which cannot be told"
		case a != nil && a.seq == 0 || b.seq == 0:
			h.Status, h.Reason = HealIncomplete, "the stream no longer holds the message of the line before or after it"
			held = v.heldAround(p, groups, r.prev, r.next)
		case v.deletedBetween(after, b.seq) != 0:
			h.Status, h.Reason = HealIncomplete, fmt.Sprintf("stream sequence %d (and maybe more) between the lines around it was deleted", v.deletedBetween(after, b.seq))
		default:
			h.Status = HealRestorable
			e := v.rebuild(p, r.seg, r.prev, r.next, held, salvaged, pc.trailer, h)
			e.piece, e.finding = r.piece, pc.finding
			s.edits = append(s.edits, e)
			continue
		}
		if h.Status == HealIncomplete || a != nil && b == nil && !sampled {
			h.Lines = len(held)
			h.Missing = v.missing(p, r.prev, r.next, held)
		}
		h.Unconfirmed = v.unconfirmed(p, salvaged, held)
	}
}

// duplicate reports line i of p, a copy of an earlier line whose messages the earlier lines of its
// identity account for (e), and plans its removal: the first lines of an identity are the ones
// matched to its messages, so the copy goes and the line it repeats stays where the writer put it. A
// timestamp-order finding on the copy's own line (a copy written later, with an earlier timestamp) is
// resolved with it. A copy in a producer's newest segment that is not checked (a writer may be
// appending to it) is reported all the same — a writer writes a line at most once per message, so it
// is no line in progress — and left alone.
func (v *verifier) duplicate(p *vproducer, i int, e *idLines) {
	l := &p.lines[i]
	s := p.segs[l.seg]
	first := &p.lines[e.lines[0]]
	f := Finding{Kind: FindingDuplicate, Segment: s.Path, Offset: l.member, Line: l.lineNo,
		Reason: fmt.Sprintf("the same line as line %d of %s: the stream holds %d message(s) of it for %d line(s)", first.lineNo, p.segs[first.seg].Path, e.seen, len(e.lines)),
		Heal:   &heal{Status: HealRestorable, Reason: "a copy: removed, the line it repeats stays"}}
	if !s.checked {
		f.Heal = &heal{Status: HealUnknown, Reason: "in the producer's newest segment, which a running writer may be appending to: " +
			"--repair removes it with --include-active, only while no writer writes the output"}
		s.findings = append(s.findings, f)
		return
	}
	s.findings = append(s.findings, f)
	ed := edit{piece: -1, after: -1, remove: i, finding: len(s.findings) - 1}
	for k := range s.findings {
		if o := &s.findings[k]; o.Kind == FindingOrder && o.Line == l.lineNo && o.Heal == nil {
			o.Heal = &heal{Status: HealRestorable, Reason: "the line is a copy (see the duplicate finding): removed with it"}
			ed.also = append(ed.also, k)
		}
	}
	s.edits = append(s.edits, ed)
}

// addFinding adds f about line i of p to that line's segment, if it is checked, and returns its index
// there (-1: not added).
func (v *verifier) addFinding(p *vproducer, i int, f Finding) int {
	l := &p.lines[i]
	s := p.segs[l.seg]
	if !s.checked {
		return -1
	}
	f.Segment, f.Offset, f.Line = s.Path, l.member, l.lineNo
	s.findings = append(s.findings, f)
	return len(s.findings) - 1
}

// deletedBetween returns a stream sequence strictly between a and b that the stream deleted (an
// interior delete), or 0.
func (v *verifier) deletedBetween(a, b uint64) uint64 {
	k, _ := slices.BinarySearch(v.deleted, a+1)
	if k < len(v.deleted) && v.deleted[k] < b {
		return v.deleted[k]
	}
	return 0
}

// heldAround returns the candidates of the spans that enclose the intact lines prev and next: the
// messages the stream still holds around damage whose own neighbours it lost.
func (v *verifier) heldAround(p *vproducer, groups map[span][]candidate, prev, next int) []candidate {
	var out []candidate
	for sp, cands := range groups {
		if sp.i <= prev && sp.j >= next {
			out = append(out, cands...)
		}
	}
	slices.SortFunc(out, func(x, y candidate) int { return int(min(max(int64(x.seq)-int64(y.seq), -1), 1)) })
	return out
}

// lookupKey is the keyTable index of a message's key, or -1.
func (v *verifier) lookupKey(r *Record) int32 {
	if i, ok := v.keys.ids[keyID{r.Key.Namespace, r.Key.Component, r.Producer, r.FPM.WorkerID, r.FPM.DPRank}]; ok {
		return i
	}
	return -1
}

// missingScan bounds how far missing looks for a key's lines around damage.
const missingScan = 1 << 20

// missing lists, per key of p, the counter_ids between the key's last valid intact line before
// line prev (inclusive) and its first after line next (inclusive) that neither a line nor a held
// message has.
func (v *verifier) missing(p *vproducer, prev, next int, held []candidate) []missingLines {
	type bound struct {
		counter, observed int64
		ok                bool
	}
	before, after := map[int32]bound{}, map[int32]bound{}
	for i, n := prev, 0; i >= 0 && n < missingScan; i, n = i-1, n+1 {
		if l := &p.lines[i]; l.valid && !l.salvaged {
			if _, ok := before[l.key]; !ok {
				before[l.key] = bound{l.counter, l.id.observed, true}
			}
		}
	}
	for i, n := next, 0; i >= 0 && i < len(p.lines) && n < missingScan; i, n = i+1, n+1 {
		if l := &p.lines[i]; l.valid && !l.salvaged {
			if _, ok := after[l.key]; !ok {
				after[l.key] = bound{l.counter, l.id.observed, true}
			}
		}
	}
	covered := map[int32][]int64{}
	for i := max(prev+1, 0); i < min(next, len(p.lines)); i++ {
		if l := &p.lines[i]; l.valid {
			covered[l.key] = append(covered[l.key], l.counter)
		}
	}
	for _, c := range held {
		if k := v.lookupKey(&c.rec); k >= 0 {
			covered[k] = append(covered[k], c.rec.FPM.CounterID)
		}
	}
	var keys []int32
	for k := range before {
		keys = append(keys, k)
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []missingLines
	for _, k := range keys {
		id := v.keys.keys[k]
		b, a := before[k], after[k]
		m := missingLines{Namespace: id.namespace, Component: id.component, ProducerID: id.producer, WorkerID: id.worker, DPRank: id.rank,
			CounterFrom: -1, CounterTo: -1, ObservedAfterMs: b.observed, ObservedBeforeMs: a.observed}
		if b.ok {
			m.CounterFrom = b.counter + 1
		}
		if a.ok {
			m.CounterTo = a.counter - 1
		}
		if !b.ok || !a.ok {
			out = append(out, m)
			continue
		}
		have := covered[k]
		slices.Sort(have)
		from := m.CounterFrom
		for _, c := range have {
			if c < from || c > m.CounterTo {
				continue
			}
			if c > from {
				r := m
				r.CounterFrom, r.CounterTo = from, c-1
				out = append(out, r)
			}
			from = c + 1
		}
		if from <= m.CounterTo {
			r := m
			r.CounterFrom = from
			out = append(out, r)
		}
	}
	return out
}

// unconfirmed lists the valid lines read from damaged bytes that no held message confirms.
func (v *verifier) unconfirmed(p *vproducer, salvaged []vline, held []candidate) []lineID {
	ids := map[LineIdentity]int{}
	for _, c := range held {
		ids[IdentityOf(p.prefix, c.rec.Key.Namespace, c.rec.Key.Component, c.rec.Producer, c.rec.Observed, c.rec.Body)]++
	}
	var out []lineID
	for i := range salvaged {
		l := &salvaged[i]
		if !l.valid {
			continue
		}
		if ids[l.id] > 0 {
			ids[l.id]--
			continue
		}
		k := v.keys.keys[l.key]
		out = append(out, lineID{Line: l.lineNo, Namespace: k.namespace, Component: k.component, ProducerID: k.producer,
			WorkerID: k.worker, DPRank: k.rank, CounterID: l.counter, ObservedAtMs: l.id.observed})
	}
	return out
}

// rebuild makes the lines of cands, which go between intact lines prev and next of p, in segment seg
// (the damaged region's, or prev's for missing lines), and fills h's counts. Timestamps
// (see verify.go): a line that salvaged holds, byte-identical once given its own timestamp, keeps that
// timestamp if it lies between its neighbours'; any other line gets the timestamp of the line before it
// in the segment (after it, when none is before), exact only when the lines around have the same. With
// trailer (a damaged member's last 8 bytes), the result is checked against its CRC-32 and size.
func (v *verifier) rebuild(p *vproducer, seg, prev, next int, cands []candidate, salvaged []vline, trailer []byte, h *heal) edit {
	lo, hi := int64(-1), int64(-1)
	for i := prev; i >= 0 && p.lines[i].seg == seg; i-- {
		if l := &p.lines[i]; l.valid && !l.salvaged {
			lo = l.ts
			break
		}
	}
	for i := next; i < len(p.lines) && p.lines[i].seg == seg; i++ {
		if l := &p.lines[i]; l.valid && !l.salvaged {
			hi = l.ts
			break
		}
	}
	read := map[LineIdentity][]*vline{}
	for i := range salvaged {
		if l := &salvaged[i]; l.valid {
			read[l.id] = append(read[l.id], l)
		}
	}
	known, last := lo, int64(-1) // a timestamp known not to be after the next line's; the last one given
	var content, buf []byte
	for i := range cands {
		c := &cands[i]
		id := IdentityOf(p.prefix, c.rec.Key.Namespace, c.rec.Key.Component, c.rec.Producer, c.rec.Observed, c.rec.Body)
		ts, exact := int64(-1), false
		if rs := read[id]; len(rs) > 0 {
			s := rs[0]
			read[id] = rs[1:]
			buf = AppendLine(buf[:0], &c.rec, s.ts, schemas.CaptureFull)
			if bytes.Equal(buf, s.raw) && s.ts >= max(known, last) && (hi < 0 || s.ts <= hi) {
				ts, exact, known = s.ts, true, s.ts
			}
		}
		if ts < 0 {
			switch {
			case known >= 0:
				ts = known
			case hi >= 0:
				ts = hi
			case prev >= 0:
				ts = max(p.lines[prev].ts, 0) // the line before, in the segment before
			default:
				ts = max(p.lines[next].ts, 0) // a region that starts the lines: the line after, in the segment after
			}
			ts = max(ts, last)
			exact = known >= 0 && known == hi
		}
		last = ts
		if exact {
			h.TimestampsExact++
		} else {
			h.TimestampsEstimated++
		}
		content = AppendLine(content, &c.rec, ts, schemas.CaptureFull)
		content = append(content, '\n')
	}
	h.Lines = len(cands)
	if len(trailer) == gzipTrailerLen && binary.LittleEndian.Uint32(trailer) == crc32.ChecksumIEEE(content) &&
		binary.LittleEndian.Uint32(trailer[4:]) == uint32(len(content)) {
		h.Verified = true
		h.TimestampsExact, h.TimestampsEstimated = len(cands), 0
	}
	return edit{piece: -1, after: -1, content: content, lines: len(cands)}
}
