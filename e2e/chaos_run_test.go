package e2e

// The chaos checker's executor: it builds the pipeline of the schedule's shape out of real processes,
// carries the schedule's steps out at their times, acts as the service manager of the components
// (one that exits by itself is started again after restartSec, as the shipped units do), heals every
// fault at the end, lets the pipeline settle and collects what the checker needs: what every publisher
// run sent (its own record), what the stream stored, the gap events, drop markers and dead letters,
// every trace output, `gaps report`, `trace verify --stream` and /healthz.
//
// It never asserts timing: every wait is on a condition with a generous deadline, and a step that
// comes late simply runs late (the actual times are kept and printed). A wait that runs out is a
// finding of the run, not a test failure by itself.

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Timeouts of the executor: generous, for a loaded 2-core machine.
const (
	chaosStopWait   = 40 * time.Second // a SIGTERM'd or SIGINT'd process must have exited by then
	chaosSettleWait = 120 * time.Second
	chaosMarkGrace  = 3 * time.Second // the gap detector's --marker-grace in the chaos pipeline
	chaosSecondWait = 8 * time.Second // how long a second instance may run before it counts as not refused
	// chaosSecondGroup is the consumer group of the second trace writer of the split shape.
	chaosSecondGroup = "chaos-second"
)

// chaosComp is one component process under the executor's supervision.
type chaosComp struct {
	name string
	bin  string
	args func() []string
	cur  *proc
	runs []*proc
	// down: the executor took it down (kill, term) and has not started it again; paused: SIGSTOPped.
	down, paused bool
	// exits are the runs that ended by themselves, with their status and last line.
	exits []string
	// restartAt is when an exited run is started again (zero: none pending).
	restartAt time.Time
}

func (c *chaosComp) running() bool {
	if c.cur == nil {
		return false
	}
	select {
	case <-c.cur.done:
		return false
	default:
		return true
	}
}

// chaosRun is one publisher or replay process: what it was told and, after it ended, what it sent.
type chaosRun struct {
	id      int
	kind    string // "publish" or "replay"
	slot    int    // publisher slot, -1 for the replay
	worker  string
	seed    int64
	wait    bool
	start   time.Time
	end     time.Time
	killed  bool
	proc    *proc
	exitMs  atomic.Int64 // when the process exited (Unix ms), set by a watcher
	logPath string       // --sent-log, or the replay's --records-csv
	// sent, per key and seq: the canonical JSON the bridge renders of what was sent, and when.
	sent   map[streams.Key]map[uint64]sentFPM
	status string // how it ended
}

// watch records when the run's process exits.
func (r *chaosRun) watch() {
	go func() {
		<-r.proc.done
		r.exitMs.Store(time.Now().UnixMilli())
	}()
}

// sentFPM is one message a run sent.
type sentFPM struct {
	json      []byte
	sentAtMs  int64
	heartbeat bool
}

// chaosBackfill is one backfill output and the runs that wrote it.
type chaosBackfill struct {
	ref              int
	out              string
	startSeq, endSeq uint64
	procs            []*proc
	statuses         []string
}

// chaosSecond is a second instance started on a data directory or trace output in use.
type chaosSecond struct {
	at      time.Time
	proc    *proc
	ready   string // the line it prints once it works: a refused instance never prints it
	refused bool
	status  string
	// firstEnded is set when the first instance, running when this one started, ended before this one
	// printed its ready line (the schedule stopped or killed it meanwhile): this one then owned the
	// directory legitimately, as the only owner.
	firstEnded bool
	// unjudged: still running, it never got to work, waiting for a server the schedule had stopped:
	// neither an owner nor refused yet.
	unjudged bool
	mu       sync.Mutex
}

// chaosFault is a window in which ingest was impaired (a component of the ingest path down or
// frozen, the disk full): a publisher run ending in it may lose its tail unknowably.
type chaosFault struct {
	what       string
	start, end time.Time
}

// chaosBridgeSpan is when one bridge process ran (an incarnation of the bridge, of `fpmbus up`, or a
// redundant bridge): which bridges could have seen a publisher run begin.
type chaosBridgeSpan struct {
	id         string // its --bridge-id; "" for `fpmbus up`'s own (any id but a redundant bridge's)
	start, end time.Time
	killed     bool // it ended by SIGKILL: whatever it held in memory was lost with it
	// stopped is when the schedule first told it to stop (SIGTERM or SIGKILL; zero: never, it ended by
	// itself or at the end). A bridge stops reading ZMQ as soon as it is told (Bridge.Run), so nothing
	// a publisher sent after that reached it, however long its stop took.
	stopped time.Time
}

type healthSample struct {
	at   time.Time
	code int
}

// chaosEnv is one run of a schedule.
type chaosEnv struct {
	t        *testing.T
	s        *chaosSchedule
	dir      string
	disk     string // holds the JetStream store and the live trace output; a tmpfs when diskOK
	diskOK   bool
	diskNote string
	filler   string
	// serverStale: the split shape's nats-server had a full disk that has room again and is still to
	// be restarted, as its operator would (restartStaleServer).
	serverStale bool
	url         string
	listen      string
	basePort    int
	metrics     string // up: /metrics and /healthz; split: the bridge's /metrics
	traceOut    string
	dataDir     string // up's --data-dir, or nats-server's store_dir
	conf        string // split: nats-server's configuration
	streamMB    int64

	comps   map[string]*chaosComp
	slots   [chaosPubSlots]*chaosRun
	replay  *chaosRun
	runs    []*chaosRun
	rec     *chaosRecording
	fills   []*chaosBackfill
	seconds []*chaosSecond
	bridge2 *proc
	// bridge2Stopping is the last redundant bridge sent SIGTERM, until it exits.
	bridge2Stopping *proc
	spanMu          sync.Mutex
	spans           []*chaosBridgeSpan  // every bridge process, with its end once it exited
	stopSent        map[*proc]time.Time // when each process was first told to stop (stopSignal); spanMu
	faults          []chaosFault
	open            map[string]time.Time // faults not healed yet, by what
	log             []string             // the steps as executed, with their actual times
	notes           []string             // what the executor noticed that is not a violation by itself
	settled         []string             // what did not recover after the faults were healed
	t0              time.Time
	healthMu        sync.Mutex
	health          []healthSample
	stopHC          chan struct{}
	hcDone          chan struct{}
}

func (e *chaosEnv) logf(format string, args ...any) {
	line := fmt.Sprintf("%7.2fs ", time.Since(e.t0).Seconds()) + fmt.Sprintf(format, args...)
	e.log = append(e.log, line)
	e.t.Log(line)
}

