package e2e

// The chaos checker: from what the run observed from the outside (each publisher run's own record of
// what it sent, the stream, the events, the trace outputs, and what the project's tools said), it
// computes per publisher key and run whether the promise held:
//
//   - sent = stored once + named: every message a run sent is in FPM exactly once, or named missing by
//     a gap event, a drop marker or a dead letter of its run; the messages a run sent after the last one
//     anything accounts for are an unknowable tail only when the run was killed or ended while ingest
//     was impaired; and a run's first numbers up to the last one stored of the run before are an
//     unknowable head only when the run began while no bridge that had seen the publisher ran (the
//     stated limit of bridge/epoch.go: a bridge's first run of a publisher is taken for the run
//     before going on, so a restart it never saw is named only above the old run's last number);
//   - nothing is stored that no run sent, and no gap event names a stored message or a number twice;
//   - stored = traced once (full mode): every stored message has exactly one line in the live trace,
//     and every backfill output holds its range of the stream exactly once;
//   - the tools agree with those figures: `gaps report` counts the messages stored and missing per
//     key, `trace verify --stream` finds the trace damaged exactly when the checker does, /healthz is ok
//     once everything healed and not ok throughout a full disk that lost FPMs, a second owner of a data
//     directory or trace output is refused, and the nats CLI counts the stream as the checker read it.
//
// It is pure: chaosCheck judges a chaosObserved, however it was made (TestChaosCheckerFindsPlanted
// feeds it made-up observations).

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// chaosObserved is everything a run observed.
type chaosObserved struct {
	shape     chaosShape
	runs      []*chaosRun
	faults    []chaosFault
	bridges   []chaosBridgeSpan
	seconds   []*chaosSecond
	notes     []string
	exits     []string
	settleErr string
	// unread says what of the streams could not be read (the server not answering): the checks on
	// stream contents are then not made.
	unread    string
	stored    []chaosStored
	gapEvents []gaps.Event
	markers   []streams.DropMarker
	// losses are the consumers' loss events: a segment the trace writer pruned by its retention names
	// the lines it held (cause pruned), which are then not missing from the trace.
	losses      []streams.ConsumerLoss
	deadLetters []chaosDeadLetter
	// cliCount is the message count of FPM per `nats stream info` (-1: not read).
	cliCount        int64
	report          *gaps.Report
	finalHealth     int
	finalHealthBody string
	health          []healthSample
	outputs         []chaosOutput
	malformed       []string
}

// chaosStored is one message of FPM.
type chaosStored struct {
	key       streams.Key
	seq       uint64
	epoch     int64
	recvMs    int64
	streamSeq uint64
	storedMs  int64 // when the stream stored it (the server's clock, which its duplicate window runs on)
	producer  string
	bridge    string
	body      []byte
}

type chaosDeadLetter struct {
	subject string
	header  nats.Header
}

// chaosOutput is one trace output: the live writer's or a backfill's.
type chaosOutput struct {
	name     string
	path     string
	backfill *chaosBackfill // nil for the live output
	lines    []*schemas.TraceLine
	verify   chaosVerify
}

// chaosVerify is what `trace verify --stream --include-active --json` said.
type chaosVerify struct {
	exit      int
	remaining int
	kinds     map[string]int
	err       string
}

// chaosViolation is one broken promise.
type chaosViolation struct {
	kind   string // what broke (see chaosViolationKinds)
	key    string // the publisher key, or "" for the pipeline as a whole
	detail string
}

func (v chaosViolation) String() string {
	if v.key == "" {
		return fmt.Sprintf("[%s] %s", v.kind, v.detail)
	}
	return fmt.Sprintf("[%s] %s: %s", v.kind, v.key, v.detail)
}

// chaosViolationKinds describes each kind, printed with a failing run.
var chaosViolationKinds = map[string]string{
	"lost":            "sent, neither stored nor named by any gap event, drop marker or dead letter of its run",
	"lost-tail":       "the last messages of a run that ended with the pipeline healthy: neither stored nor named",
	"duplicate":       "one message of one run stored more than once",
	"phantom":         "stored, but no run sent it",
	"false-gap":       "named missing by a gap event, yet stored",
	"named-twice":     "one number of one run named missing by two gap events",
	"trace-missing":   "stored (or in a backfill's range), but not in the trace output",
	"trace-duplicate": "more lines in the trace output than stored messages",
	"trace-phantom":   "a line in the trace output that no stored message (of its range) has",
	"report":          "gaps report disagrees with the checker's count",
	"verify":          "trace verify --stream disagrees with the checker",
	"healthz":         "/healthz disagrees with what the checker saw",
	"second-instance": "a second owner of a data directory or trace output was not refused",
	"settle":          "the pipeline did not settle after every fault was healed",
	"read":            "the observations themselves are inconsistent (a tool's output unreadable, the nats CLI counting otherwise)",
}

