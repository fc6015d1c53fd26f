package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
)

// An address `fpmbus up` must listen on that another process holds is refused at once, before anything
// starts: exit status 2, a message naming the flag, the address, "address already in use" and the
// process holding it (here this test), and no component started or restarted. A taken port cannot be
// fixed by restarting, so it must never look like a crash loop.
func TestUpRefusesATakenAddressAtOnce(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args func(taken, free int) []string
		flag string
	}{
		"--listen": {
			args: func(taken, _ int) []string { return []string{"--listen", fmt.Sprintf("127.0.0.1:%d", taken)} },
			flag: "--listen",
		},
		"--metrics-addr": {
			args: func(taken, free int) []string {
				return []string{"--listen", fmt.Sprintf("127.0.0.1:%d", free), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", taken)}
			},
			flag: "--metrics-addr",
		},
		"--demo's --fpm-port": {
			args: func(taken, free int) []string {
				return []string{"--listen", fmt.Sprintf("127.0.0.1:%d", free), "--demo", "--dp-size", "2", "--fpm-port", strconv.Itoa(taken - 1)}
			},
			flag: "--fpm-port",
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ports := freeport.Ports(t, 2)
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			dataDir := filepath.Join(t.TempDir(), "data")
			args := append([]string{"up", "--data-dir", dataDir, "--trace-output", filepath.Join(t.TempDir(), "fpm")}, tc.args(ports[0], ports[1])...)
			out, err := run(t, 60*time.Second, fpmbusBin, args...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("fpmbus up ended with %v, want exit status 2; output:\n%s", err, out)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
			for _, want := range []string{tc.flag, addr, "address already in use"} {
				if !strings.Contains(out, want) {
					t.Fatalf("the message does not name %q:\n%s", want, out)
				}
			}
			if !strings.Contains(out, fmt.Sprintf("held by pid %d", os.Getpid())) {
				t.Fatalf("the message does not name this test (pid %d) as the holder:\n%s", os.Getpid(), out)
			}
			if strings.Contains(out, "restarting") || strings.Contains(out, " ready") {
				t.Fatalf("a component was started or restarted before the refusal:\n%s", out)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the data directory was created before the refusal: %v", err)
			}
		})
	}
}
