// Package e2e runs fpmbus end to end on real parts: the fpmbus binary (built once per test run), real
// libzmq sockets, a real JetStream server and the real `nats` CLI. Everything binds loopback only.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
	"github.com/fpmbus/fpmbus/internal/fsutil/locktest"
)

var (
	fpmbusBin string // built in TestMain
	natsBin   string // the real nats CLI (FPMBUS_NATS_BIN, ../bin/nats, or PATH)
)

func TestMain(m *testing.M) {
	locktest.MaybeHold() // the test binary run as a second process holding a lock file (locktest.Start)
	dir, err := os.MkdirTemp("", "fpmbus-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fpmbusBin = filepath.Join(dir, "fpmbus")
	build := exec.Command("go", "build", "-o", fpmbusBin, "../cmd/fpmbus")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building fpmbus:", err)
		os.Exit(1)
	}
	natsBin = findNATS()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func findNATS() string {
	if p := os.Getenv("FPMBUS_NATS_BIN"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../bin/nats"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	return ""
}

// requireNATS fails (never skips) when the nats CLI is missing: the README's test command installs it.
func requireNATS(t *testing.T) {
	t.Helper()
	if natsBin == "" {
		t.Fatal("the nats CLI is not installed: run the tests through `./taskw test`, which installs it into ./bin")
	}
}

// freePort returns a loopback TCP port that was free a moment ago, from below the ephemeral range
// (internal/freeport): a port the kernel hands to ":0" can be taken by any outgoing connection of the
// processes a test starts before the component it is meant for binds it.
func freePort(t testing.TB) int {
	t.Helper()
	return freeport.Ports(t, 1)[0]
}

// proc is one running fpmbus (or nats) process; its output goes to a buffer shown on failure.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output returns everything the process printed so far.
func (p *proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs bin with args; the process is killed at test cleanup if still running.
func start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, nil, bin, args...)
}

// startEnv is start with extra environment variables (NAME=value) on top of testEnv.
func startEnv(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.Env = append(testEnv(t), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", p.name, p.Output())
		}
	})
	return p
}

func fpmbus(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return start(t, name, fpmbusBin, args...)
}

// testEnv isolates child processes from the developer's environment (nats contexts, DYN_* variables).
func testEnv(t testing.TB) []string {
	home := t.TempDir()
	env := []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "PATH=" + os.Getenv("PATH")}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOCOVERDIR=") {
			env = append(env, kv)
		}
	}
	return env
}

// signal sends sig and waits up to d for the process to exit; it fails the test on timeout.
func (p *proc) signal(sig syscall.Signal, d time.Duration) error {
	p.t.Helper()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("%s did not exit within %v after %v", p.name, d, sig)
		return nil
	}
}

// wait waits for the process to exit by itself.
func (p *proc) wait(d time.Duration) error {
	p.t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.t.Fatalf("%s did not finish within %v", p.name, d)
		return nil
	}
}

// waitOutput waits until the process has printed substr.
func (p *proc) waitOutput(substr string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(p.Output(), substr) {
			return
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %q", p.name, p.err, substr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	p.t.Fatalf("%s did not print %q within %v", p.name, substr, d)
}

// run runs a command to completion with a timeout and returns its combined output.
func run(t testing.TB, d time.Duration, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = testEnv(t)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// eventually retries f until it returns nil or d passes.
func eventually(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("condition not met within %v: %v", d, err)
}
