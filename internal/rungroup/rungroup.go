package rungroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of Component and Policy fields left zero.
const (
	defaultReadyTimeout   = 2 * time.Minute
	defaultStopTimeout    = 30 * time.Second
	defaultInitialBackoff = 500 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	defaultMaxRestarts    = 5
	defaultWindow         = 5 * time.Minute
)

var (
	// ErrGaveUp is wrapped by the error Run returns when a component cannot recover.
	ErrGaveUp = errors.New("rungroup: component cannot recover")
	// errInvalidGroup is wrapped by every error New returns.
	errInvalidGroup = errors.New("rungroup: invalid group")
	// errAlreadyRunning is returned by a second call of Run.
	errAlreadyRunning = errors.New("rungroup: already running")
)

// State is where a component stands.
type State string

const (
	// StateStarting: Start was called (or is about to be) and the incarnation is not ready yet.
	StateStarting State = "starting"
	// StateReady: the incarnation is ready and running.
	StateReady State = "ready"
	// stateRestarting: the component failed, or a component it needs did; it waits to be started again.
	stateRestarting State = "restarting"
	// stateFailed: the component cannot recover; the group is stopping or has stopped.
	stateFailed State = "failed"
	// stateStopped: the group stopped the component for good.
	stateStopped State = "stopped"
	// StateDegraded: the incarnation is ready and running, but its Health reports a fault it is
	// waiting out (a full disk under a server). It is not restarted for it: a restart would not help.
	// Status reports it in place of StateReady; the group itself keeps the component as ready.
	StateDegraded State = "degraded"
	// StateDisabled: the component is part of the process but was not started, for its Reason (a
	// setting it refuses that the process runs on without, as Dynamo does for its trace writer). The
	// process is not healthy while one is disabled: what it should do is not done.
	StateDisabled State = "disabled"
)

// States lists every State, for metrics that have one series per state.
var States = []State{StateStarting, StateReady, StateDegraded, stateRestarting, stateFailed, stateStopped, StateDisabled}

// Instance is one incarnation of a component, built by Component.Start.
type Instance struct {
	// Run runs the incarnation until its context is cancelled, then stops gracefully and returns (nil,
	// or the error of an unclean stop, which is logged). Returning before that is a failure. Required.
	Run func(ctx context.Context) error
	// Ready is closed once the incarnation serves. Nil means Start did all the warm-up: the incarnation
	// is ready as soon as Run is called.
	Ready <-chan struct{}
	// LogAttrs are added to the "<name> ready" log line.
	LogAttrs []any
	// Health, when set, reports a fault of a running incarnation that restarting it would not fix: a
	// non-nil error makes Status report the component StateDegraded, with the error as its Reason,
	// until Health returns nil again. It is called on every Status (every /healthz), from any
	// goroutine, and must return at once (read a value the incarnation keeps up to date). The
	// incarnation logs its faults itself.
	Health func() error
}

// Component is one long-lived part of the process, declared as data.
type Component struct {
	// Name names the component in logs, metrics and Status. Required and unique.
	Name string
	// Needs names earlier components this one is built on: while one of them restarts, this one is
	// stopped, and it is started again (with what the restarted one provides) once that one is ready.
	Needs []string
	// Start builds a fresh incarnation; it is called for the first start and for every restart. Its
	// context bounds the start (ReadyTimeout) and ends once the incarnation is ready: the incarnation's
	// Run gets a context of its own, which the group cancels to stop it. An error marked Permanent
	// makes the group give up at once. Required.
	Start func(ctx context.Context) (Instance, error)
	// ReadyTimeout bounds Start plus the wait for Ready; overrunning it is a failure. Default
	// defaultReadyTimeout.
	ReadyTimeout time.Duration
	// StopTimeout bounds the wait for Run to return once its context is cancelled. Default
	// defaultStopTimeout.
	StopTimeout time.Duration
	// Restart says how failures are retried.
	Restart Policy
	// Disabled, when set, is why the component does not run in this process: it is listed in Status
	// as StateDisabled with Disabled as its Reason and never started (Start may be nil). No component
	// may need a disabled one.
	Disabled string
}

// Policy is a component's restart policy.
type Policy struct {
	// InitialBackoff is the wait before the first restart after a failure; each further failure in a
	// row doubles it (with 20% jitter) up to MaxBackoff. Defaults defaultInitialBackoff and
	// DefaultMaxBackoff. The backoff starts over once the component has had no failure for a Window.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// MaxRestarts is how many restarts the component may take within Window; the failure after that
	// makes the group give up. 0 allows none: the first failure gives up.
	MaxRestarts int
	// Window is the sliding window MaxRestarts counts in. Default defaultWindow.
	Window time.Duration
}

