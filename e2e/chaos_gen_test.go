package e2e

// The chaos checker's generator: from a seed, a schedule of operations and faults against a pipeline of
// real processes. It is pure (no processes, no clock): the same seed, duration and set of operation
// classes give the same schedule, printed before it runs, so that a failing run is reproduced by its
// seed. The executor (chaos_run_test.go) carries the schedule out; the checker (chaos_check_test.go)
// judges what came out of it.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// chaosShape is how the pipeline under test is laid out.
type chaosShape string

const (
	// shapeUp is `fpmbus up` alone (embedded server, bridge, trace writer, gap detector in one process),
	// with its /healthz; faults hit the whole process.
	shapeUp chaosShape = "up"
	// shapeSplit is a real nats-server and `fpmbus bridge`, `fpmbus trace` and `fpmbus gaps` as
	// processes of their own, so that each one can be killed or frozen alone.
	shapeSplit chaosShape = "split"
)

// The components a fault can hit, per shape.
var chaosComponents = map[chaosShape][]string{
	shapeUp:    {"up"},
	shapeSplit: {"server", "bridge", "trace", "gaps"},
}

// chaosClasses are the operation classes, each of which can be switched on or off (FPMBUS_CHAOS_OPS).
// A fault class is named by what it does and the component it hits ("kill9-bridge"); a prefix of a
// name that is no class itself switches on every class it starts ("kill9" is every kill9-…, "pub" every
// pub-…, but "backfill" is backfill alone).
var chaosClasses = []chaosClass{
	{"pub-stop", "stop a publisher with SIGINT (it flushes) and start it again later with a seed it never used (with pub-rerun on: half the time with its last seed)", nil},
	{"pub-kill", "kill -9 a publisher, start it again later", nil},
	{"pub-rerun", "stop a publisher and start it at once with the same seed: a second run of identical payloads", nil},
	{"pub-nowait", "start publishers (half of the restarts) without --wait-subscribers, as Dynamo's start: what they send before the bridge's subscription joins is lost", nil},
	{"replay", "trace replay --to zmq of a recording, waiting for the bridge's subscription; again later: identical payloads", nil},
	{"replay-nowait", "trace replay --to zmq without --wait-subscribers and without a start delay", nil},
	{"backfill", "trace backfill of the stream so far into a new output", nil},
	{"backfill-rerun", "trace backfill of an earlier backfill's range into that same output again", nil},
	{"kill9-up", "kill -9 fpmbus up, start it again after a while", []chaosShape{shapeUp}},
	{"pause-up", "SIGSTOP fpmbus up, SIGCONT after a while", []chaosShape{shapeUp}},
	{"restart-up", "stop fpmbus up with SIGTERM and start it again", []chaosShape{shapeUp}},
	{"second-up", "start a second fpmbus up on the data directory in use: it must be refused", []chaosShape{shapeUp}},
	{"kill9-server", "kill -9 nats-server, start it again on its store after a while", []chaosShape{shapeSplit}},
	{"kill9-bridge", "kill -9 the bridge, start it again after a while", []chaosShape{shapeSplit}},
	{"kill9-trace", "kill -9 the trace writer, start it again after a while", []chaosShape{shapeSplit}},
	{"kill9-gaps", "kill -9 the gap detector, start it again after a while", []chaosShape{shapeSplit}},
	{"pause-server", "SIGSTOP nats-server, SIGCONT after a while", []chaosShape{shapeSplit}},
	{"pause-bridge", "SIGSTOP the bridge, SIGCONT after a while", []chaosShape{shapeSplit}},
	{"pause-trace", "SIGSTOP the trace writer, SIGCONT after a while", []chaosShape{shapeSplit}},
	{"pause-gaps", "SIGSTOP the gap detector, SIGCONT after a while", []chaosShape{shapeSplit}},
	{"restart-server", "stop nats-server with SIGTERM and start it again on its store", []chaosShape{shapeSplit}},
	{"restart-bridge", "stop the bridge with SIGTERM and start it again", []chaosShape{shapeSplit}},
	{"restart-trace", "stop the trace writer with SIGTERM and start it again", []chaosShape{shapeSplit}},
	{"restart-gaps", "stop the gap detector with SIGTERM and start it again", []chaosShape{shapeSplit}},
	{"second-trace", "start a second trace writer (another group) on the trace output in use: it must be refused", []chaosShape{shapeSplit}},
	{"redundant-bridge", "run a second bridge on the same publishers for a while (each FPM must still be stored once)", nil},
	{"disk-fill", "fill the disk holding the JetStream store and the trace output, free it after a while (needs a tmpfs: root)", nil},
}

type chaosClass struct {
	name, what string
	shapes     []chaosShape
}