// chaosKeyFigures are the checker's own figures for one publisher key, over all its runs.
type chaosKeyFigures struct {
	runs, sent, stored, duplicates, named, tails, heads, lost, phantoms int
	pastWindow                                                          int // duplicates stored past the stream's duplicate window: its stated limit
}

// chaosMsgID is what a stored FPM's Nats-Msg-Id is made of (streams.FPMMsgID): its key, number,
// agreed epoch and payload.
type chaosMsgID struct {
	key   streams.Key
	seq   uint64
	epoch int64
	body  string
}

// identicalCopies says ms are copies of one FPM stored more than once (one epoch): the same line.
func identicalCopies(ms []chaosStored) bool {
	for _, m := range ms[1:] {
		if m.key != ms[0].key || m.seq != ms[0].seq || m.epoch != ms[0].epoch {
			return false
		}
	}
	return true
}

// chaosDuplicateWindow is the FPM stream's duplicate window: the harness declares the streams with
// fpmbus's defaults.
var chaosDuplicateWindow = streams.DefaultConfig().DuplicateWindow

// chaosResult is the checker's verdict.
type chaosResult struct {
	violations []chaosViolation
	figures    map[streams.Key]*chaosKeyFigures
}

// seqRanges prints numbers as compact ranges: 3-7,9,12-13.
func seqRanges(seqs []uint64) string {
	slices.Sort(seqs)
	seqs = slices.Compact(seqs)
	var b strings.Builder
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if b.Len() > 400 {
			fmt.Fprintf(&b, "… (%d numbers in all)", len(seqs))
			break
		}
		if i == j {
			fmt.Fprintf(&b, "%d", seqs[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", seqs[i], seqs[j])
		}
		i = j + 1
	}
	return b.String()
}

// sentBeforeReceivedSlackMs: a publisher writes a message's send time down around its send, so the
// bridge (same host, same clock) may stamp its receive a moment before that.
const sentBeforeReceivedSlackMs = 20

// naming is a range of numbers an event names missing.
type naming struct {
	epoch  int64
	lo, hi uint64
	id     string // the event's id, for gap events
	gap    bool   // a gap event (false: a drop marker or a dead letter)
	lost   bool   // the bridge's lost_after_ack
	cause  string // a gap event's cause
}

func (n naming) covers(q uint64) bool { return n.lo <= q && q <= n.hi }

// minusRanges is the numbers of ranges rs (inclusive) not in any of cut.
func minusRanges(rs, cut [][2]uint64) [][2]uint64 {
	for _, c := range cut {
		var out [][2]uint64
		for _, r := range rs {
			if c[1] < r[0] || c[0] > r[1] {
				out = append(out, r)
				continue
			}
			if c[0] > r[0] {
				out = append(out, [2]uint64{r[0], c[0] - 1})
			}
			if c[1] < r[1] {
				out = append(out, [2]uint64{c[1] + 1, r[1]})
			}
		}
		rs = out
	}
	return rs
}

// runKey is one publisher key's messages of one run.
type runKey struct {
	r *chaosRun
	k streams.Key
}

// chaosCheck judges o.
func chaosCheck(o *chaosObserved) *chaosResult {
	res := &chaosResult{figures: map[streams.Key]*chaosKeyFigures{}}
	add := func(kind string, k *streams.Key, format string, args ...any) {
		key := ""
		if k != nil {
			key = k.String()
		}
		res.violations = append(res.violations, chaosViolation{kind, key, fmt.Sprintf(format, args...)})
	}
	fig := func(k streams.Key) *chaosKeyFigures {
		f := res.figures[k]
		if f == nil {
			f = &chaosKeyFigures{}
			res.figures[k] = f
		}
		return f
	}

	if o.unread != "" {
		// Without the stream's contents there is nothing to count: what remains is whether the pipeline
		// came back and what the tools said.
		add("read", nil, "%s", strings.TrimPrefix(o.unread, "; "))
		chaosCheckPipeline(o, add)
		return res
	}

	// Runs per key, by start.
	runsOf := map[streams.Key][]*chaosRun{}
	for _, r := range o.runs {
		for k, sent := range r.sent {
			runsOf[k] = append(runsOf[k], r)
			fig(k).runs++
			fig(k).sent += len(sent)
		}
	}
	for _, rs := range runsOf {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].start.Before(rs[j].start) })
	}
	// runAt is the run of k that was live at Unix ms t: the latest to start at or before it.
	runAt := func(k streams.Key, t int64) *chaosRun {
		var at *chaosRun
		for _, r := range runsOf[k] {
			if r.start.UnixMilli() <= t {
				at = r
			}
		}
		return at
	}

	// Stored messages, attributed to the run that sent them: among the runs whose record has these
	// bytes at this number and that had sent it when the bridge received it, the one live when the
	// message's epoch began, else the one live when it was received, unless it has its copy already. (Runs of identical bytes are common: a run rerun with its seed, a
	// replayed recording; a later run cannot have sent what was received before it began, nor before
	// it sent that number: a bridge that lags receives the old run's last numbers after the rerun began.)
	count := map[runKey]map[uint64]int{}
	epochs := map[runKey]map[int64]bool{}
	// A copy with the epoch, number and bytes of one already attributed carries the same Nats-Msg-Id:
	// the same FPM stored again, never another run's that happens to have the same bytes.
	sameID := map[chaosMsgID]*chaosRun{}
	lastStoredMs := map[chaosMsgID]int64{}
	pastWindow := map[runKey]map[uint64]int{} // copies stored again after the server's window had let the id go
	stored := slices.Clone(o.stored)
	sort.SliceStable(stored, func(i, j int) bool { return stored[i].streamSeq < stored[j].streamSeq })
	phantoms := map[streams.Key][]string{}
	for _, m := range stored {
		id := chaosMsgID{m.key, m.seq, m.epoch, string(m.body)}
		if r := sameID[id]; r != nil {
			rk := runKey{r, m.key}
			count[rk][m.seq]++
			// The stream refuses an id it stored within its duplicate window (on its own clock, which
			// a paused server's socket backlog outlives): a copy stored at least that long after the
			// last copy is the stated limit of deduplication, counted by the gap detector as a
			// duplicate and not a violation.
			if m.storedMs-lastStoredMs[id] >= chaosDuplicateWindow.Milliseconds() {
				if pastWindow[rk] == nil {
					pastWindow[rk] = map[uint64]int{}
				}
				pastWindow[rk][m.seq]++
			}
			lastStoredMs[id] = m.storedMs
			continue
		}
		var cands []*chaosRun
		for _, r := range runsOf[m.key] {
			if s, ok := r.sent[m.key][m.seq]; ok && bytes.Equal(s.json, m.body) && r.start.UnixMilli() <= m.recvMs &&
				(s.sentAtMs == 0 || s.sentAtMs <= m.recvMs+sentBeforeReceivedSlackMs) {
				cands = append(cands, r)
			}
		}
		var pick *chaosRun
		live := runAt(m.key, m.recvMs)
		// The run live when the message's epoch began (a bridge's receive time of its run's first
		// message) first: a bridge whose reader stalled drains the old connection's last numbers after a
		// rerun of identical bytes sent them too, and it cannot have received the rerun's (it was not
		// connected to its socket yet); the epoch it stored them under is the old run's.
		if ep := runAt(m.key, m.epoch); ep != live && slices.Contains(cands, ep) && count[runKey{ep, m.key}][m.seq] == 0 {
			pick = ep
		}
		if pick == nil && slices.Contains(cands, live) && count[runKey{live, m.key}][m.seq] == 0 {
			pick = live
		}
		for i := len(cands) - 1; i >= 0 && pick == nil; i-- {
			if count[runKey{cands[i], m.key}][m.seq] == 0 {
				pick = cands[i]
			}
		}
		if pick == nil && len(cands) > 0 {
			pick = cands[len(cands)-1]
			if slices.Contains(cands, live) {
				pick = live
			}
		}
		if pick == nil && live != nil && live.killed {
			// A killed publisher's record misses the message in hand: sent, not yet written down.
			last, ok := maxSeq(live.sent[m.key])
			if (!ok && m.seq == 0) || (ok && m.seq == last+1) {
				pick = live
			}
		}
		if pick == nil {
			fig(m.key).phantoms++
			phantoms[m.key] = append(phantoms[m.key], fmt.Sprintf("seq %d (epoch %d, stream seq %d, bridge %s)", m.seq, m.epoch, m.streamSeq, m.bridge))
			continue
		}
		rk := runKey{pick, m.key}
		if count[rk] == nil {
			count[rk], epochs[rk] = map[uint64]int{}, map[int64]bool{}
		}
		count[rk][m.seq]++
		epochs[rk][m.epoch] = true
		sameID[id], lastStoredMs[id] = pick, m.storedMs
	}
	for k, ps := range phantoms {
		add("phantom", &k, "%d stored messages no run sent: %s", len(ps), strings.Join(ps[:min(len(ps), 8)], "; "))
	}

	// What the events name missing, per key.
	// A recovered event takes back numbers its gap event named: copies stored after the event.
	names := map[streams.Key][]naming{}
	recovered := map[string][][2]uint64{} // gap event id -> numbers taken back
	for _, e := range o.gapEvents {
		if e.Type == gaps.TypeRecovered {
			recovered[e.Recovers] = append(recovered[e.Recovers], gapRanges(e)...)
		}
	}
	for _, e := range o.gapEvents {
		if e.Type != gaps.TypeGap {
			continue
		}
		for _, rg := range minusRanges(gapRanges(e), recovered[e.ID]) {
			names[e.Key] = append(names[e.Key], naming{epoch: e.Epoch, lo: rg[0], hi: rg[1], id: e.ID, gap: true, lost: e.Cause == streams.GapCauseLostAfterAck, cause: e.Cause})
		}
	}
	for _, dm := range o.markers {
		names[dm.Key] = append(names[dm.Key], naming{epoch: dm.Epoch, lo: dm.FirstSeq, hi: dm.LastSeq, id: "marker " + dm.Reason})
	}
	for _, dl := range o.deadLetters {
		tok := strings.Split(dl.subject, ".")
		seq, err1 := strconv.ParseUint(dl.header.Get(streams.HeaderSeq), 10, 64)
		rank, err2 := strconv.Atoi(dl.header.Get(streams.HeaderDPRank))
		worker := dl.header.Get(streams.HeaderWorkerID)
		epoch, _ := strconv.ParseInt(dl.header.Get(streams.HeaderEpoch), 10, 64)
		if len(tok) != 5 || err1 != nil || err2 != nil || worker == "" {
			continue // a dead letter of bytes that never were an FPM of a key
		}
		k := streams.Key{Namespace: tok[2], Component: tok[3], WorkerID: worker, DPRank: rank}
		names[k] = append(names[k], naming{epoch: epoch, lo: seq, hi: seq, id: "dead letter"})
	}
	// A naming belongs to run r when its epoch is one under which r's messages were stored, or r was
	// the key's live run at the epoch's time (an epoch is a receive time of the run's first message).
	applies := func(n naming, r *chaosRun, k streams.Key) bool {
		return epochs[runKey{r, k}][n.epoch] || runAt(k, n.epoch) == r
	}

	// Per key and run: sent = stored once + named.
	keys := slices.SortedFunc(maps.Keys(runsOf), func(a, b streams.Key) int { return strings.Compare(a.String(), b.String()) })
	missingOf := map[streams.Key]int{}
	for _, k := range keys {
		f := fig(k)
		for i, r := range runsOf[k] {
			rk := runKey{r, k}
			var dups, falseGaps, twice, unaccounted []uint64
			var dupDetail, falseIDs []string
			maxAcc, anyAcc := uint64(0), false
			headTo, head := headExcuse(o, k, runsOf[k][:i], r, count)
			seqs := slices.Sorted(maps.Keys(r.sent[k]))
			for _, q := range seqs {
				c := count[rk][q]
				var gapIDs []string
				named := false
				for _, n := range names[k] {
					if n.covers(q) && applies(n, r, k) {
						named = true
						if n.gap && !n.lost && !slices.Contains(gapIDs, n.id) {
							gapIDs = append(gapIDs, n.id)
						}
						if n.gap && c > 0 {
							falseGaps = append(falseGaps, q)
							if !slices.Contains(falseIDs, n.id) && len(falseIDs) < 4 {
								falseIDs = append(falseIDs, n.id)
							}
						}
					}
				}
				if len(gapIDs) > 1 {
					twice = append(twice, q)
				}
				switch {
				case c > 1 && c-1 == pastWindow[rk][q]:
					f.stored++
					f.duplicates += c - 1
					f.pastWindow += c - 1
				case c > 1:
					dups = append(dups, q)
					if len(dupDetail) < 4 {
						dupDetail = append(dupDetail, fmt.Sprintf("seq %d ×%d", q, c))
					}
					f.stored++
					f.duplicates += c - 1
				case c == 1:
					f.stored++
				case named:
					f.named++
					missingOf[k]++
				case head && q <= headTo:
					f.heads++
					continue
				default:
					unaccounted = append(unaccounted, q)
					continue
				}
				maxAcc, anyAcc = q, true
			}
			var lost, tail []uint64
			for _, q := range unaccounted {
				if anyAcc && q < maxAcc {
					lost = append(lost, q)
				} else {
					tail = append(tail, q)
				}
			}
			desc := fmt.Sprintf("%s run %d (seed %d, %s–%s, %s)", r.kind, r.id, r.seed, r.start.Format("15:04:05.000"), r.end.Format("15:04:05.000"), r.status)
			if len(tail) > 0 {
				switch {
				case tailExcuse(o, r) != "":
					f.tails += len(tail)
				case !anyAcc:
					f.lost += len(tail)
					missingOf[k] += len(tail)
					add("lost", &k, "%s: none of its %d messages stored or named, although it ended with the pipeline healthy: seqs %s", desc, len(tail), seqRanges(tail))
				default:
					f.lost += len(tail)
					missingOf[k] += len(tail)
					add("lost-tail", &k, "%s: %d of its last messages neither stored nor named, although it ended with the pipeline healthy: seqs %s", desc, len(tail), seqRanges(tail))
				}
			}
			if len(lost) > 0 {
				f.lost += len(lost)
				missingOf[k] += len(lost)
				add("lost", &k, "%s: %d messages neither stored nor named (%d of the run's %d stored)%s: seqs %s", desc, len(lost), len(count[rk]), len(seqs), elsewhere(names[k], lost, r, k, applies), seqRanges(lost))
			}
			if len(dups) > 0 {
				add("duplicate", &k, "%s: %d messages stored more than once (%s): seqs %s", desc, len(dups), strings.Join(dupDetail, ", "), seqRanges(dups))
			}
			if len(falseGaps) > 0 {
				add("false-gap", &k, "%s: %d stored messages named missing by gap events (%s): seqs %s", desc, len(falseGaps), strings.Join(falseIDs, ", "), seqRanges(falseGaps))
			}
			if len(twice) > 0 {
				add("named-twice", &k, "%s: %d numbers named missing by two gap events: seqs %s", desc, len(twice), seqRanges(twice))
			}
		}
	}

	// gaps report per key: the messages stored and the numbers missing, as the checker counts them.
	if o.report != nil {
		// The detector counts each number once per epoch (a copy stored again is its duplicate).
		storedOf := map[streams.Key]int{}
		counted := map[chaosMsgID]bool{}
		for _, m := range o.stored {
			if id := (chaosMsgID{m.key, m.seq, m.epoch, ""}); !counted[id] {
				counted[id] = true
				storedOf[m.key]++
			}
		}
		for _, k := range keys {
			var line *gaps.PublisherReport
			for i := range o.report.Publishers {
				if o.report.Publishers[i].Key == k {
					line = &o.report.Publishers[i]
				}
			}
			if line == nil {
				if storedOf[k] > 0 || missingOf[k] > 0 {
					add("report", &k, "gaps report has no line for it; the checker counts %d stored, %d missing", storedOf[k], missingOf[k])
				}
				continue
			}
			if int(line.Messages) != storedOf[k] {
				add("report", &k, "gaps report counts %d messages, the stream holds %d (numbers per epoch)", line.Messages, storedOf[k])
			}
			if int(line.MissingTotal) != missingOf[k] {
				add("report", &k, "gaps report counts %d missing (%.3f %%), the checker %d (sent, not stored, not an unknowable tail)", line.MissingTotal, line.LossPercent, missingOf[k])
			}
		}
	}

	// stored = traced once, per output.
	for _, out := range o.outputs {
		if b := out.backfill; b != nil {
			ok := len(b.statuses) == len(b.procs)
			for _, st := range b.statuses {
				ok = ok && st == "exit 0"
			}
			if !ok {
				o.notes = append(o.notes, fmt.Sprintf("%s not checked: its runs ended %v", out.name, b.statuses))
				continue
			}
		}
		type id struct {
			producer string
			recv     int64
			body     string
		}
		want := map[id][]chaosStored{}
		for _, m := range o.stored {
			if b := out.backfill; b != nil && (m.streamSeq < b.startSeq || m.streamSeq > b.endSeq) {
				continue
			}
			i := id{m.producer, m.recvMs, string(m.body)}
			want[i] = append(want[i], m)
		}
		got := map[id]int{}
		for _, l := range out.lines {
			got[id{l.Event.Source.ProducerID, l.Event.ObservedAtUnixMs, string(l.Event.FPM)}]++
		}
		missing, doubled := map[streams.Key][]uint64{}, map[streams.Key][]uint64{}
		problems, prunedNamed := 0, 0
		for i, ms := range want {
			n := got[i]
			switch {
			case n < len(ms) && n > 0 && identicalCopies(ms):
				// Copies of one FPM with one receive time make the same line, which a restarted writer
				// finds on disk and does not write again: one line is the trace of all of them (the
				// copies themselves are judged above).
			case n < len(ms):
				for _, m := range ms[n:] {
					if out.backfill == nil && o.prunedFromLiveTrace(m) {
						prunedNamed++
						continue
					}
					missing[m.key] = append(missing[m.key], m.seq)
					problems++
				}
			case n > len(ms):
				doubled[ms[0].key] = append(doubled[ms[0].key], ms[0].seq)
				problems += n - len(ms)
			}
		}
		phantomLines := 0
		for i, n := range got {
			if len(want[i]) == 0 {
				phantomLines += n
			}
		}
		problems += phantomLines
		for _, k := range slices.SortedFunc(maps.Keys(missing), func(a, b streams.Key) int { return strings.Compare(a.String(), b.String()) }) {
			add("trace-missing", &k, "%s (%s): %d stored messages have no line: seqs %s", out.name, out.path, len(missing[k]), seqRanges(missing[k]))
		}
		for _, k := range slices.SortedFunc(maps.Keys(doubled), func(a, b streams.Key) int { return strings.Compare(a.String(), b.String()) }) {
			add("trace-duplicate", &k, "%s (%s): %d stored messages have more than one line: seqs %s", out.name, out.path, len(doubled[k]), seqRanges(doubled[k]))
		}
		if prunedNamed > 0 {
			o.notes = append(o.notes, fmt.Sprintf("%s: %d stored messages have no line, named by the trace writer's pruned-segment loss events", out.name, prunedNamed))
		}
		if phantomLines > 0 {
			add("trace-phantom", nil, "%s (%s): %d lines match no stored message", out.name, out.path, phantomLines)
		}
		v := out.verify
		switch {
		case v.err != "":
			add("verify", nil, "%s: trace verify --stream gave no report: %s", out.name, v.err)
		case problems > 0 && v.exit == 0:
			add("verify", nil, "%s: trace verify --stream --include-active exits 0 (findings %v), but the checker finds %d lines missing, doubled or unknown", out.name, v.kinds, problems)
		case problems == 0 && v.exit != 0:
			add("verify", nil, "%s: trace verify --stream --include-active exits %d with findings %v (%d remaining), but the checker finds every stored message traced once", out.name, v.exit, v.kinds, v.remaining)
		}
	}

	// /healthz: ok once everything healed; not ok at some point of a full disk that cost FPMs. An FPM
	// sent while `up` itself was stopped or restarting is lost to that (its gap names it), whatever the
	// disk did, and /healthz is answered by whichever incarnation is up: only FPMs the full disk alone
	// can have cost count here.
	otherFault := func(ms int64) bool {
		for _, f := range o.faults {
			if f.what != "disk" && ingest(f.what) && ms >= f.start.UnixMilli() && ms < f.end.UnixMilli() {
				return true
			}
		}
		return false
	}
	// What a full disk cannot cost: the first numbers of a run sent before any bridge was subscribed
	// (named late_start, or by the run's publisher_restart or reconnect event) are lost to the
	// publisher starting first, disk or not.
	diskCost := func(r *chaosRun, k streams.Key, q uint64) bool {
		for _, n := range names[k] {
			if n.covers(q) && applies(n, r, k) && (n.cause == gaps.CauseLateStart || n.cause == gaps.CausePublisherRestart || n.cause == "reconnect") {
				return false
			}
		}
		return true
	}
	if o.shape == shapeUp {
		for _, fw := range o.faults {
			if fw.what != "disk" {
				continue
			}
			lostDuring := 0
			for _, r := range o.runs {
				for k, sent := range r.sent {
					for q, s := range sent {
						if s.sentAtMs >= fw.start.UnixMilli() && s.sentAtMs < fw.end.UnixMilli() && count[runKey{r, k}][q] == 0 && !otherFault(s.sentAtMs) &&
							diskCost(r, k, q) {
							lostDuring++
						}
					}
				}
			}
			samples, ok := 0, 0
			for _, h := range o.health {
				if !h.at.Before(fw.start) && !h.at.After(fw.end) {
					samples++
					if h.code == 200 {
						ok++
					}
				}
			}
			if lostDuring > 0 && samples > 0 && ok == samples {
				add("healthz", nil, "the disk was full %s–%s and %d FPMs sent then were not stored, but all %d /healthz answers in that time were 200",
					fw.start.Format("15:04:05.000"), fw.end.Format("15:04:05.000"), lostDuring, samples)
			}
		}
	}
	chaosCheckPipeline(o, add)
	return res
}