// DefaultPolicy returns the default restart policy.
func DefaultPolicy() Policy {
	return Policy{InitialBackoff: defaultInitialBackoff, MaxBackoff: DefaultMaxBackoff, MaxRestarts: defaultMaxRestarts, Window: defaultWindow}
}

// Permanent marks err as a failure no restart can fix (a setting the component refuses): the group gives
// up at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// option configures a Group.
type option func(*Group)

// WithLogger sends the group's logs to l (default slog.Default()).
func WithLogger(l *slog.Logger) option {
	return func(g *Group) {
		if l != nil {
			g.log = l
		}
	}
}

// Group runs a list of components. Create it with New, run it with Run.
type Group struct {
	units   []*unit
	log     *slog.Logger
	running atomic.Bool
	exits   chan exit
	closed  chan struct{} // closed when Run returns: incarnations stop reporting exits

	mu sync.Mutex // guards every unit's snapshot fields
}

// unit is a component with its supervision state. Fields above the line are owned by Run's goroutine;
// the snapshot fields below are guarded by Group.mu.
type unit struct {
	Component
	needs      []*unit // direct
	dependents []*unit // direct and indirect, in list order
	bo         *backoff.ExponentialBackOff
	failures   []time.Time // within the last Window
	inc        *incarnation
	started    bool

	state    State
	restarts int
	lastErr  string
	since    time.Time
	live     *incarnation // the ready incarnation, for exits seen by the incarnation's goroutine
	health   func() error // the ready incarnation's Health, nil when none or not ready
}

// incarnation is one running Instance.
type incarnation struct {
	cancel   context.CancelFunc
	done     chan struct{} // closed when Run returned; err is set before
	err      error
	stopping atomic.Bool // the group asked it to stop
}

type exit struct {
	u   *unit
	inc *incarnation
}

// New checks the components and returns a group for them. Options: WithLogger. The group's state is
// exported as metrics by whoever serves its Status (internal/observe: fpmbus_component_*), as a
// standalone command's one component is.
func New(components []Component, opts ...option) (*Group, error) {
	g := &Group{log: slog.Default(), exits: make(chan exit), closed: make(chan struct{})}
	for _, o := range opts {
		o(g)
	}
	byName := map[string]*unit{}
	now := time.Now()
	for i, c := range components {
		switch {
		case c.Name == "":
			return nil, fmt.Errorf("%w: component %d has no name", errInvalidGroup, i)
		case byName[c.Name] != nil:
			return nil, fmt.Errorf("%w: component %q listed twice", errInvalidGroup, c.Name)
		case c.Start == nil && c.Disabled == "":
			return nil, fmt.Errorf("%w: component %q has no Start", errInvalidGroup, c.Name)
		case c.Restart.MaxRestarts < 0:
			return nil, fmt.Errorf("%w: component %q: max restarts %d is negative", errInvalidGroup, c.Name, c.Restart.MaxRestarts)
		}
		if c.ReadyTimeout <= 0 {
			c.ReadyTimeout = defaultReadyTimeout
		}
		if c.StopTimeout <= 0 {
			c.StopTimeout = defaultStopTimeout
		}
		if c.Restart.InitialBackoff <= 0 {
			c.Restart.InitialBackoff = defaultInitialBackoff
		}
		if c.Restart.MaxBackoff < c.Restart.InitialBackoff {
			c.Restart.MaxBackoff = max(DefaultMaxBackoff, c.Restart.InitialBackoff)
		}
		if c.Restart.Window <= 0 {
			c.Restart.Window = defaultWindow
		}
		u := &unit{Component: c, state: StateStarting, since: now}
		if c.Disabled != "" {
			u.state = StateDisabled
		}
		for _, n := range c.Needs {
			need := byName[n]
			if need == nil {
				return nil, fmt.Errorf("%w: component %q needs %q, which is not listed before it", errInvalidGroup, c.Name, n)
			}
			if need.Disabled != "" {
				return nil, fmt.Errorf("%w: component %q needs %q, which is disabled", errInvalidGroup, c.Name, n)
			}
			u.needs = append(u.needs, need)
		}
		u.bo = backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(c.Restart.InitialBackoff),
			backoff.WithMaxInterval(c.Restart.MaxBackoff),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0.2),
			backoff.WithMaxElapsedTime(0))
		byName[c.Name] = u
		g.units = append(g.units, u)
	}
	for i, u := range g.units {
		for _, later := range g.units[i+1:] {
			for _, n := range later.needs {
				if n == u || slices.Contains(u.dependents, n) {
					u.dependents = append(u.dependents, later)
					break
				}
			}
		}
	}
	return g, nil
}