// chaosOpSet is a set of enabled operation classes.
type chaosOpSet map[string]bool

// parseChaosOps reads a comma-separated list of class names, prefixes of names ("kill9"), "all", and
// "-name" to take classes out again, applied left to right: "all,-disk-fill". An unknown name is an
// error naming it and the classes there are.
func parseChaosOps(s string) (chaosOpSet, error) {
	set := chaosOpSet{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		on := true
		if rest, ok := strings.CutPrefix(item, "-"); ok {
			item, on = rest, false
		}
		matched := false
		exact := slices.ContainsFunc(chaosClasses, func(c chaosClass) bool { return c.name == item })
		for _, c := range chaosClasses {
			if item == "all" || c.name == item || !exact && strings.HasPrefix(c.name, item+"-") {
				set[c.name] = on
				matched = true
			}
		}
		if !matched {
			var names []string
			for _, c := range chaosClasses {
				names = append(names, c.name)
			}
			return nil, fmt.Errorf("operation class %q: not one of all, %s (or a prefix such as kill9)", item, strings.Join(names, ", "))
		}
	}
	for k, v := range set {
		if !v {
			delete(set, k)
		}
	}
	return set, nil
}

// String lists the set in the classes' order, as parseChaosOps reads it back.
func (s chaosOpSet) String() string {
	var out []string
	for _, c := range chaosClasses {
		if s[c.name] {
			out = append(out, c.name)
		}
	}
	if len(out) == len(chaosClasses) {
		return "all"
	}
	return strings.Join(out, ",")
}

// on reports whether class is enabled and may run on shape.
func (s chaosOpSet) on(class string, shape chaosShape) bool {
	if !s[class] {
		return false
	}
	for _, c := range chaosClasses {
		if c.name == class {
			return c.shapes == nil || slices.Contains(c.shapes, shape)
		}
	}
	return false
}

// The pipeline's fixed parts: publisher slots (each an `fpmbus publish` with its own worker id and
// ranks), one replay slot (a recording's producer and ranks), and the bridge's port block covering them.
const (
	chaosPubSlots   = 2
	chaosPubRanks   = 2
	chaosReplayRank = 2
	chaosRate       = 20 // forward passes per second per publisher rank
	// chaosRecording is the replay's recording: per rank, chaosRecordN records chaosRecordGap apart.
	chaosRecordN   = 80
	chaosRecordGap = 25 * time.Millisecond
)

// chaosPorts is the number of ZMQ ports the bridge subscribes to: the publishers' ranks, then the replay's.
const chaosPorts = chaosPubSlots*chaosPubRanks + chaosReplayRank

// chaosAction is what one step does.
type chaosAction string

const (
	actPubStart      chaosAction = "pub-start"      // Slot, Seed, Wait
	actPubStop       chaosAction = "pub-stop"       // Slot: SIGINT
	actPubKill       chaosAction = "pub-kill"       // Slot: SIGKILL
	actPubRerun      chaosAction = "pub-rerun"      // Slot: SIGINT, wait, start again with Seed
	actReplay        chaosAction = "replay"         // Speed, Wait
	actBackfill      chaosAction = "backfill"       // Ref: the new output's number
	actBackfillRerun chaosAction = "backfill-rerun" // Ref: the output whose range runs again
	actKill          chaosAction = "kill9"          // Comp
	actPause         chaosAction = "sigstop"        // Comp
	actCont          chaosAction = "sigcont"        // Comp
	actTerm          chaosAction = "sigterm"        // Comp
	actStart         chaosAction = "start"          // Comp
	actSecondStart   chaosAction = "second-start"   // a second instance on the data directory or trace output in use
	actSecondStop    chaosAction = "second-stop"    // stop it (if it still runs) and judge the refusal
	actBridge2Start  chaosAction = "bridge2-start"  // a redundant bridge
	actBridge2Stop   chaosAction = "bridge2-stop"   // SIGTERM it
	actDiskFill      chaosAction = "disk-fill"      // fill the tmpfs
	actDiskFree      chaosAction = "disk-free"      // free it
	actSettle        chaosAction = "settle"         // end of the schedule: heal, stop publishers, wait, check
)

// chaosStep is one step of a schedule.
type chaosStep struct {
	At     time.Duration
	Class  string // the operation class that produced it ("" for the schedule's own start and end)
	Action chaosAction
	Comp   string
	Slot   int
	Seed   int64
	Wait   bool
	Speed  int
	Ref    int
}