func (e *chaosEnv) note(format string, args ...any) {
	n := fmt.Sprintf("%.2fs: ", time.Since(e.t0).Seconds()) + fmt.Sprintf(format, args...)
	e.notes = append(e.notes, n)
	e.t.Log("note: " + n)
}

// newChaosEnv lays out directories, ports, the disk and the recording, and starts the components of
// the schedule's shape.
func newChaosEnv(t *testing.T, s *chaosSchedule) *chaosEnv {
	e := &chaosEnv{t: t, s: s, dir: t.TempDir(), comps: map[string]*chaosComp{}, open: map[string]time.Time{}}
	e.basePort = freeport.Block(t, "", chaosPorts)
	ports := freeport.Ports(t, 3)
	e.listen = fmt.Sprintf("127.0.0.1:%d", ports[0])
	e.url = "nats://" + e.listen
	e.metrics = fmt.Sprintf("127.0.0.1:%d", ports[1])
	// Stream limits the disk can hold (JetStream reserves a stream's max bytes): enough for the run.
	e.streamMB = 32 + int64(s.Duration.Seconds())*300/1024
	e.disk = filepath.Join(e.dir, "disk")
	if err := os.MkdirAll(e.disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if s.Ops["disk-fill"] {
		size := 3*e.streamMB + 64
		out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", size), "tmpfs", e.disk).CombinedOutput()
		if err != nil {
			e.diskNote = fmt.Sprintf("disk-fill is off: mounting a tmpfs at %s failed (it needs root or CAP_SYS_ADMIN): %v %s", e.disk, err, strings.TrimSpace(string(out)))
		} else {
			e.diskOK = true
			t.Cleanup(func() {
				if out, err := exec.Command("umount", "-l", e.disk).CombinedOutput(); err != nil {
					t.Logf("umount %s: %v %s", e.disk, err, out)
				}
			})
		}
	}
	e.traceOut = filepath.Join(e.disk, "trace", "fpm")
	e.rec = writeChaosRecording(t, filepath.Join(e.dir, "recording"))
	e.t0 = time.Now()
	switch s.Shape {
	case shapeUp:
		e.dataDir = filepath.Join(e.disk, "data")
		e.comps["up"] = &chaosComp{name: "up", bin: fpmbusBin, args: func() []string { return e.upArgs(e.listen, e.metrics) }}
	case shapeSplit:
		e.dataDir = filepath.Join(e.disk, "jetstream")
		e.conf = filepath.Join(e.dir, "nats.conf")
		conf := fmt.Sprintf("listen: %q\nmax_payload: 8MB\nping_interval: \"10s\"\nping_max: 2\njetstream {\n  store_dir: %q\n  sync_interval: always\n  max_file_store: %dMB\n}\n",
			e.listen, e.dataDir, 2*e.streamMB+16)
		if err := os.WriteFile(e.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		e.comps["server"] = &chaosComp{name: "server", bin: natsServerBin(t), args: func() []string { return []string{"-c", e.conf} }}
		e.comps["bridge"] = &chaosComp{name: "bridge", bin: fpmbusBin, args: func() []string {
			return e.bridgeArgs("chaos-b1", "--metrics-addr", e.metrics)
		}}
		e.comps["trace"] = &chaosComp{name: "trace", bin: fpmbusBin, args: func() []string {
			return append([]string{"trace", "--server", e.url, "--trace-mode", "full", "--trace-output", e.traceOut,
				"--member-id", "chaos-t1", "--pinned-ttl", "3s"}, e.streamFlags()...)
		}}
		e.comps["gaps"] = &chaosComp{name: "gaps", bin: fpmbusBin, args: func() []string {
			return append([]string{"gaps", "--server", e.url, "--marker-grace", chaosMarkGrace.String(), "--gaps-pinned-ttl", "3s",
				"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", ports[2])}, e.streamFlags()...)
		}}
	}
	for _, name := range chaosComponents[s.Shape] {
		e.startComp(e.comps[name])
	}
	// Ready before the schedule's clock starts: the first publishers find a subscribed bridge.
	switch s.Shape {
	case shapeUp:
		e.comps["up"].cur.waitOutput("bridge ready", 60*time.Second)
		e.stopHC, e.hcDone = make(chan struct{}), make(chan struct{})
		go e.sampleHealth()
	case shapeSplit:
		e.comps["bridge"].cur.waitOutput("bridge ready", 60*time.Second)
		e.comps["trace"].cur.waitOutput("trace writer started", 60*time.Second)
		e.comps["gaps"].cur.waitOutput("gap detector started", 60*time.Second)
	}
	t.Cleanup(func() {
		if e.stopHC != nil {
			select {
			case <-e.stopHC:
			default:
				close(e.stopHC)
			}
			<-e.hcDone
		}
	})
	e.t0 = time.Now()
	return e
}

// streamFlags are the stream limits every component creates streams with: within the disk.
func (e *chaosEnv) streamFlags() []string {
	return []string{"--max-bytes", strconv.FormatInt(e.streamMB<<20, 10), "--events-max-bytes", strconv.FormatInt(16<<20, 10)}
}

func (e *chaosEnv) upArgs(listen, metrics string) []string {
	return append([]string{"up", "--listen", listen, "--data-dir", e.dataDir, "--fpm-port", strconv.Itoa(e.basePort),
		"--dp-size", strconv.Itoa(chaosPorts), "--trace-mode", "full", "--trace-output", e.traceOut,
		"--metrics-addr", metrics, "--gaps-marker-grace", chaosMarkGrace.String()}, e.streamFlags()...)
}

func (e *chaosEnv) bridgeArgs(id string, extra ...string) []string {
	// Each bridge keeps the drop markers it could not store before a stop in its own spool, as the
	// shipped unit does (ops/systemd/fpmbus.env.example), off the disk that fills.
	args := []string{"bridge", "--server", e.url, "--fpm-port", strconv.Itoa(e.basePort), "--dp-size", strconv.Itoa(chaosPorts),
		"--bridge-id", id, "--marker-spool", filepath.Join(e.dir, id+"-drop-markers.jsonl")}
	return append(append(args, e.streamFlags()...), extra...)
}

func (e *chaosEnv) startComp(c *chaosComp) {
	c.cur = start(e.t, "chaos "+c.name, c.bin, c.args()...)
	c.runs = append(c.runs, c.cur)
	c.down, c.paused, c.restartAt = false, false, time.Time{}
	switch c.name {
	case "bridge":
		e.trackBridge("chaos-b1", c.cur)
	case "up":
		e.trackBridge("", c.cur)
	}
}

// trackBridge records when bridge process p (bridge id) runs.
func (e *chaosEnv) trackBridge(id string, p *proc) {
	s := &chaosBridgeSpan{id: id, start: time.Now()}
	e.spanMu.Lock()
	e.spans = append(e.spans, s)
	e.spanMu.Unlock()
	go func() {
		<-p.done
		var exit *exec.ExitError
		killed := errors.As(p.err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
		e.spanMu.Lock()
		s.end, s.killed, s.stopped = time.Now(), killed, e.stopSent[p]
		e.spanMu.Unlock()
	}()
}

// stopSignal sends p sig (SIGTERM or SIGKILL) and records when p was first told to stop.
func (e *chaosEnv) stopSignal(p *proc, sig os.Signal) {
	e.spanMu.Lock()
	if _, ok := e.stopSent[p]; !ok {
		if e.stopSent == nil {
			e.stopSent = map[*proc]time.Time{}
		}
		e.stopSent[p] = time.Now()
	}
	e.spanMu.Unlock()
	_ = p.cmd.Process.Signal(sig)
}

// supervise is the service manager's turn: a component whose run ended by itself is started again
// restartSec later (Restart=on-failure, and after a clean exit too: a component has no reason to stop).
func (e *chaosEnv) supervise() {
	for _, name := range chaosComponents[e.s.Shape] {
		c := e.comps[name]
		if c.down || c.running() || c.cur == nil {
			continue
		}
		if c.restartAt.IsZero() {
			out := strings.TrimSpace(c.cur.Output())
			last := out[strings.LastIndex(out, "\n")+1:]
			c.exits = append(c.exits, fmt.Sprintf("%v: %.300s", c.cur.err, last))
			e.note("%s exited by itself (%v); its service manager starts it again in %v; last line: %.300s", name, c.cur.err, restartSec, last)
			c.restartAt = time.Now().Add(restartSec)
			continue
		}
		if time.Now().After(c.restartAt) {
			e.logf("start %s (service manager)", name)
			e.startComp(c)
		}
	}
}

// sampleHealth polls up's /healthz every 300 ms until the run ends.
func (e *chaosEnv) sampleHealth() {
	defer close(e.hcDone)
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-e.stopHC:
			return
		case <-tick.C:
		}
		code, _, err := getHealth(e.metrics)
		if err != nil {
			code = 0 // unreachable: not an answer of ok
		}
		e.healthMu.Lock()
		e.health = append(e.health, healthSample{time.Now(), code})
		e.healthMu.Unlock()
	}
}

