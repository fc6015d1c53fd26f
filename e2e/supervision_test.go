package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

// healthReport is the body of `fpmbus up`'s /healthz.
type healthReport struct {
	Status     string `json:"status"`
	Components []struct {
		Name      string `json:"name"`
		State     string `json:"state"`
		Restarts  int    `json:"restarts"`
		LastError string `json:"last_error"`
		Reason    string `json:"reason"`
	} `json:"components"`
}

// getHealth reads /healthz: the status code and the decoded report.
func getHealth(addr string) (int, healthReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, healthReport{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, healthReport{}, err
	}
	var rep healthReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return resp.StatusCode, rep, fmt.Errorf("healthz body %q: %w", body, err)
	}
	return resp.StatusCode, rep, nil
}

// waitHealth polls /healthz until it answers code, and returns that report.
func waitHealth(t *testing.T, addr string, code int, d time.Duration) healthReport {
	t.Helper()
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		got, rep, err := getHealth(addr)
		if err == nil && got == code {
			return rep
		}
		last = fmt.Sprintf("%d %+v %v", got, rep, err)
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("/healthz did not answer %d within %v; last: %s", code, d, last)
	return healthReport{}
}

// The components' NATS connection closes for good (the --fault-sigusr1 drill closes it, as a lost
// broker session would): `fpmbus up` replaces it and restarts every component built on it. /healthz
// answers 503 while they restart and 200 once all are ready; the restarts are counted in /metrics; FPMs
// published after the recovery reach the stream and the trace, and no FPM is written twice.
func TestUpReplacesAClosedConnectionAndRecovers(t *testing.T) {
	t.Parallel()
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	up := startUp(t, 1, "--metrics-addr", metrics, "--fault-sigusr1", "--restart-backoff", "1s")
	rep := waitHealth(t, metrics, http.StatusOK, 30*time.Second)
	if rep.Status != "ok" || len(rep.Components) != 8 {
		t.Fatalf("healthy report: %+v", rep)
	}
	const perRun = 300
	if err := publish(t, 1, up.basePort, 1, perRun, "before", "--rate", "1000").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher before: %v", err)
	}
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, perRun, 30*time.Second)
	eventually(t, 30*time.Second, func() error { // written and acked within the flush interval
		if lines := traceLines(t, up.traceOut+".before.*.jsonl.gz"); len(lines) != perRun {
			return fmt.Errorf("trace of the first publisher has %d lines, want %d", len(lines), perRun)
		}
		return nil
	})

	if err := up.proc.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	rep = waitHealth(t, metrics, http.StatusServiceUnavailable, 10*time.Second)
	if rep.Status != "unavailable" {
		t.Fatalf("while restarting: %+v", rep)
	}
	rep = waitHealth(t, metrics, http.StatusOK, 60*time.Second)
	for _, c := range rep.Components {
		switch {
		case c.State != "ready":
			t.Fatalf("after recovery %s is %s: %+v", c.Name, c.State, rep)
		case c.Name == "embedded server" && c.Restarts != 0:
			t.Fatalf("the server was restarted: %+v", c)
		case c.Name != "embedded server" && c.Restarts < 1:
			t.Fatalf("%s was not restarted: %+v", c.Name, c)
		}
	}
	samples, err := scrapeSamples(metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nats connection", "trace writer", "gap detector", "benchmark merger", "dataset sealer", "predict service", "bridge"} {
		if n := sumSamples(samples, "fpmbus_component_restarts_total", "component", name); n < 1 {
			t.Fatalf("fpmbus_component_restarts_total{component=%q} = %v, want >= 1", name, n)
		}
	}

	// The new bridge, on the new connection, stores what is published now.
	if err := publish(t, 1, up.basePort, 1, perRun, "after", "--rate", "1000").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher after: %v", err)
	}
	after := 0
	eventually(t, 30*time.Second, func() error {
		after = 0
		for _, m := range storedFPMs(t, js, ">") {
			if m.key.WorkerID == "after" {
				after++
			}
		}
		if after != perRun {
			return fmt.Errorf("%d FPMs of the second publisher stored, want %d", after, perRun)
		}
		return nil
	})
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	if lines := traceLines(t, up.traceOut+".after.*.jsonl.gz"); len(lines) != perRun {
		t.Fatalf("trace of the second publisher has %d lines, want %d", len(lines), perRun)
	}
	if lines := traceLines(t, up.traceOut+".before.*.jsonl.gz"); len(lines) != perRun {
		t.Fatalf("trace of the first publisher has %d lines after the restarts, want %d (each once)", len(lines), perRun)
	}
}

// A component that cannot recover (here: --restart-limit 0, so its first failure) stops the others
// gracefully, in order, and the process exits 1 instead of running on with a dead component: what the
// trace writer had received is on disk.
func TestUpExitsNonzeroWhenAComponentCannotRecover(t *testing.T) {
	t.Parallel()
	up := startUp(t, 1, "--fault-sigusr1", "--restart-limit", "0")
	const n = 200
	if err := publish(t, 1, up.basePort, 1, n, "doomed", "--rate", "1000").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, n, 30*time.Second)
	eventually(t, 30*time.Second, func() error { // the trace writer flushes within its flush interval
		if lines := traceLines(t, up.traceOut+".doomed.*.jsonl.gz"); len(lines) != n {
			return fmt.Errorf("trace has %d lines, want %d", len(lines), n)
		}
		return nil
	})
	if err := up.proc.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	err := up.proc.wait(60 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("fpmbus up ended with %v, want exit status 1", err)
	}
	if lines := traceLines(t, up.traceOut+".doomed.*.jsonl.gz"); len(lines) != n {
		t.Fatalf("trace has %d lines after the stop, want %d", len(lines), n)
	}
}
