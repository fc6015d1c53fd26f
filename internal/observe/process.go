package observe

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// process is the health of a standalone command's one component (fpmbus bridge, trace, gaps, merge,
// seal, predict-service), reported as `up` reports each of its components: starting until the
// component is ready, ready while it runs, degraded while its NATS connection is not connected (it
// reconnects on its own; nothing is acknowledged meanwhile) or while a check reports a fault (the
// edge bridge's own store disk full: restarting would not free it). The process's server stops with
// the component, so no later state is served. Its methods may be called from any goroutine.
type process struct {
	name string

	mu     sync.Mutex
	state  rungroup.State
	since  time.Time
	nc     *nats.Conn
	checks []func() error
}

// newProcess returns the health of component name, starting.
func newProcess(name string) *process {
	return &process{name: name, state: rungroup.StateStarting, since: time.Now()}
}

// SetConn makes the connection's state part of the health.
func (p *process) SetConn(nc *nats.Conn) {
	p.mu.Lock()
	p.nc = nc
	p.mu.Unlock()
}

// Check adds a fault the component reports itself, as up's components do (rungroup.Instance.Health):
// while check returns an error, a ready component is degraded with the error as the reason.
func (p *process) Check(check func() error) {
	p.mu.Lock()
	p.checks = append(p.checks, check)
	p.mu.Unlock()
}

// Ready marks the component ready.
func (p *process) Ready() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != rungroup.StateReady {
		p.state, p.since = rungroup.StateReady, time.Now()
	}
}

// Follow marks the component ready once ready is closed, unless done is closed first.
func (p *process) Follow(ready, done <-chan struct{}) {
	go func() {
		select {
		case <-ready:
			p.Ready()
		case <-done:
		}
	}()
}

// Components is the one component's status (Options.Components).
func (p *process) Components() []rungroup.Status {
	p.mu.Lock()
	st := rungroup.Status{Name: p.name, State: p.state, Since: p.since}
	nc, checks := p.nc, p.checks
	p.mu.Unlock()
	if st.State != rungroup.StateReady {
		return []rungroup.Status{st}
	}
	var reasons []string
	for _, check := range checks {
		if err := check(); err != nil {
			reasons = append(reasons, err.Error())
		}
	}
	if nc != nil {
		if s := nc.Status(); s != nats.CONNECTED {
			reason := fmt.Sprintf("NATS connection %s", s)
			if err := nc.LastError(); err != nil {
				reason += ": " + err.Error()
			}
			reasons = append(reasons, reason+" (it reconnects by itself; nothing is acknowledged meanwhile)")
		}
	}
	if len(reasons) > 0 {
		st.State, st.Reason = rungroup.StateDegraded, joinReasons(reasons)
	}
	return []rungroup.Status{st}
}