// ingest says whether a fault on comp impairs ingest (a publisher's tail can then be lost unknowably).
func ingest(comp string) bool { return comp == "up" || comp == "server" || comp == "bridge" }

func (e *chaosEnv) faultOpen(what string) {
	if _, ok := e.open[what]; !ok {
		e.open[what] = time.Now()
	}
}

// faultHealPad is how long after its heal a fault window ends: reconnecting and catching up take time.
const faultHealPad = 5 * time.Second

// faultClose ends a fault window faultHealPad after its heal.
func (e *chaosEnv) faultClose(what string) {
	if at, ok := e.open[what]; ok {
		e.faults = append(e.faults, chaosFault{what, at, time.Now().Add(faultHealPad)})
		delete(e.open, what)
	}
}

// execute runs the schedule's steps at their times, then settles.
func (e *chaosEnv) execute() {
	for _, st := range e.s.Steps {
		for time.Since(e.t0) < st.At {
			e.supervise()
			time.Sleep(min(50*time.Millisecond, st.At-time.Since(e.t0)+time.Millisecond))
		}
		e.supervise()
		e.step(st)
	}
}

func (e *chaosEnv) step(st chaosStep) {
	e.logf("%s", st)
	switch st.Action {
	case actPubStart:
		e.pubStart(st.Slot, st.Seed, st.Wait)
	case actPubStop:
		if r := e.slots[st.Slot]; r != nil {
			_ = r.proc.cmd.Process.Signal(syscall.SIGINT)
		}
	case actPubKill:
		if r := e.slots[st.Slot]; r != nil {
			r.killed = true
			_ = r.proc.cmd.Process.Kill()
		}
	case actPubRerun:
		if r := e.slots[st.Slot]; r != nil {
			_ = r.proc.cmd.Process.Signal(syscall.SIGINT)
		}
		e.pubStart(st.Slot, st.Seed, st.Wait)
	case actReplay:
		e.startReplay(st.Speed, st.Wait)
	case actBackfill:
		e.backfill(st.Ref, false)
	case actBackfillRerun:
		e.backfill(st.Ref, true)
	case actKill:
		c := e.comps[st.Comp]
		if ingest(st.Comp) {
			e.faultOpen(st.Comp)
		}
		c.down = true
		if c.running() {
			e.stopSignal(c.cur, syscall.SIGKILL)
			e.waitExit(c.cur, 10*time.Second)
		}
	case actPause:
		c := e.comps[st.Comp]
		if c.running() {
			if ingest(st.Comp) {
				e.faultOpen(st.Comp)
			}
			_ = c.cur.cmd.Process.Signal(syscall.SIGSTOP)
			c.paused = true
		}
	case actCont:
		c := e.comps[st.Comp]
		if c.paused {
			_ = c.cur.cmd.Process.Signal(syscall.SIGCONT)
			c.paused = false
		}
		e.faultClose(st.Comp)
		if st.Comp == "server" {
			e.restartStaleServer()
		}
	case actTerm:
		c := e.comps[st.Comp]
		if ingest(st.Comp) {
			e.faultOpen(st.Comp)
		}
		c.down = true
		if c.running() {
			e.stopSignal(c.cur, syscall.SIGTERM)
			if !e.waitExit(c.cur, chaosStopWait) {
				e.note("%s did not exit within %v of SIGTERM: killed", st.Comp, chaosStopWait)
				_ = c.cur.cmd.Process.Kill()
				e.waitExit(c.cur, 10*time.Second)
			}
		}
	case actStart:
		c := e.comps[st.Comp]
		if !c.running() {
			e.startComp(c)
			if st.Comp == "server" {
				e.serverStale = false // a start loads every stream
			}
		}
		c.down = false
		e.faultClose(st.Comp)
	case actSecondStart:
		e.secondStart()
	case actSecondStop:
		e.secondStop()
	case actBridge2Start:
		if e.bridge2 == nil {
			if old := e.bridge2Stopping; old != nil && !e.waitExit(old, chaosStopWait+10*time.Second) {
				e.note("the last redundant bridge is still stopping; no new one")
				return
			}
			e.bridge2 = start(e.t, "chaos bridge2", fpmbusBin, e.bridgeArgs("chaos-b2")...)
			e.trackBridge("chaos-b2", e.bridge2)
		}
	case actBridge2Stop:
		e.stopBridge2()
	case actDiskFill:
		e.diskFill()
	case actDiskFree:
		e.diskFree()
	case actSettle:
		e.settle()
	}
}

