package e2e

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// restartSec is the shipped units' RestartSec (ops/systemd/fpmbus-*.service).
const restartSec = 2 * time.Second

// supervised runs an fpmbus component the way the shipped systemd units do (Restart=on-failure,
// RestartSec=2s): a run that exits with an error or a signal is started again after restartSec; a
// clean exit, or one the test asked for with stop, is final. Every run's output is kept and shown when
// the test fails.
type supervised struct {
	t    testing.TB
	name string
	args []string

	mu       sync.Mutex
	cur      *proc
	runs     []*proc
	failures []string // each failed run's exit status and last output line
	stopping bool

	quit chan struct{}
	done chan struct{}
}

// superviseFpmbus starts `fpmbus args...` under supervision and waits until its first run printed ready.
func superviseFpmbus(t testing.TB, name, ready string, args ...string) *supervised {
	t.Helper()
	s := &supervised{t: t, name: name, args: args, quit: make(chan struct{}), done: make(chan struct{})}
	first, err := s.launch()
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go s.loop(first)
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		if t.Failed() {
			for i, p := range s.runs {
				t.Logf("--- output of %s, run %d:\n%s", s.name, i+1, p.Output())
			}
		}
	})
	first.waitOutput(ready, 30*time.Second)
	return s
}

// launch starts one run (no t.Fatal: it runs on the supervision goroutine too).
func (s *supervised) launch() (*proc, error) {
	p := &proc{t: s.t, name: s.name, done: make(chan struct{})}
	p.cmd = exec.Command(fpmbusBin, s.args...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.Env = testEnv(s.t)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	s.mu.Lock()
	s.cur = p
	s.runs = append(s.runs, p)
	s.mu.Unlock()
	return p, nil
}

func (s *supervised) loop(p *proc) {
	defer close(s.done)
	for {
		select {
		case <-s.quit:
			return
		case <-p.done:
		}
		s.mu.Lock()
		stopping := s.stopping
		if !stopping && p.err != nil {
			out := strings.TrimSpace(p.Output())
			s.failures = append(s.failures, p.err.Error()+": "+out[strings.LastIndex(out, "\n")+1:])
		}
		s.mu.Unlock()
		if stopping || p.err == nil {
			return
		}
		select {
		case <-s.quit:
			return
		case <-time.After(restartSec):
		}
		np, err := s.launch()
		if err != nil {
			s.mu.Lock()
			s.failures = append(s.failures, "restart: "+err.Error())
			s.mu.Unlock()
			return
		}
		p = np
	}
}

// current is the running (or last) run.
func (s *supervised) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// failed lists the runs that failed (and were restarted), each with its exit status and last line.
func (s *supervised) failed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.failures...)
}

// kill sends sig to the current run without stopping supervision: a crash the unit restarts.
func (s *supervised) kill(sig syscall.Signal) {
	_ = s.current().cmd.Process.Signal(sig)
}

// stop ends supervision, sends sig to the current run and waits for it; it returns the run's exit error.
func (s *supervised) stop(sig syscall.Signal) error {
	s.mu.Lock()
	already := s.stopping
	s.stopping = true
	s.mu.Unlock()
	if !already {
		close(s.quit)
	}
	<-s.done
	p := s.current()
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return p.err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return p.err
	}
}

// cpu is the CPU time every run has used so far: finished runs from their exit status, the running
// one from /proc.
func (s *supervised) cpu(tb testing.TB) time.Duration {
	s.mu.Lock()
	runs := append([]*proc(nil), s.runs...)
	s.mu.Unlock()
	var total time.Duration
	for _, p := range runs {
		select {
		case <-p.done:
			total += p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()
		default:
			total += procCPU(tb, p.cmd.Process.Pid)
		}
	}
	return total
}
