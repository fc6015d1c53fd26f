package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

var receivedOn = regexp.MustCompile(`Received on "([^"]+)"`)

// `nats sub 'fpm.*.*.*.1'` shows readable JSON for rank 1 only, with fpmbus's headers, and
// `nats stream view` shows the stored messages the same way.
func TestNatsCLISubAndStreamView(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	up := startUp(t, 2)
	sub := start(t, "nats sub", natsBin, "--server", up.url, "sub", "fpm.*.*.*.1", "--count", "10")
	sub.waitOutput("Subscribing on", 15*time.Second)
	if err := publish(t, 1, up.basePort, 2, 20, "cli", "--rate", "200").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	if err := sub.wait(30 * time.Second); err != nil {
		t.Fatalf("nats sub: %v\n%s", err, sub.Output())
	}
	out := sub.Output()
	subjects := receivedOn.FindAllStringSubmatch(out, -1)
	if len(subjects) != 10 {
		t.Fatalf("nats sub printed %d messages, want 10:\n%s", len(subjects), out)
	}
	for _, m := range subjects {
		if m[1] != "fpm.dynamo.backend.cli.1" {
			t.Fatalf("nats sub received %q, want rank 1 only", m[1])
		}
	}
	bodies := 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var fpm struct {
			DPRank   *int   `json:"dp_rank"`
			WorkerID string `json:"worker_id"`
		}
		if err := json.Unmarshal([]byte(line), &fpm); err != nil {
			t.Fatalf("body is not JSON: %v\n%s", err, line)
		}
		if fpm.DPRank == nil || *fpm.DPRank != 1 || fpm.WorkerID != "cli" {
			t.Fatalf("body %s", line)
		}
		bodies++
	}
	if bodies != 10 {
		t.Fatalf("found %d JSON bodies, want 10", bodies)
	}
	for _, h := range []string{streams.HeaderMsgID, streams.HeaderSeq, streams.HeaderReceivedAt, streams.HeaderEpoch, streams.HeaderDPRank} {
		if strings.Count(out, h+": ") != 10 {
			t.Fatalf("header %s not on every message:\n%s", h, out)
		}
	}

	// nats stream view pages interactively and needs a terminal: give it one with script(1). Rank 1
	// holds 20 messages, fewer than a page, so it reaches the end by itself.
	js := jsClient(t, up.url)
	waitStreamCount(t, js, streams.StreamFPM, 40, 30*time.Second)
	script, err := exec.LookPath("script")
	if err != nil {
		t.Fatalf("script(1) (util-linux) is needed to give nats stream view a terminal: %v", err)
	}
	view, err := run(t, 30*time.Second, script, "-qec", natsBin+" --server "+up.url+" stream view FPM 25 --subject 'fpm.*.*.*.1'", "/dev/null")
	if err != nil {
		t.Fatalf("nats stream view: %v\n%s", err, view)
	}
	if n := strings.Count(view, "Subject: fpm.dynamo.backend.cli.1 "); n != 20 {
		t.Fatalf("nats stream view showed %d rank-1 messages, want 20:\n%s", n, view)
	}
	if strings.Contains(view, "fpm.dynamo.backend.cli.0") || strings.Count(view, "Fpm-Seq: ") != 20 || !strings.Contains(view, `{"version":1,"worker_id":"cli","dp_rank":1,`) {
		t.Fatalf("nats stream view output:\n%s", view)
	}
}

// The JSON of `fpmbus streams show --stream NAME` is accepted by `nats stream add --config`, and the
// stream it creates matches what fpmbus applies.
func TestStreamsShowFeedsNatsStreamAdd(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	dir := t.TempDir()
	for _, name := range []string{streams.StreamFPM, streams.StreamEvents, streams.StreamBench} {
		cfgJSON, err := run(t, 10*time.Second, fpmbusBin, "streams", "show", "--stream", name, "--duplicate-window", "45s")
		if err != nil {
			t.Fatalf("streams show: %v\n%s", err, cfgJSON)
		}
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, []byte(cfgJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := run(t, 20*time.Second, natsBin, "--server", srv.ClientURL(), "stream", "add", name, "--config", path); err != nil {
			t.Fatalf("nats stream add %s: %v\n%s", name, err, out)
		}
		info, err := run(t, 20*time.Second, natsBin, "--server", srv.ClientURL(), "stream", "info", name, "--json")
		if err != nil {
			t.Fatalf("nats stream info: %v\n%s", err, info)
		}
		var si struct {
			Config struct {
				Subjects  []string `json:"subjects"`
				Duplicate int64    `json:"duplicate_window"`
			} `json:"config"`
		}
		if err := json.Unmarshal([]byte(info), &si); err != nil {
			t.Fatalf("stream info JSON: %v\n%s", err, info)
		}
		if si.Config.Duplicate != int64(45*time.Second) || len(si.Config.Subjects) != 1 {
			t.Fatalf("%s created with %+v", name, si.Config)
		}
	}
	// fpmbus streams apply on the stream nats created is an idempotent update.
	if out, err := run(t, 20*time.Second, fpmbusBin, "streams", "apply", "--server", srv.ClientURL(), "--duplicate-window", "45s"); err != nil {
		t.Fatalf("streams apply: %v\n%s", err, out)
	}
}