// waitExit waits up to d for p to exit.
func (e *chaosEnv) waitExit(p *proc, d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// endRun notes how a publisher or replay run ended and reads what it sent.
func (e *chaosEnv) endRun(r *chaosRun) {
	if r == nil || !r.end.IsZero() {
		return
	}
	if !e.waitExit(r.proc, chaosStopWait) {
		e.note("%s run %d did not exit within %v: killed", r.kind, r.id, chaosStopWait)
		r.killed = true
		_ = r.proc.cmd.Process.Kill()
		e.waitExit(r.proc, 10*time.Second)
	}
	for r.exitMs.Load() == 0 { // the watcher is about to store it
		time.Sleep(time.Millisecond)
	}
	r.end = time.UnixMilli(r.exitMs.Load())
	r.status = "exit 0"
	if r.proc.err != nil {
		r.status = r.proc.err.Error()
	}
	switch r.kind {
	case "publish":
		r.sent = readSentLog(e.t, r.logPath, r.worker)
	case "replay":
		r.sent = readReplayCSV(e.t, r.logPath, e.rec)
	}
	n := 0
	for _, m := range r.sent {
		n += len(m)
	}
	e.logf("%s run %d (%s, seed %d) ended: %s, %d messages sent", r.kind, r.id, r.worker, r.seed, r.status, n)
}

func (e *chaosEnv) pubStart(slot int, seed int64, wait bool) {
	e.endRun(e.slots[slot])
	r := &chaosRun{id: len(e.runs), kind: "publish", slot: slot, worker: fmt.Sprintf("chaos-p%d", slot), seed: seed, wait: wait}
	r.logPath = filepath.Join(e.dir, fmt.Sprintf("sent-%d.jsonl", r.id))
	args := []string{"publish", "--fpm-port", strconv.Itoa(e.basePort + slot*chaosPubRanks), "--dp-size", strconv.Itoa(chaosPubRanks),
		"--worker-id", r.worker, "--rate", strconv.Itoa(chaosRate), "--seed", strconv.FormatInt(seed, 10), "--sent-log", r.logPath}
	if wait {
		args = append(args, "--wait-subscribers", "1", "--wait-timeout", "20s")
	}
	r.start = time.Now()
	r.proc = start(e.t, fmt.Sprintf("chaos publish %d", r.id), fpmbusBin, args...)
	r.watch()
	e.slots[slot] = r
	e.runs = append(e.runs, r)
}

func (e *chaosEnv) startReplay(speed int, wait bool) {
	if e.replay != nil {
		e.endRun(e.replay)
	}
	r := &chaosRun{id: len(e.runs), kind: "replay", slot: -1, worker: e.rec.worker, seed: int64(speed), wait: wait}
	r.logPath = filepath.Join(e.dir, fmt.Sprintf("replay-%d.csv", r.id))
	args := []string{"trace", "replay", e.rec.path, "--to", "zmq", "--fpm-port", strconv.Itoa(e.basePort + chaosPubSlots*chaosPubRanks),
		"--speed", strconv.Itoa(speed), "--heartbeats", "off", "--records-csv", r.logPath, "--progress-every", "0"}
	if wait {
		args = append(args, "--wait-subscribers", "1", "--wait-timeout", "20s")
	} else {
		args = append(args, "--start-delay", "0")
	}
	r.start = time.Now()
	r.proc = start(e.t, fmt.Sprintf("chaos replay %d", r.id), fpmbusBin, args...)
	r.watch()
	e.replay = r
	e.runs = append(e.runs, r)
}

// backfill runs `trace backfill` of the stream so far into output ref, or (rerun) ref's range again
// into it.
func (e *chaosEnv) backfill(ref int, rerun bool) {
	var b *chaosBackfill
	if rerun {
		for _, x := range e.fills {
			if x.ref == ref {
				b = x
			}
		}
		if b == nil {
			return
		}
		last := b.procs[len(b.procs)-1]
		if !e.waitExit(last, 60*time.Second) {
			e.note("backfill %d still runs after 60 s; its rerun is skipped", ref)
			return
		}
	} else {
		last, err := e.lastStreamSeq()
		if err != nil || last == 0 {
			e.note("backfill %d skipped: the stream's last sequence is unknown (%v)", ref, err)
			return
		}
		b = &chaosBackfill{ref: ref, out: filepath.Join(e.dir, fmt.Sprintf("backfill-%d", ref), "fpm"), startSeq: 1, endSeq: last}
		e.fills = append(e.fills, b)
	}
	p := start(e.t, fmt.Sprintf("chaos backfill %d.%d", ref, len(b.procs)), fpmbusBin, "trace", "backfill", "--server", e.url,
		"--trace-mode", "full", "--trace-output", b.out, "--start-seq", strconv.FormatUint(b.startSeq, 10),
		"--end-seq", strconv.FormatUint(b.endSeq, 10), "--progress", "none", "--connect-timeout", "20s")
	b.procs = append(b.procs, p)
}

func (e *chaosEnv) lastStreamSeq() (uint64, error) {
	nc, err := nats.Connect(e.url, nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}

// secondStart starts a second owner of what the running pipeline owns: in the up shape a second
// `fpmbus up` on the same data directory (its own client and metrics ports, the same flags otherwise,
// as a careless operator would), in the split shape a second trace writer of another group on the
// same trace output.
func (e *chaosEnv) secondStart() {
	// A second instance is refused only while the first owns the directory: started while the first
	// is down (killed, stopped, not ready yet), it is the only owner and may run, and the first is
	// then the one refused when it comes back. So it is started only beside a first instance that has
	// got to work; otherwise the step is skipped, and said so.
	first, ready := "up", "embedded server ready"
	if e.s.Shape == shapeSplit {
		first, ready = "trace", "trace writer started"
	}
	if c := e.comps[first]; c == nil || !c.running() || !strings.Contains(c.cur.Output(), ready) {
		e.note("second instance not started: the first %s is not running and ready, so a second would own the directory legitimately", first)
		return
	}
	sc := &chaosSecond{at: time.Now()}
	switch e.s.Shape {
	case shapeUp:
		ports := freeport.Ports(e.t, 2)
		sc.ready = "embedded server ready"
		sc.proc = start(e.t, "chaos second up", fpmbusBin, e.upArgs(fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]))...)
	case shapeSplit:
		sc.ready = "trace writer started"
		sc.proc = start(e.t, "chaos second trace", fpmbusBin, append([]string{"trace", "--server", e.url, "--trace-mode", "full",
			"--trace-output", e.traceOut, "--group", chaosSecondGroup, "--member-id", "chaos-t2"}, e.streamFlags()...)...)
	}
	go sc.watchFirst(e.comps[first].cur)
	e.seconds = append(e.seconds, sc)
}