func (s chaosStep) String() string {
	b := fmt.Sprintf("%7.2fs %-16s", s.At.Seconds(), s.Action)
	switch s.Action {
	case actPubStart:
		b += fmt.Sprintf(" slot %d seed %d", s.Slot, s.Seed)
		if s.Wait {
			b += " --wait-subscribers 1"
		}
	case actPubStop, actPubKill:
		b += fmt.Sprintf(" slot %d", s.Slot)
	case actPubRerun:
		b += fmt.Sprintf(" slot %d seed %d (same seed: identical payloads)", s.Slot, s.Seed)
		if s.Wait {
			b += " --wait-subscribers 1"
		}
	case actReplay:
		b += fmt.Sprintf(" speed %d", s.Speed)
		if s.Wait {
			b += " --wait-subscribers 1"
		} else {
			b += " --start-delay 0 (no wait)"
		}
	case actBackfill, actBackfillRerun:
		b += fmt.Sprintf(" output %d", s.Ref)
	case actKill, actPause, actCont, actTerm, actStart:
		b += " " + s.Comp
	}
	if s.Class != "" {
		b += "   [" + s.Class + "]"
	}
	return b
}

// chaosSchedule is a generated run.
type chaosSchedule struct {
	Seed     uint64
	Duration time.Duration
	Shape    chaosShape
	Ops      chaosOpSet
	Steps    []chaosStep
}

func (s *chaosSchedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos schedule: seed %d, duration %v, shape %s, operations %s, %d steps:\n", s.Seed, s.Duration, s.Shape, s.Ops, len(s.Steps))
	for _, st := range s.Steps {
		b.WriteString("  " + st.String() + "\n")
	}
	return b.String()
}