// chaosCheckPipeline judges what does not depend on the stream's contents: the second owners, the
// recovery, the final /healthz, the observations' own consistency.
func chaosCheckPipeline(o *chaosObserved, add func(kind string, k *streams.Key, format string, args ...any)) {
	if o.shape == shapeUp && o.finalHealth != 200 {
		add("healthz", nil, "/healthz answers %d after every fault was healed and the pipeline settled: %s", o.finalHealth, o.finalHealthBody)
	}
	for _, sc := range o.seconds {
		if !sc.refused && !sc.onlyOwner() { // not an owner, or not judged
			add("second-instance", nil, "a second owner started at %s was not refused: %s", sc.at.Format("15:04:05.000"), sc.status)
		}
	}
	if o.settleErr != "" {
		add("settle", nil, "%s", o.settleErr)
	}
	if o.cliCount >= 0 && o.cliCount != int64(len(o.stored)) {
		add("read", nil, "nats stream info counts %d messages in FPM, the checker read %d", o.cliCount, len(o.stored))
	}
	for _, m := range o.malformed {
		add("read", nil, "%s", m)
	}
}

// prunedFromLiveTrace reports whether m's line was in a segment the trace writer pruned by its
// retention, as a loss event (cause pruned) names it: by stream sequence when the event has them, else
// by the producer and the observation times the segment held.
func (o *chaosObserved) prunedFromLiveTrace(m chaosStored) bool {
	for _, l := range o.losses {
		if l.Cause != streams.LossPruned || l.Producer != m.producer {
			continue
		}
		if l.First > 0 && l.Last >= l.First {
			if m.streamSeq >= l.First && m.streamSeq <= l.Last {
				return true
			}
			continue
		}
		if l.FirstObservedMs > 0 && m.recvMs >= l.FirstObservedMs && m.recvMs <= l.LastObservedMs {
			return true
		}
	}
	return false
}