// watchFirst sets firstEnded if first ends before the second instance prints its ready line; it
// returns once either has happened or the second has exited.
func (sc *chaosSecond) watchFirst(first *proc) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(sc.proc.Output(), sc.ready) {
			return
		}
		select {
		case <-first.done:
			if !strings.Contains(sc.proc.Output(), sc.ready) {
				sc.mu.Lock()
				sc.firstEnded = true
				sc.mu.Unlock()
			}
			return
		case <-sc.proc.done:
			return
		case <-tick.C:
		}
	}
}

// onlyOwner reports whether the first instance ended before this one got to work (firstEnded), or
// whether this one could not be judged (unjudged).
func (sc *chaosSecond) onlyOwner() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.firstEnded || sc.unjudged
}

// secondStop judges the last second instance: refused means it exited with a failure by now; one
// still running is stopped as its operator would (SIGINT).
func (e *chaosEnv) secondStop() {
	if len(e.seconds) == 0 {
		return
	}
	sc := e.seconds[len(e.seconds)-1]
	if sc.status != "" {
		return
	}
	// It has its whole time to refuse, even when the schedule ends sooner.
	if left := chaosSecondWait - time.Since(sc.at); left > 0 {
		e.waitExit(sc.proc, left)
	}
	out := strings.TrimSpace(sc.proc.Output())
	last := out[strings.LastIndex(out, "\n")+1:]
	select {
	case <-sc.proc.done:
		// Refused: it failed without ever getting to work (its ready line), saying why.
		started := strings.Contains(out, sc.ready)
		sc.refused = sc.proc.err != nil && !started
		sc.status = fmt.Sprintf("exited by itself (%v) %s; last line: %.300s", sc.proc.err,
			map[bool]string{true: "after it had started (" + sc.ready + ")", false: "before it started"}[started], last)
	default:
		sc.status = fmt.Sprintf("still running %v after it started", time.Since(sc.at).Round(time.Second))
		sc.mu.Lock()
		if sc.firstEnded {
			sc.status += "; the first had ended before it got to work: the only owner"
		}
		sc.mu.Unlock()
		if !strings.Contains(out, sc.ready) && (strings.Contains(out, "NATS server not reachable yet") || e.serverFaultDuring(sc.at, sc.at.Add(chaosSecondWait))) {
			sc.unjudged = true
			sc.status += "; it never got to work, waiting for the server the schedule had stopped: not judged"
		}
		_ = sc.proc.cmd.Process.Signal(syscall.SIGINT)
		stopInBackground(sc.proc)
	}
	e.logf("second instance: %s", sc.status)
}

// serverFaultDuring reports whether nats-server was down or paused (a fault window, closed or still
// open) at some time from from to to: a second trace writer's refusal reads the stream, so one started
// then may still wait for the server when its time to refuse is up (connected before the server went
// away, it does not log that the server is not reachable).
func (e *chaosEnv) serverFaultDuring(from, to time.Time) bool {
	for _, f := range e.faults {
		if f.what == "server" && f.start.Before(to) && f.end.After(from) {
			return true
		}
	}
	at, open := e.open["server"]
	return open && at.Before(to)
}

// stopBridge2 sends the redundant bridge SIGTERM; it stops in the background (killed if it takes
// longer than chaosStopWait), so that the schedule goes on meanwhile.
func (e *chaosEnv) stopBridge2() {
	if e.bridge2 == nil {
		return
	}
	p := e.bridge2
	e.stopSignal(p, syscall.SIGTERM)
	stopInBackground(p)
	e.bridge2, e.bridge2Stopping = nil, p
}

// stopInBackground kills p if it has not exited chaosStopWait from now.
func stopInBackground(p *proc) {
	go func() {
		select {
		case <-p.done:
		case <-time.After(chaosStopWait):
			_ = p.cmd.Process.Kill()
		}
	}()
}

