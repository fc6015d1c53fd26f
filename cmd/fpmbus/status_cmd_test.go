package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/internal/smalldisk"
)

// syncBuffer is a buffer a running command writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startCommand runs fpmbus in-process until the returned stop is called (as an interrupt would stop
// it); stop returns its exit status and what it printed.
func startCommand(t *testing.T, args ...string) (stop func() (int, string)) {
	t.Helper()
	t.Setenv(envFPMPort, "")
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	exited := make(chan int, 1)
	go func() { exited <- runMain(ctx, args, out, out) }()
	var once sync.Once
	code := -1
	stop = func() (int, string) {
		once.Do(func() {
			cancel()
			select {
			case code = <-exited:
			case <-time.After(60 * time.Second):
				t.Errorf("fpmbus %v did not stop within a minute of its interrupt:\n%s", args, out)
			}
		})
		return code, out.String()
	}
	t.Cleanup(func() { stop() })
	return stop
}

// scrape returns the status code and body of a GET of addr's path.
func scrape(addr, path string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// eventuallyServes waits until every line is a series of addr's /metrics and check (if any) accepts
// /healthz.
func eventuallyServes(t *testing.T, addr, what string, check func(code int, health string) error, lines ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := func() error {
			code, body, err := scrape(addr, "/metrics")
			if err != nil || code != 200 {
				return fmt.Errorf("/metrics: %d %v", code, err)
			}
			have := map[string]bool{}
			for _, l := range strings.Split(body, "\n") {
				have[l] = true
			}
			for _, l := range lines {
				if !have[l] {
					return fmt.Errorf("/metrics lacks %q", l)
				}
			}
			if check == nil {
				return nil
			}
			code, body, err = scrape(addr, "/healthz")
			if err != nil {
				return err
			}
			return check(code, body)
		}()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A standalone command exports its component's state under the names `up` exports its run group's,
// so the dashboard's component panels read a systemd deployment as they read `up`.
func TestStandaloneBridgeExportsItsComponentState(t *testing.T) {
	env := natsservertest.Start(t)
	ports := freeport.Ports(t, 2)
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	stop := startCommand(t, "bridge", "--server", env.Server.ClientURL(), "--zmq-host", "127.0.0.1", "--fpm-port", strconv.Itoa(ports[1]),
		"--dp-size", "1", "--metrics-addr", addr)
	eventuallyServes(t, addr, "bridge ready", nil,
		`fpmbus_component_state{component="bridge",state="ready"} 1`, `fpmbus_component_state{component="bridge",state="degraded"} 0`,
		`fpmbus_component_ready{component="bridge"} 1`, `fpmbus_component_restarts_total{component="bridge"} 0`)
	if code, out := stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// The edge bridge's own store is watched as `up`'s embedded server's is: its disk filling degrades
// the bridge in /healthz and fpmbus_component_state, fpmbus_store_* say so, and once the disk has room
// again the bridge is ready again, without a restart. Needs root (a real full filesystem, smalldisk).
func TestEdgeBridgeFullDiskDegradesItsHealth(t *testing.T) {
	mnt := smalldisk.Mount(t, 64<<20)
	ports := freeport.Ports(t, 4)
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	stop := startCommand(t, "bridge", "--edge-dir", filepath.Join(mnt, "edge"), "--edge-node", "full",
		"--edge-remote", "nats-leaf://127.0.0.1:"+strconv.Itoa(ports[1]), "--edge-listen", "127.0.0.1:"+strconv.Itoa(ports[2]),
		"--zmq-host", "127.0.0.1", "--fpm-port", strconv.Itoa(ports[3]), "--dp-size", "1", "--max-bytes", "8388608", "--events-max-bytes", "4194304",
		"--metrics-addr", addr)
	healthy := func(code int, body string) error {
		if code != http.StatusOK {
			return fmt.Errorf("/healthz %d: %s", code, body)
		}
		return nil
	}
	eventuallyServes(t, addr, "edge bridge ready", healthy, `fpmbus_store_ok 1`, `fpmbus_component_state{component="bridge",state="ready"} 1`)

	free := smalldisk.Fill(t, mnt)
	eventuallyServes(t, addr, "edge disk full", func(code int, body string) error {
		if code != http.StatusServiceUnavailable || !strings.Contains(body, `"degraded"`) || !strings.Contains(body, "disk full") ||
			!strings.Contains(body, filepath.Join(mnt, "edge")) {
			return fmt.Errorf("/healthz %d: %s", code, body)
		}
		return nil
	}, `fpmbus_store_ok 0`, `fpmbus_store_faults_total{state="disk_full"} 1`, `fpmbus_component_state{component="bridge",state="degraded"} 1`)
	code, body, err := scrape(addr, "/status.json")
	var st observe.Status
	if err != nil || code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Store == nil || st.Store.OK || st.Store.Faults["disk_full"] != 1 {
		t.Fatalf("/status.json with the edge disk full: %d %v %s", code, err, body)
	}

	free()
	eventuallyServes(t, addr, "edge disk freed", healthy, `fpmbus_store_ok 1`, `fpmbus_component_state{component="bridge",state="ready"} 1`)
	if code, out := stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
