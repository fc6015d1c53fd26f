package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
)

// `DYN_FPM_MODE=ful fpmbus up`: the trace writer cannot run, the rest runs on (Dynamo's rule), and
// nothing pretends otherwise: /healthz answers 503 "degraded" listing the trace writer "disabled" with
// the reason naming the variable, the status and the page say so, and the log says it at error level.
func TestUpListsADisabledTraceWriterAsDegraded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	base := producertest.FreeBasePort(t, "", 1)
	up := startEnv(t, "fpmbus up", []string{"DYN_FPM_MODE=ful"}, fpmbusBin, "up", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"--data-dir", filepath.Join(dir, "data"), "--fpm-port", strconv.Itoa(base), "--dp-size", "1",
		"--trace-output", filepath.Join(dir, "trace", "fpm"), "--metrics-addr", metrics)
	up.waitOutput("bridge ready", 30*time.Second)

	rep := waitHealth(t, metrics, http.StatusServiceUnavailable, 10*time.Second)
	if rep.Status != "degraded" || len(rep.Components) != 8 {
		t.Fatalf("health %+v", rep)
	}
	for _, c := range rep.Components {
		switch {
		case c.Name == "trace writer":
			if c.State != "disabled" || !strings.Contains(c.Reason, `DYN_FPM_MODE="ful"`) || !strings.Contains(c.Reason, "want sampled or full") {
				t.Fatalf("trace writer %+v", c)
			}
		case c.State != "ready":
			t.Fatalf("%s is %s: only the trace writer is out", c.Name, c.State)
		}
	}
	st, err := getStatus(metrics, "")
	if err != nil || st.Health != "degraded" {
		t.Fatalf("status: %v %+v", err, st)
	}
	code, page, err := httpGet(metrics, "/")
	if err != nil || code != http.StatusOK || !strings.Contains(string(page), `<tr data-component="trace writer" data-state="disabled">`) {
		t.Fatalf("page: %d %v", code, err)
	}
	out := up.Output()
	if !strings.Contains(out, `level=ERROR msg="trace writer disabled`) || strings.Contains(out, `level=WARN msg="trace writer disabled`) {
		t.Fatalf("the disabled trace writer is not logged as an error:\n%s", out)
	}
}

// Every long-running command serves the same four endpoints with --metrics-addr: /metrics with its
// component's metrics, /healthz (ready once it runs), /status.json and the page with its part. Health
// is honest: with the server gone each reports its component degraded, naming the NATS connection.
func TestEveryLongRunningCommandServesMetricsHealthAndStatus(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	dir := t.TempDir()
	base := producertest.FreeBasePort(t, "", 1)
	type cmd struct {
		component string
		args      []string
		metric    string // a family of its own in /metrics
		section   string // its part of /status.json
	}
	cmds := map[string]cmd{
		"bridge": {"bridge", []string{"--fpm-port", strconv.Itoa(base), "--dp-size", "1"}, "fpmbus_bridge_received_total", `"bridge":{`},
		"trace": {"trace writer", []string{"--trace-mode", "full", "--trace-output", filepath.Join(dir, "trace", "fpm")},
			"fpmbus_trace_written_total", `"consumers":[{"name":"trace"`},
		"gaps":            {"gap detector", nil, "fpmbus_gaps_events_total", `"publishers":{`},
		"merge":           {"benchmark merger", []string{"--bench-output", filepath.Join(dir, "m_{run_id}.json"), "--spool-dir", t.TempDir()}, "fpmbus_merge_runs_total", `"merge":{`},
		"seal":            {"dataset sealer", nil, "fpmbus_seal_runs_total", `"seal":{`},
		"predict-service": {"predict service", nil, "fpmbus_predict_answers_total", `"predict":{`},
	}
	addrs := map[string]string{}
	for name, c := range cmds {
		addrs[name] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		fpmbus(t, "fpmbus "+name, append([]string{name, "--server", url, "--metrics-addr", addrs[name]}, c.args...)...)
	}
	for name, c := range cmds {
		addr := addrs[name]
		rep := waitHealth(t, addr, http.StatusOK, 30*time.Second)
		if rep.Status != "ok" || len(rep.Components) != 1 || rep.Components[0].Name != c.component || rep.Components[0].State != "ready" {
			t.Fatalf("%s: health %+v", name, rep)
		}
		code, body, err := httpGet(addr, "/metrics")
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), "\n"+c.metric) || !strings.Contains(string(body), "process_cpu_seconds_total") {
			t.Fatalf("%s: /metrics %d %v lacks %s", name, code, err, c.metric)
		}
		code, body, err = httpGet(addr, "/status.json")
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"process":"`+name+`"`) || !strings.Contains(string(body), c.section) {
			t.Fatalf("%s: /status.json %d %v lacks %s: %.500s", name, code, err, c.section, body)
		}
		code, body, err = httpGet(addr, "/")
		if err != nil || code != http.StatusOK || !strings.Contains(string(body), `<tr data-component="`+c.component+`" data-state="ready">`) {
			t.Fatalf("%s: page %d %v", name, code, err)
		}
	}

	env.Server.NATS().Shutdown() // the broker goes away; every command waits for it, reconnecting
	for name, c := range cmds {
		rep := waitHealth(t, addrs[name], http.StatusServiceUnavailable, 30*time.Second)
		if rep.Status != "degraded" || rep.Components[0].Name != c.component || rep.Components[0].State != "degraded" ||
			!strings.Contains(rep.Components[0].Reason, "NATS connection") {
			t.Fatalf("%s with the server gone: %+v", name, rep)
		}
	}
}