// elsewhere names the events that cover some of seqs under an epoch of another run of k: a loss named,
// but in the wrong run's account.
func elsewhere(ns []naming, seqs []uint64, r *chaosRun, k streams.Key, applies func(naming, *chaosRun, streams.Key) bool) string {
	var ids []string
	for _, n := range ns {
		if applies(n, r, k) || slices.Contains(ids, n.id) {
			continue
		}
		for _, q := range seqs {
			if n.covers(q) {
				ids = append(ids, fmt.Sprintf("%s (epoch %d)", n.id, n.epoch))
				break
			}
		}
	}
	if len(ids) == 0 {
		return ""
	}
	return "; named only under other runs' epochs by " + strings.Join(ids[:min(len(ids), 4)], ", ")
}

// headExcuse reports whether r's first numbers up to headTo are unknowable: r began while no bridge
// process that had stored anything of k was running (none ran, or each had only just started), or
// each that was running was killed (SIGKILL) before it stored anything received from r's start on
// (what it saw of the restart died with it: nothing of it was stored, recorded or spooled) or was
// told to stop before r sent its first message of k and stored nothing of k from r's start on (it
// stopped reading then: it never saw r), or was paused (SIGSTOP) or down when r sent its first message
// of k and stored nothing of k received from r's start until it ran again (a rerun is a new process:
// the paused bridge's connection to the old one is gone, and it meets r, if at all, on a new one,
// further on), and
// headTo is the last number stored of the runs before (earlier, oldest first). The first bridge to
// receive r then takes it for its first run of k and the run before going on (bridge/epoch.go): it
// names the numbers above that last one, and those up to it cannot be told from the old run's.
func headExcuse(o *chaosObserved, k streams.Key, earlier []*chaosRun, r *chaosRun, count map[runKey]map[uint64]int) (headTo uint64, ok bool) {
	for i := len(earlier) - 1; i >= 0 && !ok; i-- {
		for q := range count[runKey{earlier[i], k}] {
			headTo, ok = max(headTo, q), true
		}
	}
	if !ok {
		return 0, false
	}
	at := r.start.UnixMilli()
	firstSent := int64(math.MaxInt64)
	for _, m := range r.sent[k] {
		firstSent = min(firstSent, m.sentAtMs)
	}
	for _, s := range o.bridges {
		if s.start.After(r.start) || (!s.end.IsZero() && s.end.Before(r.start)) {
			continue
		}
		mine := func(m chaosStored) bool { return m.bridge == s.id || s.id == "" && m.bridge != "chaos-b2" }
		deaf := s.killed || !s.stopped.IsZero() && s.stopped.UnixMilli() < firstSent
		if deaf && !slices.ContainsFunc(o.stored, func(m chaosStored) bool {
			return m.key == k && m.recvMs >= at && m.recvMs < s.end.UnixMilli() && mine(m)
		}) {
			continue // killed, or stopped, before it stored anything of r: it knew nothing of the restart
		}
		if healed, ok := o.pausedAt(s, firstSent); ok && !slices.ContainsFunc(o.stored, func(m chaosStored) bool {
			return m.key == k && m.recvMs >= at && m.recvMs < healed && mine(m)
		}) {
			continue // paused or down when r began, and nothing of r stored from before it ran again
		}
		for _, m := range o.stored {
			if m.key == k && m.recvMs >= s.start.UnixMilli() && m.recvMs < at && mine(m) {
				return 0, false // a bridge that knew the publisher ran when r began: it saw the restart
			}
		}
	}
	return headTo, true
}

