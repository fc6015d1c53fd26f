package observe

import (
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// Process is the health of a standalone command's one component (fpmbus bridge, trace, gaps, merge,
// seal, predict-service), reported as `up` reports each of its components: starting until the
// component is ready, ready while it runs, degraded while its NATS connection is not connected (it
// reconnects on its own; nothing is acknowledged meanwhile). The process's server stops with the
// component, so no later state is served. Its methods may be called from any goroutine.
type Process struct {
	name string

	mu    sync.Mutex
	state rungroup.State
	since time.Time
	nc    *nats.Conn
}

// NewProcess returns the health of component name, starting.
func NewProcess(name string) *Process {
	return &Process{name: name, state: rungroup.StateStarting, since: time.Now()}
}

// SetConn makes the connection's state part of the health.
func (p *Process) SetConn(nc *nats.Conn) {
	p.mu.Lock()
	p.nc = nc
	p.mu.Unlock()
}

// Ready marks the component ready.
func (p *Process) Ready() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != rungroup.StateReady {
		p.state, p.since = rungroup.StateReady, time.Now()
	}
}

// Follow marks the component ready once ready is closed, unless done is closed first.
func (p *Process) Follow(ready, done <-chan struct{}) {
	go func() {
		select {
		case <-ready:
			p.Ready()
		case <-done:
		}
	}()
}

// Components is the one component's status (Options.Components).
func (p *Process) Components() []rungroup.Status {
	p.mu.Lock()
	st := rungroup.Status{Name: p.name, State: p.state, Since: p.since}
	nc := p.nc
	p.mu.Unlock()
	if st.State == rungroup.StateReady && nc != nil {
		if s := nc.Status(); s != nats.CONNECTED {
			st.State = rungroup.StateDegraded
			st.Reason = fmt.Sprintf("NATS connection %s", s)
			if err := nc.LastError(); err != nil {
				st.Reason += ": " + err.Error()
			}
			st.Reason += " (it reconnects by itself; nothing is acknowledged meanwhile)"
		}
	}
	return []rungroup.Status{st}
}