// diskFill takes every free byte of the tmpfs with one preallocated file.
func (e *chaosEnv) diskFill() {
	if !e.diskOK {
		return
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(e.disk, &st); err != nil {
		e.note("disk-fill: statfs: %v", err)
		return
	}
	free := int64(st.Bavail) * st.Bsize
	e.filler = filepath.Join(e.disk, "chaos-filler")
	f, err := os.Create(e.filler)
	if err != nil {
		e.note("disk-fill: %v", err)
		return
	}
	defer f.Close()
	// A tmpfs refuses (ENOSPC) an allocation of exactly what statfs calls available, and undoes
	// the whole call: allocate in ever smaller pieces until not even a page fits.
	var taken int64
	for chunk := free; chunk >= st.Bsize; {
		if err := syscall.Fallocate(int(f.Fd()), 0, taken, chunk); err != nil {
			chunk /= 2
			continue
		}
		taken += chunk
	}
	if err := syscall.Statfs(e.disk, &st); err != nil || int64(st.Bavail)*st.Bsize > diskFullSlack {
		// Not full: no fault window, so that nothing is excused or expected of a full disk.
		e.note("disk-fill: %d of %d bytes taken, %d left: not full", taken, free, int64(st.Bavail)*st.Bsize)
		return
	}
	e.faultOpen("disk")
	e.logf("disk full: %d bytes taken", taken)
}

// diskFullSlack is the most a full disk may have left: less than one JetStream write.
const diskFullSlack = 64 << 10

func (e *chaosEnv) diskFree() {
	if e.filler == "" {
		return
	}
	if err := os.Remove(e.filler); err != nil {
		e.note("disk-free: %v", err)
	}
	e.filler = ""
	e.faultClose("disk")
	if e.s.Shape == shapeSplit {
		e.serverStale = true
		e.restartStaleServer()
	}
}

// restartStaleServer does what ops/README.md tells the operator of a separate nats-server to do once
// its full disk has room again: restart it. nats-server refuses every write to a stream after the
// stream's first write error until the stream is loaded again (fpmbus up does that in its own process;
// a separate server needs a restart), so without it the pipeline would wait forever. A paused or
// stopped server is restarted when it runs again (a start loads every stream anyway).
func (e *chaosEnv) restartStaleServer() {
	c := e.comps["server"]
	if !e.serverStale || c == nil || c.paused {
		return
	}
	e.serverStale = false
	if !c.running() {
		return
	}
	e.faultOpen("server")
	_ = c.cur.cmd.Process.Signal(syscall.SIGTERM)
	if !e.waitExit(c.cur, chaosStopWait) {
		e.note("server did not exit within %v of SIGTERM: killed", chaosStopWait)
		_ = c.cur.cmd.Process.Kill()
		e.waitExit(c.cur, 10*time.Second)
	}
	e.startComp(c)
	e.faultClose("server")
	e.logf("operator: nats-server restarted once its disk had room (its streams refuse writes after a write error until loaded again)")
}

// settle heals every fault, lets the publishers' last messages through a pipeline back in order,
// stops them, and waits until every component has settled everything.
func (e *chaosEnv) settle() {
	e.diskFree()
	for _, name := range chaosComponents[e.s.Shape] {
		c := e.comps[name]
		if c.paused {
			_ = c.cur.cmd.Process.Signal(syscall.SIGCONT)
			c.paused = false
		}
		if !c.running() {
			e.startComp(c)
		}
		c.down = false
		e.faultClose(name)
	}
	e.restartStaleServer()
	e.stopBridge2()
	e.secondStop()
	for _, p := range []*proc{e.bridge2Stopping} {
		if p != nil {
			e.waitExit(p, chaosStopWait+10*time.Second)
		}
	}
	for _, sc := range e.seconds {
		e.waitExit(sc.proc, chaosStopWait+10*time.Second)
	}
	// The pipeline back in order before the publishers stop, so their last messages are not lost to a
	// fault's tail: up's /healthz ok, or the split components ready.
	var readyErr error
	deadline := time.Now().Add(chaosSettleWait)
	for time.Now().Before(deadline) {
		e.supervise()
		if readyErr = e.ready(); readyErr == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if readyErr != nil {
		e.settled = append(e.settled, fmt.Sprintf("the pipeline was not ready %v after the faults were healed: %v", chaosSettleWait, readyErr))
	}
	time.Sleep(2 * time.Second)
	if e.replay != nil {
		e.endRun(e.replay)
	}
	for i, r := range e.slots {
		if r != nil && r.end.IsZero() {
			_ = r.proc.cmd.Process.Signal(syscall.SIGINT)
			e.endRun(r)
			e.slots[i] = nil
		}
	}
	for _, b := range e.fills {
		for i, p := range b.procs {
			if !e.waitExit(p, 60*time.Second) {
				_ = p.cmd.Process.Kill()
				e.waitExit(p, 10*time.Second)
			}
			st := "exit 0"
			if p.err != nil {
				st = p.err.Error()
			}
			if i >= len(b.statuses) {
				b.statuses = append(b.statuses, st)
			}
		}
	}
	e.logf("publishers stopped; waiting for the pipeline to settle")
	if err := e.waitSettled(); err != nil {
		e.settled = append(e.settled, fmt.Sprintf("the pipeline did not settle within %v: %v", chaosSettleWait, err))
	}
	e.logf("settled")
}

// ready reports whether the pipeline is back: up's /healthz ok, or every split component ready and
// the bridge's metrics reachable.
func (e *chaosEnv) ready() error {
	switch e.s.Shape {
	case shapeUp:
		code, rep, err := getHealth(e.metrics)
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("/healthz %d: %+v", code, rep)
		}
	case shapeSplit:
		for name, want := range map[string]string{"bridge": "bridge ready", "trace": "trace writer started", "gaps": "gap detector started"} {
			c := e.comps[name]
			if !c.running() || !strings.Contains(c.cur.Output(), want) {
				return fmt.Errorf("%s not ready", name)
			}
		}
		if _, err := scrapeSamples(e.metrics); err != nil {
			return err
		}
	}
	return nil
}

// waitSettled waits until the bridge holds nothing, every consumer of FPM has nothing pending or
// unacknowledged and the gap detector has no gap waiting for its grace, twice, a marker grace apart.
func (e *chaosEnv) waitSettled() error {
	js := jsClient(e.t, e.url)
	deadline := time.Now().Add(chaosSettleWait)
	var err error
	settled := 0
	for time.Now().Before(deadline) && settled < 2 {
		e.supervise()
		if err = e.settledOnce(js); err != nil {
			settled = 0
			time.Sleep(300 * time.Millisecond)
			continue
		}
		settled++
		if settled < 2 {
			time.Sleep(chaosMarkGrace + time.Second)
		}
	}
	if settled < 2 {
		return err
	}
	return nil
}

func (e *chaosEnv) settledOnce(js jetstream.JetStream) error {
	m, err := scrapeSamples(e.metrics)
	if err != nil {
		return err
	}
	if b, f := sumSamples(m, "fpmbus_bridge_buffered_messages"), sumSamples(m, "fpmbus_bridge_in_flight"); b != 0 || f != 0 {
		return fmt.Errorf("bridge: %v buffered, %v in flight", b, f)
	}
	if err := chaosConsumersDone(js); err != nil {
		return err
	}
	rep, err := e.gapsReport()
	if err != nil {
		return err
	}
	for _, p := range rep.Publishers {
		if p.PendingGaps > 0 {
			return fmt.Errorf("gap detector: %s has %d gaps waiting", p.Key, p.PendingGaps)
		}
	}
	return nil
}

func (e *chaosEnv) gapsReport() (*gaps.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fpmbusBin, "gaps", "report", "--server", e.url, "--json")
	cmd.Env = testEnv(e.t)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("gaps report: %v: %s", err, out)
	}
	var r gaps.Report
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("gaps report output %q: %v", out, err)
	}
	return &r, nil
}

