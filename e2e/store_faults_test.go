package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/gaps"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/internal/smalldisk"
	"github.com/fpmbus/fpmbus/streams"
)

// These tests take the disk away from `fpmbus up`'s embedded JetStream server while FPMs flow: a real
// filesystem that fills (a tmpfs of 64 MiB, so the kernel's own ENOSPC), and a data directory deleted
// under the running process.

// serverComponent is the embedded server's entry of a health report.
func serverComponent(t *testing.T, rep healthReport) (state, reason string) {
	t.Helper()
	for _, c := range rep.Components {
		if c.Name == "embedded server" {
			return c.State, c.Reason
		}
	}
	t.Fatalf("no embedded server in %+v", rep)
	return "", ""
}

// waitMetric waits until metric (summed over the samples with labels) satisfies ok, and returns it.
func waitMetric(t *testing.T, addr, name string, ok func(float64) bool, d time.Duration, labels ...string) float64 {
	t.Helper()
	var v float64
	eventually(t, d, func() error {
		m, err := scrapeSamples(addr)
		if err != nil {
			return err
		}
		if v = sumSamples(m, name, labels...); !ok(v) {
			return fmt.Errorf("%s%v = %v", name, labels, v)
		}
		return nil
	})
	return v
}

// The disk under the JetStream store fills while a publisher sends: /healthz answers 503 with the
// embedded server degraded, naming the full filesystem and the store; the store metrics say so; the
// bridge buffers and then drops. Once space is freed JetStream is restarted at once, ingest resumes,
// and every number the publisher sent is either stored once or named missing, by the gap events or,
// for the drops after the run's last stored FPM (the run ended while the disk was full), by the bridge's
// drop markers that `gaps report` counts: sent = stored + named, number by number, never 0 %.
func TestUpFullDiskIsNamedAndIngestResumesWhenSpaceReturns(t *testing.T) {
	t.Parallel()
	for name, endsWhileFull := range map[string]bool{"space returns during the run": false, "the run ends while the disk is full": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fullDiskRun(t, endsWhileFull)
		})
	}
}

func fullDiskRun(t *testing.T, endsWhileFull bool) {
	n := 12000
	if endsWhileFull {
		n = 4000
	}
	mnt := smalldisk.Mount(t, 64<<20)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := startUp(t, 1, "--data-dir", filepath.Join(mnt, "data"), "--metrics-addr", metrics,
		// Limits that fit the small disk; a buffer and window small enough to drop within seconds.
		"--max-bytes", "24000000", "--events-max-bytes", "4000000", "--max-buffer", "1000", "--max-in-flight", "256")
	waitHealth(t, metrics, http.StatusOK, 30*time.Second)
	pub := publish(t, 1, up.basePort, 1, n, "fulldisk", "--rate", "800")
	js := jsClient(t, up.url)
	eventually(t, 30*time.Second, func() error {
		if c, err := streamCount(t, js, streams.StreamFPM); err != nil || c < 1000 {
			return fmt.Errorf("%d FPMs stored (%v), want 1000 before the disk fills", c, err)
		}
		return nil
	})

	free := smalldisk.Fill(t, mnt)
	rep := waitHealth(t, metrics, http.StatusServiceUnavailable, 30*time.Second)
	state, reason := serverComponent(t, rep)
	store := filepath.Join(mnt, "data", "jetstream", "jetstream")
	if rep.Status != "degraded" || state != "degraded" || !strings.Contains(reason, "disk full") ||
		!strings.Contains(reason, "filesystem at "+mnt) || !strings.Contains(reason, store) {
		t.Fatalf("full disk: status %q, embedded server %q: %q; want degraded, naming the filesystem %s and the store %s", rep.Status, state, reason, mnt, store)
	}
	waitMetric(t, metrics, "fpmbus_store_ok", func(v float64) bool { return v == 0 }, 10*time.Second)
	waitMetric(t, metrics, "fpmbus_store_faults_total", func(v float64) bool { return v == 1 }, 10*time.Second, "state", "disk_full")
	waitMetric(t, metrics, "fpmbus_bridge_dropped_total", func(v float64) bool { return v > 0 }, 30*time.Second, "reason", "buffer_full")
	if endsWhileFull {
		if err := pub.wait(60 * time.Second); err != nil {
			t.Fatalf("publisher: %v", err)
		}
		// Every number sent has reached the bridge: it is buffered or dropped.
		waitMetric(t, metrics, "fpmbus_bridge_received_total", func(v float64) bool { return v == float64(n) }, 30*time.Second)
	}

	free()
	rep = waitHealth(t, metrics, http.StatusOK, 30*time.Second)
	if state, reason := serverComponent(t, rep); state != "ready" || reason != "" {
		t.Fatalf("after space returned the embedded server is %q (%q)", state, reason)
	}
	waitMetric(t, metrics, "fpmbus_store_recoveries_total", func(v float64) bool { return v == 1 }, 10*time.Second)
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	// Every drop marker is stored: as many dropped as published in markers.
	m, err := scrapeSamples(metrics)
	if err != nil {
		t.Fatal(err)
	}
	dropped := sumSamples(m, "fpmbus_bridge_dropped_total")
	if dropped == 0 {
		t.Fatal("the bridge dropped nothing while the disk was full: the test did not fill its buffer")
	}

	key := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "fulldisk", DPRank: 0}
	a := accountFor(t, js, up.url, key, n)
	bridgeDrops, unrevealed := a.bridgeDrops, a.unrevealed
	if float64(bridgeDrops+unrevealed) != dropped {
		t.Fatalf("%d numbers named bridge_drop and %d dropped after the last stored FPM, but the bridge counted %v dropped", bridgeDrops, unrevealed, dropped)
	}
	if endsWhileFull != (unrevealed > 0) {
		t.Fatalf("%d numbers dropped after the run's last stored FPM; want some only when the run ended while the disk was full", unrevealed)
	}
	t.Logf("%d sent: %d stored, %d named missing (%d bridge_drop, %d dropped after the run's last stored FPM; the bridge counted %v dropped)",
		n, a.stored, a.named, bridgeDrops, unrevealed, dropped)
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
}