// pausedAt reports whether bridge span s's component (`up`'s own bridge, or the split shape's bridge;
// not the redundant one, which is only started and stopped) was paused or down at ms by a fault
// window, and when it was healed (the window's end less faultHealPad).
func (o *chaosObserved) pausedAt(s chaosBridgeSpan, ms int64) (healed int64, ok bool) {
	comp := map[string]string{"": "up", "chaos-b1": "bridge"}[s.id]
	for _, f := range o.faults {
		if comp != "" && f.what == comp && f.start.UnixMilli() <= ms && ms < f.end.Add(-faultHealPad).UnixMilli() {
			return f.end.Add(-faultHealPad).UnixMilli(), true
		}
	}
	return 0, false
}

// tailExcuse says why r's last messages may be lost unknowably ("" if nothing does): it was killed, or
// it ended while ingest was impaired (nothing after its last accounted message could say it existed).
func tailExcuse(o *chaosObserved, r *chaosRun) string {
	if r.killed {
		return "killed"
	}
	for _, f := range o.faults {
		if !r.end.Before(f.start) && !r.end.After(f.end) {
			return "ended during " + f.what
		}
	}
	// Held by a bridge that could not store it (/healthz not ok while the run was sent) and was
	// killed within faultHealPad of the run's end: what a killed bridge holds in memory is lost with
	// it, and a run that ended before its next FPM has nothing that could reveal its numbers.
	for _, s := range o.bridges {
		if s.killed && !s.end.Before(r.end) && s.end.Sub(r.end) <= faultHealPad && o.unhealthyDuring(r.start, r.end) {
			return "held by a bridge that could not store it, killed"
		}
	}
	return ""
}