// generateChaos makes the schedule of seed: the shape (unless forced), then, from t=0 to duration,
// one operation every 0.4–2.2 s drawn uniformly from the enabled classes that can run at that moment
// (a component already faulted is not hit again until it is healed; a publisher slot not running cannot
// be stopped), each fault with its heal scheduled after it. The schedule ends with settle, after every
// heal.
func generateChaos(seed uint64, duration time.Duration, ops chaosOpSet, shape chaosShape) *chaosSchedule {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	if shape == "" {
		shape = []chaosShape{shapeUp, shapeSplit}[rng.IntN(2)]
	}
	s := &chaosSchedule{Seed: seed, Duration: duration, Shape: shape, Ops: ops}
	add := func(st chaosStep) { s.Steps = append(s.Steps, st) }
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	ms := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

	// What is busy until when, in schedule time: a faulted component, a publisher slot, the replay slot.
	compBusy := map[string]time.Duration{}
	slotRunning := make([]bool, chaosPubSlots)
	slotBusy := make([]time.Duration, chaosPubSlots)
	slotSeeds := make([]int64, chaosPubSlots)
	var replayBusy, diskBusy, bridge2Busy, secondBusy time.Duration
	type backfill struct {
		ref  int
		done time.Duration
	}
	var backfills []backfill // not rerun yet
	nextBackfill := 0

	// Both publishers start at once, with seeds 1 and 2; slot i's later seeds are i+1+2n, so two slots
	// never share one.
	nextSeed := make([]int64, chaosPubSlots)
	for i := range chaosPubSlots {
		slotSeeds[i] = int64(i + 1)
		nextSeed[i] = slotSeeds[i] + chaosPubSlots
		slotRunning[i] = true
		slotBusy[i] = 1500 * time.Millisecond
		add(chaosStep{At: 0, Action: actPubStart, Slot: i, Seed: slotSeeds[i], Wait: !ops.on("pub-nowait", shape)})
	}
	recording := time.Duration(chaosRecordN) * chaosRecordGap
	for t := between(800*time.Millisecond, 1500*time.Millisecond); t < duration; t += between(400*time.Millisecond, 2200*time.Millisecond) {
		t = ms(t)
		type choice struct {
			class string
			do    func()
		}
		var choices []choice
		offer := func(class string, do func()) {
			if ops.on(class, shape) {
				choices = append(choices, choice{class, do})
			}
		}
		for i := range chaosPubSlots {
			if t < slotBusy[i] {
				continue
			}
			if slotRunning[i] {
				offer("pub-stop", func() {
					add(chaosStep{At: t, Class: "pub-stop", Action: actPubStop, Slot: i})
					slotRunning[i], slotBusy[i] = false, t+between(500*time.Millisecond, 3*time.Second)
				})
				offer("pub-kill", func() {
					add(chaosStep{At: t, Class: "pub-kill", Action: actPubKill, Slot: i})
					slotRunning[i], slotBusy[i] = false, t+between(300*time.Millisecond, 3*time.Second)
				})
				offer("pub-rerun", func() {
					add(chaosStep{At: t, Class: "pub-rerun", Action: actPubRerun, Slot: i, Seed: slotSeeds[i], Wait: !ops.on("pub-nowait", shape)})
					slotBusy[i] = t + 1500*time.Millisecond
				})
			} else {
				// A stopped slot starts again as soon as it may, whatever is enabled: the publishers are the
				// load. With pub-rerun on, half the time with the seed of its last run (identical payloads);
				// otherwise with a seed of its own never used before.
				seed, class := nextSeed[i], ""
				if ops.on("pub-rerun", shape) && rng.IntN(2) == 0 {
					seed, class = slotSeeds[i], "pub-rerun"
				} else {
					nextSeed[i] += chaosPubSlots
				}
				wait := !ops.on("pub-nowait", shape) || rng.IntN(2) == 0
				add(chaosStep{At: t, Class: class, Action: actPubStart, Slot: i, Seed: seed, Wait: wait})
				slotSeeds[i], slotRunning[i], slotBusy[i] = seed, true, t+1500*time.Millisecond
			}
		}
		if t >= replayBusy {
			for _, class := range []string{"replay", "replay-nowait"} {
				offer(class, func() {
					speed := []int{1, 2, 4}[rng.IntN(3)]
					add(chaosStep{At: t, Class: class, Action: actReplay, Speed: speed, Wait: class == "replay"})
					replayBusy = t + recording/time.Duration(speed) + 2*time.Second
				})
			}
		}
		offer("backfill", func() {
			ref := nextBackfill
			nextBackfill++
			add(chaosStep{At: t, Class: "backfill", Action: actBackfill, Ref: ref})
			backfills = append(backfills, backfill{ref, t + 3*time.Second})
		})
		for _, b := range backfills {
			if t >= b.done {
				offer("backfill-rerun", func() {
					add(chaosStep{At: t, Class: "backfill-rerun", Action: actBackfillRerun, Ref: b.ref})
					backfills = slices.DeleteFunc(backfills, func(x backfill) bool { return x.ref == b.ref })
				})
				break
			}
		}
		for _, comp := range chaosComponents[shape] {
			if t < compBusy[comp] {
				continue
			}
			offer("kill9-"+comp, func() {
				d := ms(between(300*time.Millisecond, 3*time.Second))
				add(chaosStep{At: t, Class: "kill9-" + comp, Action: actKill, Comp: comp})
				add(chaosStep{At: t + d, Class: "kill9-" + comp, Action: actStart, Comp: comp})
				compBusy[comp] = t + d + 2*time.Second
			})
			offer("pause-"+comp, func() {
				d := ms(between(500*time.Millisecond, 4*time.Second))
				add(chaosStep{At: t, Class: "pause-" + comp, Action: actPause, Comp: comp})
				add(chaosStep{At: t + d, Class: "pause-" + comp, Action: actCont, Comp: comp})
				compBusy[comp] = t + d + 1*time.Second
			})
			offer("restart-"+comp, func() {
				add(chaosStep{At: t, Class: "restart-" + comp, Action: actTerm, Comp: comp})
				add(chaosStep{At: t + 10*time.Millisecond, Class: "restart-" + comp, Action: actStart, Comp: comp})
				compBusy[comp] = t + 3*time.Second
			})
		}
		if t >= secondBusy {
			for _, class := range []string{"second-up", "second-trace"} {
				offer(class, func() {
					add(chaosStep{At: t, Class: class, Action: actSecondStart})
					add(chaosStep{At: t + chaosSecondWait, Class: class, Action: actSecondStop})
					secondBusy = t + chaosSecondWait + time.Second
				})
			}
		}
		if t >= bridge2Busy {
			offer("redundant-bridge", func() {
				d := ms(between(2*time.Second, 8*time.Second))
				add(chaosStep{At: t, Class: "redundant-bridge", Action: actBridge2Start})
				add(chaosStep{At: t + d, Class: "redundant-bridge", Action: actBridge2Stop})
				bridge2Busy = t + d + time.Second
			})
		}
		if t >= diskBusy {
			offer("disk-fill", func() {
				d := ms(between(2*time.Second, 5*time.Second))
				add(chaosStep{At: t, Class: "disk-fill", Action: actDiskFill})
				add(chaosStep{At: t + d, Class: "disk-fill", Action: actDiskFree})
				diskBusy = t + d + 2*time.Second
			})
		}
		if len(choices) > 0 {
			choices[rng.IntN(len(choices))].do()
		}
	}
	slices.SortStableFunc(s.Steps, func(a, b chaosStep) int { return int(a.At - b.At) })
	end := duration
	if n := len(s.Steps); n > 0 && s.Steps[n-1].At > end {
		end = s.Steps[n-1].At
	}
	add(chaosStep{At: end + 200*time.Millisecond, Action: actSettle})
	return s
}