// `fpmbus up` is stopped while its store disk is full: the drop markers its bridge holds cannot be
// stored, so they go to the marker spool (here on another disk, --marker-spool). The next `up` on the
// same data directory and spool publishes them before anything else and removes the spool, and every
// number the publisher sent is stored or named missing, as if the store had come back before the stop.
func TestUpStoppedWhileTheDiskIsFullNamesItsDropsAtTheNextStart(t *testing.T) {
	t.Parallel()
	const n = 4000
	mnt := smalldisk.Mount(t, 64<<20)
	spool := filepath.Join(t.TempDir(), "drop-markers.jsonl")
	args := func(metrics string) []string {
		return []string{"--data-dir", filepath.Join(mnt, "data"), "--marker-spool", spool, "--metrics-addr", metrics,
			"--max-bytes", "24000000", "--events-max-bytes", "4000000", "--max-buffer", "1000", "--max-in-flight", "256",
			// Stops that wait less for a store that refuses writes.
			"--stop-timeout", "2s", "--trace-stop-timeout", "2s", "--gaps-stop-timeout", "2s"}
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := startUp(t, 1, args(metrics)...)
	waitHealth(t, metrics, http.StatusOK, 30*time.Second)
	pub := publish(t, 1, up.basePort, 1, n, "fulldisk", "--rate", "800")
	js := jsClient(t, up.url)
	eventually(t, 30*time.Second, func() error {
		if c, err := streamCount(t, js, streams.StreamFPM); err != nil || c < 1000 {
			return fmt.Errorf("%d FPMs stored (%v), want 1000 before the disk fills", c, err)
		}
		return nil
	})
	free := smalldisk.Fill(t, mnt)
	waitHealth(t, metrics, http.StatusServiceUnavailable, 30*time.Second)
	if err := pub.wait(60 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	waitMetric(t, metrics, "fpmbus_bridge_received_total", func(v float64) bool { return v == n }, 30*time.Second)
	if err := up.proc.signal(syscall.SIGTERM, 120*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	data, err := os.ReadFile(spool)
	if err != nil {
		t.Fatalf("no marker spool after a stop on a full disk: %v\n%s", err, up.proc.Output())
	}
	var spooled uint64
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		dm, err := streams.ParseDropMarker([]byte(line))
		if err != nil {
			t.Fatalf("spool line %q: %v", line, err)
		}
		spooled += dm.Count
	}
	if spooled == 0 || !strings.Contains(up.proc.Output(), "drop markers not stored before the stop were spooled") {
		t.Fatalf("the spool names %d FPMs; output:\n%s", spooled, up.proc.Output())
	}

	free()
	metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up2 := startUp(t, 1, args(metrics)...)
	eventually(t, 60*time.Second, func() error {
		if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("the spool is still there (%v)", err)
		}
		return nil
	})
	key := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "fulldisk", DPRank: 0}
	a := accountFor(t, jsClient(t, up2.url), up2.url, key, n)
	if uint64(a.unrevealed) != spooled || a.stored+a.unrevealed != n {
		t.Fatalf("%d stored, %d named by drop markers after the run's last stored FPM; the spool named %d", a.stored, a.unrevealed, spooled)
	}
	t.Logf("%d sent: %d stored before the disk filled, %d dropped, spooled at the stop and named after the restart", n, a.stored, a.unrevealed)
	if err := up2.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
}