// collect reads everything the checker judges. The pipeline has settled; for `trace verify
// --include-active` the live trace writer is stopped first (in the up shape, up starts again with its
// trace writer pointed elsewhere, so that its server answers verify's reads).
func (e *chaosEnv) collect() *chaosObserved {
	o := &chaosObserved{shape: e.s.Shape, runs: e.runs, faults: e.faults, seconds: e.seconds, notes: e.notes, settleErr: strings.Join(e.settled, "; ")}
	e.spanMu.Lock()
	for _, s := range e.spans {
		o.bridges = append(o.bridges, *s)
	}
	e.spanMu.Unlock()
	for what, at := range e.open {
		o.faults = append(o.faults, chaosFault{what, at, time.Now()})
	}
	js := jsClient(e.t, e.url)
	var err error
	if o.stored, err = readStored(js); err != nil {
		o.unread = fmt.Sprintf("stream %s could not be read: %v", streams.StreamFPM, err)
	}
	if msgs, err := chaosFetch(js, streams.StreamEvents, streams.GapEventWildcard); err != nil {
		o.unread += fmt.Sprintf("; gap events could not be read: %v", err)
	} else {
		for _, m := range msgs {
			var ev gaps.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				o.malformed = append(o.malformed, fmt.Sprintf("gap event %s: %v", m.Data(), err))
				continue
			}
			o.gapEvents = append(o.gapEvents, ev)
		}
	}
	if msgs, err := chaosFetch(js, streams.StreamEvents, streams.ConsumerLossWildcard); err != nil {
		o.unread += fmt.Sprintf("; loss events could not be read: %v", err)
	} else {
		for _, m := range msgs {
			var l streams.ConsumerLoss
			if err := json.Unmarshal(m.Data(), &l); err != nil {
				o.malformed = append(o.malformed, fmt.Sprintf("loss event %s: %v", m.Data(), err))
				continue
			}
			o.losses = append(o.losses, l)
		}
	}
	if msgs, err := chaosFetch(js, streams.StreamEvents, streams.DropMarkerWildcard); err != nil {
		o.unread += fmt.Sprintf("; drop markers could not be read: %v", err)
	} else {
		for _, m := range msgs {
			dm, err := streams.ParseDropMarker(m.Data())
			if err != nil {
				o.malformed = append(o.malformed, fmt.Sprintf("drop marker %s: %v", m.Data(), err))
				continue
			}
			o.markers = append(o.markers, dm)
		}
	}
	if msgs, err := chaosFetch(js, streams.StreamEvents, streams.DeadLetterWildcard); err != nil {
		o.unread += fmt.Sprintf("; dead letters could not be read: %v", err)
	} else {
		for _, m := range msgs {
			o.deadLetters = append(o.deadLetters, chaosDeadLetter{subject: m.Subject(), header: m.Headers()})
		}
	}
	if natsBin != "" {
		out, err := run(e.t, 30*time.Second, natsBin, "--server", e.url, "stream", "info", streams.StreamFPM, "--json")
		var info struct {
			State struct {
				Messages uint64 `json:"messages"`
			} `json:"state"`
		}
		if err != nil || json.Unmarshal([]byte(out), &info) != nil {
			o.malformed = append(o.malformed, fmt.Sprintf("nats stream info %s: %v: %.300s", streams.StreamFPM, err, out))
		} else {
			o.cliCount = int64(info.State.Messages)
		}
	} else {
		o.cliCount = -1
	}
	if o.report, err = e.gapsReport(); err != nil {
		o.malformed = append(o.malformed, err.Error())
	}
	if e.s.Shape == shapeUp {
		code, rep, err := getHealth(e.metrics)
		o.finalHealth = code
		if err != nil {
			o.finalHealthBody = err.Error()
		} else {
			b, _ := json.Marshal(rep)
			o.finalHealthBody = string(b)
		}
		close(e.stopHC)
		<-e.hcDone
		e.healthMu.Lock()
		o.health = append([]healthSample(nil), e.health...)
		e.healthMu.Unlock()
	}
	// Stop the live writer, so that every segment is sealed and verify may read the newest too.
	switch e.s.Shape {
	case shapeUp:
		c := e.comps["up"]
		_ = c.cur.cmd.Process.Signal(syscall.SIGTERM)
		if !e.waitExit(c.cur, chaosStopWait) {
			o.malformed = append(o.malformed, fmt.Sprintf("fpmbus up did not exit within %v of SIGTERM", chaosStopWait))
			_ = c.cur.cmd.Process.Kill()
			e.waitExit(c.cur, 10*time.Second)
		}
		idle := filepath.Join(e.dir, "verify-idle", "fpm")
		args := e.upArgs(e.listen, e.metrics)
		for i, a := range args {
			if a == "--trace-output" {
				args[i+1] = idle
			}
		}
		p := start(e.t, "chaos up (verify)", fpmbusBin, args...)
		if !waitPrinted(p, "bridge ready", 60*time.Second) {
			o.malformed = append(o.malformed, "fpmbus up, started again for trace verify, was not ready within 60 s")
		}
	case shapeSplit:
		c := e.comps["trace"]
		_ = c.cur.cmd.Process.Signal(syscall.SIGTERM)
		c.down = true
		if !e.waitExit(c.cur, chaosStopWait) {
			o.malformed = append(o.malformed, fmt.Sprintf("fpmbus trace did not exit within %v of SIGTERM", chaosStopWait))
			_ = c.cur.cmd.Process.Kill()
			e.waitExit(c.cur, 10*time.Second)
		}
	}
	outputs := []chaosOutput{{name: "live trace", path: e.traceOut}}
	for _, b := range e.fills {
		outputs = append(outputs, chaosOutput{name: fmt.Sprintf("backfill %d", b.ref), path: b.out, backfill: b})
	}
	for _, out := range outputs {
		out.lines = readChaosTrace(e.t, out.path)
		out.verify = e.verify(out.path)
		o.outputs = append(o.outputs, out)
	}
	for _, name := range chaosComponents[e.s.Shape] {
		for _, x := range e.comps[name].exits {
			o.exits = append(o.exits, name+": "+x)
		}
	}
	return o
}

// verify runs `trace verify --stream --include-active --json` on an output no writer writes.
func (e *chaosEnv) verify(out string) chaosVerify {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fpmbusBin, "trace", "verify", "--stream", "--include-active", "--json", "--server", e.url, out)
	cmd.Env = testEnv(e.t)
	stdout, err := cmd.Output()
	v := chaosVerify{exit: exitCode(err), kinds: map[string]int{}}
	var rep verifyJSON
	if jerr := json.Unmarshal(stdout, &rep); jerr != nil {
		v.err = fmt.Sprintf("%v: %v: %.300s", err, jerr, stdout)
		return v
	}
	v.remaining = rep.Remaining
	for _, p := range rep.Producers {
		for _, s := range p.Segments {
			for _, f := range s.Findings {
				v.kinds[f.Kind]++
			}
		}
	}
	return v
}

// readStored reads every message of FPM with its stream sequence.
func readStored(js jetstream.JetStream) ([]chaosStored, error) {
	msgs, err := chaosFetch(js, streams.StreamFPM, ">")
	if err != nil {
		return nil, err
	}
	var out []chaosStored
	for _, m := range msgs {
		k, err := streams.ParseFPMSubject(m.Subject())
		if err != nil {
			return nil, fmt.Errorf("stored subject: %w", err)
		}
		h := m.Headers()
		seq, err := strconv.ParseUint(h.Get(streams.HeaderSeq), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s header: %w", m.Subject(), streams.HeaderSeq, err)
		}
		epoch, _ := strconv.ParseInt(h.Get(streams.HeaderEpoch), 10, 64)
		recv, _ := strconv.ParseInt(h.Get(streams.HeaderReceivedAt), 10, 64)
		md, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		out = append(out, chaosStored{key: k, seq: seq, epoch: epoch, recvMs: recv, streamSeq: md.Sequence.Stream, storedMs: md.Timestamp.UnixMilli(),
			producer: h.Get(streams.HeaderProducer), bridge: h.Get(streams.HeaderBridge), body: m.Data()})
	}
	return out, nil
}