// unhealthyDuring reports whether /healthz answered anything but 200 (or nothing) from from to to.
func (o *chaosObserved) unhealthyDuring(from, to time.Time) bool {
	for _, h := range o.health {
		if !h.at.Before(from) && !h.at.After(to) && h.code != 200 {
			return true
		}
	}
	return false
}

func maxSeq(m map[uint64]sentFPM) (uint64, bool) {
	if len(m) == 0 {
		return 0, false
	}
	return slices.Max(slices.Collect(maps.Keys(m))), true
}

// describe prints the verdict: per key the checker's figures, then every violation with what its kind
// means.
func (res *chaosResult) describe() string {
	var b strings.Builder
	b.WriteString("per key: runs, sent, stored (distinct), duplicate copies (of them stored past the duplicate window: its stated limit), named missing, unknowable tail, unknowable head, lost, phantom\n")
	for _, k := range slices.SortedFunc(maps.Keys(res.figures), func(a, b streams.Key) int { return strings.Compare(a.String(), b.String()) }) {
		f := res.figures[k]
		fmt.Fprintf(&b, "  %-40s runs %d sent %d stored %d dup %d (%d) named %d tail %d head %d lost %d phantom %d\n", k, f.runs, f.sent, f.stored, f.duplicates, f.pastWindow, f.named, f.tails, f.heads, f.lost, f.phantoms)
	}
	if len(res.violations) == 0 {
		b.WriteString("no violations\n")
		return b.String()
	}
	fmt.Fprintf(&b, "%d violations:\n", len(res.violations))
	kinds := map[string]bool{}
	for _, v := range res.violations {
		b.WriteString("  " + v.String() + "\n")
		kinds[v.kind] = true
	}
	b.WriteString("kinds:\n")
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		fmt.Fprintf(&b, "  %-16s %s\n", k, chaosViolationKinds[k])
	}
	return b.String()
}