// accounting is what accountFor found: per number, stored once or named missing.
type accounting struct {
	stored, named           int
	bridgeDrops, unrevealed int // named by bridge_drop gap events; by drop markers only (after the run's last stored FPM)
	report                  gaps.PublisherReport
}

// accountFor waits until every number 0..n-1 key's publisher sent is stored once or named missing,
// and `gaps report` agrees, number for number: named by a gap event, or (after the run's last stored
// FPM, which no gap event can name) by a drop marker. It fails on a number stored twice, stored and
// named, named twice, or neither.
func accountFor(t *testing.T, js jetstream.JetStream, url string, key streams.Key, n int) accounting {
	t.Helper()
	const byMarker = "dropped after the run's last stored FPM"
	var stored map[uint64]int
	var named map[uint64]string
	var pr gaps.PublisherReport
	eventually(t, 120*time.Second, func() error {
		stored, named = map[uint64]int{}, map[uint64]string{}
		for _, m := range storedFPMs(t, js, streams.FPMSubject(key)) {
			stored[m.seq]++
		}
		for _, e := range gapEvents(t, js) {
			if e.Key != key || e.Type != gaps.TypeGap {
				continue
			}
			for _, r := range gapRanges(e) {
				for q := r[0]; q <= r[1]; q++ {
					if named[q] != "" {
						return fmt.Errorf("number %d named missing twice (%s, %s)", q, named[q], e.Cause)
					}
					named[q] = e.Cause
				}
			}
		}
		var last uint64
		for q := range stored {
			last = max(last, q)
		}
		for _, dm := range dropMarkers(t, js, key) {
			for q := max(dm.FirstSeq, last+1); q <= dm.LastSeq; q++ {
				named[q] = byMarker
			}
		}
		if len(stored)+len(named) != n {
			return fmt.Errorf("%d numbers stored and %d named missing, want %d in all", len(stored), len(named), n)
		}
		pr = reportOf(t, gapsReport(t, url), key)
		if pr.Messages+pr.MissingTotal != uint64(n) {
			return fmt.Errorf("gaps report: %d messages + %d missing, want %d", pr.Messages, pr.MissingTotal, n)
		}
		return nil
	})
	a := accounting{stored: len(stored), named: len(named), report: pr}
	for q := range uint64(n) {
		switch c, cause := stored[q], named[q]; {
		case c > 1:
			t.Fatalf("number %d stored %d times", q, c)
		case c == 1 && cause != "":
			t.Fatalf("number %d is stored and named missing (%s)", q, cause)
		case c == 0 && cause == "":
			t.Fatalf("number %d neither stored nor named missing", q)
		case cause == gaps.CauseBridgeDrop:
			a.bridgeDrops++
		case cause == byMarker:
			a.unrevealed++
		}
	}
	if pr.MissingTotal != uint64(a.named) || pr.Missing.BridgeDrop != uint64(a.bridgeDrops) || pr.DroppedUnrevealed != uint64(a.unrevealed) || pr.LossPercent == 0 {
		t.Fatalf("gaps report: %d messages + %d missing (bridge_drop %d, dropped unrevealed %d, loss %.3f%%), want %d stored + %d named (bridge_drop %d, unrevealed %d)",
			pr.Messages, pr.MissingTotal, pr.Missing.BridgeDrop, pr.DroppedUnrevealed, pr.LossPercent, a.stored, a.named, a.bridgeDrops, a.unrevealed)
	}
	return a
}