// chaosFetch reads every message of stream on filter with an ordered consumer, as natsservertest.Messages
// does, but returns an error instead of failing the test: a server that stopped answering is a
// finding of the run.
func chaosFetch(js jetstream.JetStream, stream, filter string) ([]jetstream.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if filter != ">" {
		cfg.FilterSubjects = []string{filter}
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var out []jetstream.Msg
	for ctx.Err() == nil {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			out = append(out, m)
			n++
		}
		if n > 0 {
			continue
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return nil, err
		}
		if ci.NumPending == 0 {
			return out, nil
		}
	}
	return nil, ctx.Err()
}

// waitPrinted waits up to d for p to print substr, without failing the test.
func waitPrinted(p *proc, substr string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(p.Output(), substr) {
			return true
		}
		select {
		case <-p.done:
			return strings.Contains(p.Output(), substr)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// readChaosTrace reads every line of every segment of output; a segment that cannot be read is
// reported by verify, and its readable lines still count.
func readChaosTrace(t *testing.T, output string) []*schemas.TraceLine {
	files, err := filepath.Glob(output + ".*.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	var out []*schemas.TraceLine
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(strings.NewReader(string(data)))
		if err != nil {
			continue // an empty segment, or damage verify reports
		}
		sc := bufio.NewScanner(zr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if l, err := schemas.ParseTraceLine(sc.Bytes()); err == nil {
				out = append(out, l)
			}
		}
	}
	return out
}

// readSentLog reads a publisher's --sent-log: per key (the bridge's default namespace and component,
// the publisher's worker id, the rank), per seq the canonical JSON the bridge renders of the payload.
func readSentLog(t *testing.T, path, worker string) map[streams.Key]map[uint64]sentFPM {
	out := map[streams.Key]map[uint64]sentFPM{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out // never got to send
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			DPRank    int    `json:"dp_rank"`
			Seq       uint64 `json:"seq"`
			Heartbeat bool   `json:"heartbeat"`
			SentAt    int64  `json:"sent_at_unix_ms"`
			Payload   string `json:"payload"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Bytes(), err)
		}
		raw, err := base64.StdEncoding.DecodeString(l.Payload)
		if err != nil {
			t.Fatalf("%s: payload: %v", path, err)
		}
		fpm, err := schemas.DecodeFPM(raw)
		if err != nil {
			t.Fatalf("%s: seq %d: payload does not decode: %v", path, l.Seq, err)
		}
		k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: worker, DPRank: l.DPRank}
		if out[k] == nil {
			out[k] = map[uint64]sentFPM{}
		}
		out[k][l.Seq] = sentFPM{json: fpm.JSON, sentAtMs: l.SentAt, heartbeat: l.Heartbeat}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// chaosRecording is the replay's recording: a full-mode trace of one producer on chaosReplayRank
// ranks, written by the test from the synthetic engine (counter_id = the record's number per rank, so
// a replay with --counter-ids keep sends sequence = counter_id).
type chaosRecording struct {
	path   string
	worker string
	json   map[int]map[int64][]byte // rank → counter_id → the fpm object
}

func writeChaosRecording(t *testing.T, dir string) *chaosRecording {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &chaosRecording{worker: "chaos-rec", json: map[int]map[int64][]byte{}}
	r.path = filepath.Join(dir, "fpm."+r.worker+".000000.jsonl.gz")
	f, err := os.Create(r.path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	base := time.Now().Add(-time.Hour).UnixMilli()
	var line []byte
	for rank := range chaosReplayRank {
		r.json[rank] = map[int64][]byte{}
	}
	engines := make([]*producer.Engine, chaosReplayRank)
	for rank := range engines {
		engines[rank] = producer.NewEngine(7, r.worker, rank)
	}
	for i := range chaosRecordN {
		for rank, eng := range engines {
			fpm, ok := eng.Step()
			for !ok {
				fpm, ok = eng.Step()
			}
			fpm.CounterID = int64(i)
			dec, err := schemas.DecodeFPM(schemas.AppendMsgpack(nil, &fpm))
			if err != nil {
				t.Fatal(err)
			}
			r.json[rank][int64(i)] = dec.JSON
			at := int64(i)*chaosRecordGap.Milliseconds() + int64(rank)
			l := schemas.TraceLine{Timestamp: at, Event: schemas.TraceEvent{Schema: schemas.TraceSchema,
				Source:      schemas.TraceSource{Namespace: "dynamo", Component: "backend", ProducerID: r.worker},
				CaptureMode: schemas.CaptureFull, ObservedAtUnixMs: base + at, FPM: dec.JSON}}
			line = append(schemas.AppendTraceLine(line[:0], &l), '\n')
			if _, err := zw.Write(line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return r
}

// readReplayCSV reads a replay's --records-csv: every record sent, per key and seq, with the recorded
// fpm object it carried. A record sent while its socket had no subscriber ("undelivered") was sent all
// the same: it took its sequence number and was lost on the wire, as a Dynamo worker's first messages
// are before anyone subscribes, and the gap detector names it like any number that never arrived.
func readReplayCSV(t *testing.T, path string, rec *chaosRecording) map[streams.Key]map[uint64]sentFPM {
	out := map[streams.Key]map[uint64]sentFPM{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) == 0 {
		return out // cut short: nothing counts as sent
	}
	for _, row := range rows[1:] {
		if len(row) < 10 || row[9] != "sent" && !strings.HasPrefix(row[9], "undelivered") {
			continue
		}
		rank, _ := strconv.Atoi(row[1])
		seq, _ := strconv.ParseUint(row[4], 10, 64)
		counter, _ := strconv.ParseInt(row[5], 10, 64)
		k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: rec.worker, DPRank: rank}
		if out[k] == nil {
			out[k] = map[uint64]sentFPM{}
		}
		out[k][seq] = sentFPM{json: rec.json[rank][counter]}
	}
	return out
}

// chaosConsumersDone reports whether every durable consumer of FPM but a second trace writer's (an
// operator's mistake whose durable outlives it) has nothing pending and nothing unacknowledged.
func chaosConsumersDone(js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streams.StreamFPM)
	if err != nil {
		return err
	}
	cl := s.ListConsumers(ctx)
	for ci := range cl.Info() {
		if ci.Name == chaosSecondGroup || ci.Config.Durable == "" {
			continue // an ordered consumer of a tool (backfill, a report) settles nothing
		}
		if ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("%s/%s: %d pending, %d unacked", streams.StreamFPM, ci.Name, ci.NumPending, ci.NumAckPending)
		}
	}
	return cl.Err()
}