// Run starts the components in list order, supervises them until ctx ends, then stops them in reverse
// order and returns nil. If a component cannot recover, Run stops the others the same way and returns
// an error wrapping ErrGaveUp and the component's last error. Run may be called once.
func (g *Group) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errAlreadyRunning
	}
	defer close(g.closed)
	for _, u := range g.units {
		if u.Disabled != "" {
			g.log.Error(u.Name+" disabled: not started", "reason", u.Disabled)
			continue
		}
		if err := g.bringUp(ctx, u, nil); err != nil {
			return g.shutdown(ctx, err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return g.shutdown(ctx, nil)
		case ev := <-g.exits:
			if ev.u.inc != ev.inc {
				continue // an incarnation the group stopped, or one that never became ready
			}
			if err := g.recover(ctx, ev.u); err != nil {
				return g.shutdown(ctx, err)
			}
		}
	}
}

// recover handles the failure of u's running incarnation: it stops what is built on u, restarts u
// after its backoff, then restarts what is built on u.
func (g *Group) recover(ctx context.Context, u *unit) error {
	inc := u.inc
	u.inc = nil
	cause := inc.err
	if cause == nil {
		cause = errors.New("stopped by itself")
	}
	g.log.Error(u.Name+" failed", "error", cause)
	for i := len(u.dependents) - 1; i >= 0; i-- {
		d := u.dependents[i]
		g.stop(d, stateRestarting, nil)
	}
	g.setState(u, stateRestarting, cause)
	if err := g.fail(u, cause); err != nil {
		return err
	}
	if err := g.bringUp(ctx, u, cause); err != nil {
		return err
	}
	for _, d := range u.dependents {
		if d.inc != nil {
			continue
		}
		if err := g.bringUp(ctx, d, nil); err != nil {
			return err
		}
	}
	return nil
}