// dropMarkers reads the drop markers of k.
func dropMarkers(t *testing.T, js jetstream.JetStream, k streams.Key) []streams.DropMarker {
	t.Helper()
	var out []streams.DropMarker
	for _, m := range natsservertest.Messages(t, js, streams.StreamEvents, streams.DropMarkerSubject(k)) {
		dm, err := streams.ParseDropMarker(m.Data())
		if err != nil {
			t.Fatalf("drop marker %s: %v", m.Data(), err)
		}
		out = append(out, dm)
	}
	return out
}

// The data directory is deleted under a running `fpmbus up` while a publisher sends: within about a
// second /healthz answers 503 naming the deleted store, nothing more is acknowledged, and `up` stops in order and exits 1 with the cause, so that a service
// manager's restart begins a new store instead of acknowledging into deleted files.
func TestUpDeletedDataDirectoryStopsAcknowledgingAndExits(t *testing.T) {
	t.Parallel()
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := startUp(t, 1, "--metrics-addr", metrics)
	waitHealth(t, metrics, http.StatusOK, 30*time.Second)
	publish(t, 1, up.basePort, 1, 100000, "deleted", "--rate", "500")
	waitMetric(t, metrics, "fpmbus_bridge_published_total", func(v float64) bool { return v >= 500 }, 30*time.Second)
	js := jsClient(t, up.url)

	// As `rm -rf` run until it succeeds: the server writes into the tree while it is being removed.
	eventually(t, 30*time.Second, func() error { return os.RemoveAll(up.dataDir) })
	store := filepath.Join(up.dataDir, "jetstream", "jetstream")
	var rep healthReport
	eventually(t, 30*time.Second, func() error {
		code, r, err := getHealth(metrics)
		if err != nil {
			return err
		}
		if _, reason := serverComponent(t, r); code != http.StatusServiceUnavailable || !strings.Contains(reason, store+" was deleted") {
			return fmt.Errorf("/healthz %d: %+v", code, r)
		}
		rep = r
		return nil
	})
	if state, _ := serverComponent(t, rep); state != "degraded" {
		t.Fatalf("the embedded server is %q while up stops, want degraded with the reason", state)
	}
	m, err := scrapeSamples(metrics)
	if err != nil {
		t.Fatal(err)
	}
	if ok, lost := sumSamples(m, "fpmbus_store_ok"), sumSamples(m, "fpmbus_store_faults_total", "state", "lost"); ok != 0 || lost != 1 {
		t.Fatalf("store metrics: ok %v, lost %v", ok, lost)
	}
	// Nothing is acknowledged any more: JetStream was shut down before the fault was reported, and the
	// server, stopped last, still answers while the components stop.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ack, err := js.Publish(ctx, streams.FPMSubject(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "late", DPRank: 0}), []byte("{}")); err == nil {
		t.Fatalf("a publish was acknowledged after the store was lost: %+v", ack)
	}
	err = up.proc.wait(60 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("fpmbus up ended with %v, want exit status 1", err)
	}
	if out := up.proc.Output(); !strings.Contains(out, "JetStream store lost") || !strings.Contains(out, store+" was deleted") {
		t.Fatalf("fpmbus up's output does not name the lost store:\n%s", out)
	}
}

// A store disk too small for the streams' size limits (nats-server gives JetStream 3/4 of what the
// filesystem has available when it starts, and a stream reserves its limit): `up` exits 2 at once,
// naming the limits' flags, the filesystem and the space, instead of restarting its connection until
// the restart limit and saying only "insufficient storage resources".
func TestUpRefusesStreamLimitsTheStoreDiskCannotHold(t *testing.T) {
	t.Parallel()
	mnt := smalldisk.Mount(t, 16<<20)
	out, err := run(t, 60*time.Second, fpmbusBin, "up", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--data-dir", filepath.Join(mnt, "data"), "--trace-output", filepath.Join(t.TempDir(), "fpm"))
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("fpmbus up ended with %v, want exit status 2; output:\n%s", err, out)
	}
	for _, want := range []string{"--max-bytes 10737418240", "--events-max-bytes 1073741824", "filesystem at " + mnt} {
		if !strings.Contains(out, want) {
			t.Fatalf("the message does not name %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "restarting") {
		t.Fatalf("the connection was restarted for a limit no restart can fix:\n%s", out)
	}
}