// bringUp starts u and waits until it is ready, retrying failed starts with backoff. cause, when set,
// is u's failure: the first attempt waits the backoff too. It returns nil with u still down when a
// component u needs is down: that one's failure is pending and its recovery brings u back.
func (g *Group) bringUp(ctx context.Context, u *unit, cause error) error {
	for ctx.Err() == nil {
		if cause != nil {
			wait := u.bo.NextBackOff()
			g.log.Warn(u.Name+" restarting", "in", wait.Round(time.Millisecond), "cause", cause)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		// Checked after the backoff: a failure often shows in a component's users before the component
		// itself has noticed it (a closed connection).
		for _, n := range u.needs {
			if n.inc == nil || isDone(n.inc) {
				g.setState(u, stateRestarting, nil)
				return nil
			}
		}
		if cause == nil && u.started {
			g.log.Warn(u.Name + " restarting: a component it needs restarted")
		}
		if u.started {
			g.countRestart(u)
		}
		err := g.startOnce(ctx, u)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		g.log.Error(u.Name+" did not start", "error", err)
		g.setState(u, stateRestarting, err)
		if err := g.fail(u, err); err != nil {
			return err
		}
		cause = err
	}
	return nil
}

// fail records a failure of u and says whether the group must give up.
func (g *Group) fail(u *unit, err error) error {
	now := time.Now()
	keep := u.failures[:0]
	for _, t := range u.failures {
		if now.Sub(t) < u.Restart.Window {
			keep = append(keep, t)
		}
	}
	u.failures = keep
	if len(u.failures) == 0 {
		u.bo.Reset()
	}
	u.failures = append(u.failures, now)
	var perm *permanentError
	switch {
	case errors.As(err, &perm):
		g.setState(u, stateFailed, err)
		return fmt.Errorf("%w: %s: %w", ErrGaveUp, u.Name, err)
	case len(u.failures) > u.Restart.MaxRestarts:
		g.setState(u, stateFailed, err)
		return fmt.Errorf("%w: %s failed %d times within %v: %w", ErrGaveUp, u.Name, len(u.failures), u.Restart.Window, err)
	}
	return nil
}

// startOnce builds one incarnation of u and waits until it is ready; on any failure nothing of it is
// left running (or it is abandoned after StopTimeout).
func (g *Group) startOnce(ctx context.Context, u *unit) error {
	g.setState(u, StateStarting, nil)
	sctx, cancel := context.WithTimeout(ctx, u.ReadyTimeout)
	defer cancel()
	inst, err := u.Start(sctx)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if inst.Run == nil {
		return Permanent(errors.New("start returned no Run"))
	}
	// Run's context is not ctx's child: the group stops incarnations itself, one at a time, in order.
	rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
	inc := &incarnation{cancel: rcancel, done: make(chan struct{})}
	u.started = true
	go g.runIncarnation(rctx, u, inc, inst.Run)
	ready := inst.Ready
	if ready == nil {
		ready = closedChan
	}
	select {
	case <-ready:
		u.inc = inc
		g.mu.Lock()
		u.live = inc
		u.health = inst.Health
		g.mu.Unlock()
		g.setState(u, StateReady, nil)
		g.log.Info(u.Name+" ready", inst.LogAttrs...)
		return nil
	case <-inc.done:
		rcancel()
		if inc.err == nil {
			return errors.New("Run returned before it was ready")
		}
		return inc.err
	case <-sctx.Done():
		g.halt(u, inc)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("not ready within %v: %w", u.ReadyTimeout, context.DeadlineExceeded)
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// runIncarnation runs one incarnation and reports its end to Run's goroutine (until Run returns).
func (g *Group) runIncarnation(ctx context.Context, u *unit, inc *incarnation, run func(context.Context) error) {
	err := run(ctx)
	inc.err = err
	close(inc.done)
	if !inc.stopping.Load() {
		// Show the failure at once, even while Run's goroutine is busy restarting another component.
		g.mu.Lock()
		if u.live == inc {
			u.live = nil
			g.setStateLocked(u, stateRestarting, err)
		}
		g.mu.Unlock()
	}
	select {
	case g.exits <- exit{u, inc}:
	case <-g.closed:
	}
}

// stop stops u's running incarnation, if any, and leaves u in state; why is recorded as its last error
// when set.
func (g *Group) stop(u *unit, state State, why error) {
	if inc := u.inc; inc != nil {
		u.inc = nil
		g.halt(u, inc)
		g.log.Info(u.Name + " stopped")
	}
	g.setState(u, state, why)
}

// halt cancels one incarnation and waits for its Run, at most StopTimeout.
func (g *Group) halt(u *unit, inc *incarnation) {
	inc.stopping.Store(true)
	g.mu.Lock()
	if u.live == inc {
		u.live = nil
	}
	g.mu.Unlock()
	inc.cancel()
	t := time.NewTimer(u.StopTimeout)
	defer t.Stop()
	select {
	case <-inc.done:
		if inc.err != nil && !errors.Is(inc.err, context.Canceled) {
			g.log.Warn(u.Name+" stopped with an error", "error", inc.err)
		}
	case <-t.C:
		g.log.Error(u.Name+" did not stop in time; abandoned", "stop_timeout", u.StopTimeout)
	}
}

// shutdown stops every component in reverse order and returns cause.
func (g *Group) shutdown(ctx context.Context, cause error) error {
	if cause == nil {
		g.log.Info("stopping", "reason", context.Cause(ctx))
	} else {
		g.log.Error("stopping: a component cannot recover", "error", cause)
	}
	for i := len(g.units) - 1; i >= 0; i-- {
		u := g.units[i]
		if u.Disabled != "" {
			continue // never started: it stays listed as disabled
		}
		state := stateStopped
		g.mu.Lock()
		if u.state == stateFailed {
			state = stateFailed
		}
		g.mu.Unlock()
		g.stop(u, state, nil)
	}
	return cause
}

func isDone(inc *incarnation) bool {
	select {
	case <-inc.done:
		return true
	default:
		return false
	}
}

func (g *Group) countRestart(u *unit) {
	g.mu.Lock()
	u.restarts++
	g.mu.Unlock()
}

func (g *Group) setState(u *unit, s State, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setStateLocked(u, s, err)
}

func (g *Group) setStateLocked(u *unit, s State, err error) {
	if u.state != s {
		u.since = time.Now()
	}
	if s != StateReady {
		u.health = nil // the incarnation it belonged to is not running any more
	}
	u.state = s
	if err != nil {
		u.lastErr = err.Error()
	}
}
