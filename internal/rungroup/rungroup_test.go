package rungroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The components here are fakes: the group's contract (order, readiness, restarts, deadlines) is what is
// under test, and a fake is the only way to make a component fail on cue.

// journal records what happened, in order, across every fake of a test.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	j.events = append(j.events, fmt.Sprintf(format, args...))
	j.mu.Unlock()
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// fake is a component whose incarnations the test drives. Each Start journals "start <name>#<n>" and
// returns an incarnation that becomes ready at once (autoReady) or when the test calls markReady, fails
// when the test calls failWith, and journals "stop <name>#<n>" when its context is cancelled.
type fake struct {
	name      string
	j         *journal
	autoReady bool
	// startErr, when set, is the error of the n-th start (1-based), nil to succeed.
	startErr func(n int) error
	// startGate, when set, makes Start wait for a value before building the incarnation.
	startGate chan struct{}
	// ignoreStop makes Run ignore its context until release is closed.
	ignoreStop bool
	release    chan struct{}
	// resource, when set, is read at Start and journaled ("start x#2 conn=2").
	resource func() int
	// health, when set, is every incarnation's Health.
	health func() error

	mu      sync.Mutex
	starts  int
	incs    []*fakeInc
	started chan *fakeInc
}

type fakeInc struct {
	n     int
	ready chan struct{}
	fail  chan error
	once  sync.Once
	f     *fake
}

func newFake(j *journal, name string, autoReady bool) *fake {
	return &fake{name: name, j: j, autoReady: autoReady, started: make(chan *fakeInc, 100), release: make(chan struct{})}
}

func (f *fake) component() Component {
	return Component{Name: f.name, Start: f.start, StopTimeout: 5 * time.Second, ReadyTimeout: 10 * time.Second,
		Restart: Policy{InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, MaxRestarts: 10, Window: time.Minute}}
}

func (f *fake) start(ctx context.Context) (Instance, error) {
	f.mu.Lock()
	f.starts++
	n := f.starts
	f.mu.Unlock()
	if f.startGate != nil {
		select {
		case <-f.startGate:
		case <-ctx.Done():
			return Instance{}, ctx.Err()
		}
	}
	suffix := ""
	if f.resource != nil {
		suffix = fmt.Sprintf(" conn=%d", f.resource())
	}
	f.j.add("start %s#%d%s", f.name, n, suffix)
	if f.startErr != nil {
		if err := f.startErr(n); err != nil {
			return Instance{}, err
		}
	}
	inc := &fakeInc{n: n, ready: make(chan struct{}), fail: make(chan error, 1), f: f}
	if f.autoReady {
		inc.markReady()
	}
	f.mu.Lock()
	f.incs = append(f.incs, inc)
	f.mu.Unlock()
	f.started <- inc
	return Instance{Ready: inc.ready, Run: inc.run, Health: f.health}, nil
}

func (inc *fakeInc) markReady() {
	inc.once.Do(func() {
		inc.f.j.add("ready %s#%d", inc.f.name, inc.n)
		close(inc.ready)
	})
}

func (inc *fakeInc) failWith(err error) { inc.fail <- err }

func (inc *fakeInc) run(ctx context.Context) error {
	if inc.f.ignoreStop {
		<-inc.f.release
		return nil
	}
	select {
	case <-ctx.Done():
		inc.f.j.add("stop %s#%d", inc.f.name, inc.n)
		return nil
	case err := <-inc.fail:
		inc.f.j.add("fail %s#%d", inc.f.name, inc.n)
		return err
	}
}

// next waits for the fake's next incarnation.
func (f *fake) next(t *testing.T) *fakeInc {
	t.Helper()
	select {
	case inc := <-f.started:
		return inc
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no new incarnation within 10s", f.name)
		return nil
	}
}

func (f *fake) startCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// runGroup runs g in the background. stop cancels it and returns Run's error; done is closed when Run
// returned, with its error in *runErr.
func runGroup(t *testing.T, g *Group) (stop func() error, done <-chan struct{}, runErr *error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	var err error
	go func() { err = g.Run(ctx); close(ended) }()
	stop = func() error {
		cancel()
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of its context's end")
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, ended, &err
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitState waits until component name is in state s.
func waitState(t *testing.T, g *Group, name string, s State) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, st := range g.Status() {
			if st.Name == name && st.State == s {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%s never reached state %s: %+v", name, s, g.Status())
}

func health(t *testing.T, g *Group) (int, HealthReport) {
	t.Helper()
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var rep HealthReport
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("health body %q: %v", rec.Body.String(), err)
	}
	return rec.Code, rep
}

func states(rep HealthReport) map[string]State {
	m := map[string]State{}
	for _, c := range rep.Components {
		m[c.Name] = c.State
	}
	return m
}

func TestGroupStartsInListOrderEachAfterThePreviousIsReadyAndStopsInReverse(t *testing.T) {
	j := &journal{}
	a, b, c := newFake(j, "a", false), newFake(j, "b", false), newFake(j, "c", true)
	g, err := New([]Component{a.component(), b.component(), c.component()}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	ia := a.next(t)
	time.Sleep(20 * time.Millisecond) // a group that did not wait would start b meanwhile
	ia.markReady()
	ib := b.next(t)
	time.Sleep(20 * time.Millisecond)
	ib.markReady()
	waitState(t, g, "c", StateReady)
	if code, rep := health(t, g); code != http.StatusOK || rep.Status != "ok" {
		t.Fatalf("all ready: health %d %+v", code, rep)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{"start a#1", "ready a#1", "start b#1", "ready b#1", "start c#1", "ready c#1", "stop c#1", "stop b#1", "stop a#1"}
	if got := j.list(); !slices.Equal(got, want) {
		t.Fatalf("journal\n got %q\nwant %q", got, want)
	}
	code, rep := health(t, g)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("after stop: health %d, want 503", code)
	}
	for name, s := range states(rep) {
		if s != stateStopped {
			t.Fatalf("after stop: %s is %s, want stopped", name, s)
		}
	}
}

func TestGroupRestartsAFailedComponentAndWhatNeedsItWithItsNewResource(t *testing.T) {
	j := &journal{}
	conn, user, loner := newFake(j, "conn", true), newFake(j, "user", true), newFake(j, "loner", true)
	user.resource = conn.startCount // the "connection" a user gets is the conn incarnation current at its start
	cc, uc, lc := conn.component(), user.component(), loner.component()
	uc.Needs = []string{"conn"}
	g, err := New([]Component{cc, uc, lc}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	c1 := conn.next(t)
	user.next(t)
	loner.next(t)
	waitState(t, g, "loner", StateReady)

	conn.startGate = make(chan struct{}) // hold the restart so the intermediate state is observable
	c1.failWith(errors.New("connection closed for good"))
	waitState(t, g, "conn", StateStarting)
	code, rep := health(t, g)
	if code != http.StatusServiceUnavailable || rep.Status != "unavailable" {
		t.Fatalf("while restarting: health %d %+v", code, rep)
	}
	if s := states(rep); s["conn"] != StateStarting || s["user"] != stateRestarting || s["loner"] != StateReady {
		t.Fatalf("while restarting: states %v", s)
	}
	close(conn.startGate)
	conn.next(t)
	user.next(t)
	waitState(t, g, "user", StateReady)
	if code, _ := health(t, g); code != http.StatusOK {
		t.Fatalf("after recovery: health %d", code)
	}
	restarts := map[string]int{}
	for _, s := range g.Status() {
		restarts[s.Name] = s.Restarts
	}
	for name, want := range map[string]int{"conn": 1, "user": 1, "loner": 0} {
		if got := restarts[name]; got != want {
			t.Errorf("restarts of %s = %v, want %v", name, got, want)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{
		"start conn#1", "ready conn#1", "start user#1 conn=1", "ready user#1", "start loner#1", "ready loner#1",
		"fail conn#1", "stop user#1", "start conn#2", "ready conn#2", "start user#2 conn=2", "ready user#2",
		"stop loner#1", "stop user#2", "stop conn#2",
	}
	if got := j.list(); !slices.Equal(got, want) {
		t.Fatalf("journal\n got %q\nwant %q", got, want)
	}
	_, rep = health(t, g)
	for _, c := range rep.Components {
		if c.Name == "conn" && (c.Restarts != 1 || c.LastError != "connection closed for good") {
			t.Fatalf("conn status %+v", c)
		}
	}
}

// A user often fails before the component it needs has noticed the same fault (a closed connection):
// its restart must wait for that component's, not start on the dead resource.
func TestGroupRestartsAUserAfterTheComponentItNeedsWhenBothFailed(t *testing.T) {
	j := &journal{}
	conn, user := newFake(j, "conn", true), newFake(j, "user", true)
	user.resource = conn.startCount
	cc, uc := conn.component(), user.component()
	uc.Needs = []string{"conn"}
	uc.Restart.InitialBackoff = 200 * time.Millisecond
	g, err := New([]Component{cc, uc}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	c1, u1 := conn.next(t), user.next(t)
	waitState(t, g, "user", StateReady)
	u1.failWith(errors.New("connection closed"))
	time.Sleep(50 * time.Millisecond) // the group is now in the user's 200ms backoff
	c1.failWith(errors.New("connection closed for good"))
	conn.next(t)
	user.next(t)
	waitState(t, g, "user", StateReady)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{
		"start conn#1", "ready conn#1", "start user#1 conn=1", "ready user#1",
		"fail user#1", "fail conn#1", "start conn#2", "ready conn#2", "start user#2 conn=2", "ready user#2",
		"stop user#2", "stop conn#2",
	}
	if got := j.list(); !slices.Equal(got, want) {
		t.Fatalf("journal\n got %q\nwant %q", got, want)
	}
}

// A running component whose Health reports a fault is degraded: /healthz answers 503 naming the fault,
// the component is neither restarted nor are the components built on it, and it is ready again once
// the fault is gone. A stopped component's Health is no longer asked.
func TestGroupReportsADegradedComponentWithoutRestartingIt(t *testing.T) {
	j := &journal{}
	srv, user := newFake(j, "server", true), newFake(j, "user", true)
	var fault atomic.Pointer[error]
	srv.health = func() error {
		if e := fault.Load(); e != nil {
			return *e
		}
		return nil
	}
	uc := user.component()
	uc.Needs = []string{"server"}
	g, err := New([]Component{srv.component(), uc}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	waitState(t, g, "user", StateReady)
	if code, rep := health(t, g); code != http.StatusOK || rep.Status != "ok" {
		t.Fatalf("healthy: %d %+v", code, rep)
	}

	full := errors.New("disk full: /data has 0 bytes available")
	fault.Store(&full)
	code, rep := health(t, g)
	if code != http.StatusServiceUnavailable || rep.Status != "degraded" || rep.Components[0].State != StateDegraded ||
		rep.Components[0].Reason != full.Error() || rep.Components[1].State != StateReady || g.Healthy() {
		t.Fatalf("degraded: %d %+v", code, rep)
	}
	fault.Store(nil)
	if code, rep := health(t, g); code != http.StatusOK || rep.Status != "ok" || rep.Components[0].Reason != "" {
		t.Fatalf("after the fault: %d %+v", code, rep)
	}
	if n := srv.startCount() + user.startCount(); n != 2 {
		t.Fatalf("%d starts, want 2: a degraded component was restarted", n)
	}

	fault.Store(&full)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := states(healthReportOf(g)); got["server"] != stateStopped {
		t.Fatalf("a stopped component reported %v", got)
	}
}

// A disabled component is never started, yet listed in its place: /healthz is not ok (degraded, 503)
// with the reason, and the group stops without touching it.
func TestGroupListsADisabledComponentAndIsNotHealthy(t *testing.T) {
	j := &journal{}
	a, c := newFake(j, "a", true), newFake(j, "c", true)
	const why = `trace writer disabled: --trace-mode "ful" (DYN_FPM_MODE): want sampled or full`
	g, err := New([]Component{a.component(), {Name: "b", Disabled: why}, c.component()}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	waitState(t, g, "c", StateReady)
	code, rep := health(t, g)
	if code != http.StatusServiceUnavailable || rep.Status != "degraded" || len(rep.Components) != 3 ||
		rep.Components[1].State != StateDisabled || rep.Components[1].Reason != why || g.Healthy() {
		t.Fatalf("with a disabled component: %d %+v", code, rep)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := states(healthReportOf(g)); st["b"] != StateDisabled || st["a"] != stateStopped {
		t.Fatalf("after stop: %v", st)
	}
	if n := a.startCount() + c.startCount(); n != 2 {
		t.Fatalf("%d starts, want 2", n)
	}
}

func TestGroupGivesUpOnAComponentThatCannotRecover(t *testing.T) {
	boom := errors.New("boom")
	for name, tc := range map[string]struct {
		setup      func(f *fake, c *Component)
		fail       func(t *testing.T, f *fake) // drives the failures after the first start
		wantStarts int
		wantCause  error // besides ErrGaveUp; nil: boom
	}{
		"run fails after ready, more than MaxRestarts times": {
			setup: func(f *fake, c *Component) { f.autoReady = true; c.Restart.MaxRestarts = 2 },
			fail: func(t *testing.T, f *fake) {
				for range 3 {
					f.next(t).failWith(boom)
				}
			},
			wantStarts: 3,
		},
		"start fails every time": {
			setup: func(f *fake, c *Component) {
				f.autoReady = true
				c.Restart.MaxRestarts = 2
				f.startErr = func(n int) error {
					if n == 1 {
						return nil
					}
					return boom
				}
			},
			fail:       func(t *testing.T, f *fake) { f.next(t).failWith(boom) },
			wantStarts: 3,
		},
		"never ready": {
			setup: func(f *fake, c *Component) {
				c.Restart.MaxRestarts = 1
				c.ReadyTimeout = 30 * time.Millisecond
				f.startErr = func(n int) error { return nil }
			},
			fail:       func(t *testing.T, f *fake) {},
			wantStarts: 2,
			wantCause:  context.DeadlineExceeded,
		},
		"permanent error": {
			setup: func(f *fake, c *Component) { f.autoReady = true },
			fail: func(t *testing.T, f *fake) {
				f.next(t).failWith(Permanent(boom))
			},
			wantStarts: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			j := &journal{}
			first, bad, last := newFake(j, "first", true), newFake(j, "bad", false), newFake(j, "last", true)
			bc := bad.component()
			tc.setup(bad, &bc)
			comps := []Component{first.component(), bc, last.component()}
			g, err := New(comps, WithLogger(quietLogger()))
			if err != nil {
				t.Fatal(err)
			}
			_, done, runErr := runGroup(t, g)
			tc.fail(t, bad)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Run did not give up; states %+v", g.Status())
			}
			cause := tc.wantCause
			if cause == nil {
				cause = boom
			}
			if !errors.Is(*runErr, ErrGaveUp) || !errors.Is(*runErr, cause) {
				t.Fatalf("Run error %v: want ErrGaveUp wrapping %v", *runErr, cause)
			}
			if got := bad.startCount(); got != tc.wantStarts {
				t.Fatalf("bad started %d times, want %d", got, tc.wantStarts)
			}
			got := states(healthReportOf(g))
			if got["bad"] != stateFailed || got["first"] != stateStopped || got["last"] != stateStopped {
				t.Fatalf("states after giving up: %v", got)
			}
			if ev := j.list(); !slices.Contains(ev, "stop first#1") {
				t.Fatalf("first was not stopped gracefully: %q", ev)
			}
		})
	}
}

func healthReportOf(g *Group) HealthReport { return HealthReport{Components: g.Status()} }

func TestGroupForgivesFailuresOlderThanTheWindow(t *testing.T) {
	j := &journal{}
	f := newFake(j, "flaky", true)
	c := f.component()
	c.Restart.MaxRestarts = 1
	c.Restart.Window = 100 * time.Millisecond
	g, err := New([]Component{c}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, done, runErr := runGroup(t, g)
	inc := f.next(t)
	for range 3 { // three failures, each more than a window after the one before: never two in a window
		time.Sleep(250 * time.Millisecond)
		inc.failWith(errors.New("flake"))
		inc = f.next(t)
	}
	waitState(t, g, "flaky", StateReady)
	select {
	case <-done:
		t.Fatalf("Run gave up: %v", *runErr)
	default:
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestGroupAbandonsAComponentThatOverrunsItsStopTimeout(t *testing.T) {
	j := &journal{}
	stuck, after := newFake(j, "stuck", true), newFake(j, "after", true)
	stuck.ignoreStop = true
	t.Cleanup(func() { close(stuck.release) }) // let the abandoned Run end before goleak looks
	sc := stuck.component()
	sc.StopTimeout = 50 * time.Millisecond
	g, err := New([]Component{sc, after.component()}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	waitState(t, g, "after", StateReady)
	began := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("stopping took %v with a 50ms stop timeout", d)
	}
	if ev := j.list(); !slices.Contains(ev, "stop after#1") {
		t.Fatalf("after was not stopped: %q", ev)
	}
}

func TestGroupStoppedWhileStartingStopsWhatItStarted(t *testing.T) {
	j := &journal{}
	a, b := newFake(j, "a", true), newFake(j, "b", false) // b never becomes ready
	g, err := New([]Component{a.component(), b.component()}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	stop, _, _ := runGroup(t, g)
	b.next(t)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	ev := j.list()
	if !slices.Contains(ev, "stop b#1") || !slices.Contains(ev, "stop a#1") || slices.Index(ev, "stop b#1") > slices.Index(ev, "stop a#1") {
		t.Fatalf("journal %q: want b then a stopped", ev)
	}
	if b.startCount() != 1 {
		t.Fatalf("b started %d times, want 1", b.startCount())
	}
}

func TestNewRefusesABadList(t *testing.T) {
	start := func(context.Context) (Instance, error) { return Instance{}, nil }
	for name, tc := range map[string]struct {
		comps []Component
		want  string
	}{
		"no name":        {[]Component{{Start: start}}, "no name"},
		"duplicate":      {[]Component{{Name: "a", Start: start}, {Name: "a", Start: start}}, "listed twice"},
		"no start":       {[]Component{{Name: "a"}}, "no Start"},
		"need later":     {[]Component{{Name: "a", Start: start, Needs: []string{"b"}}, {Name: "b", Start: start}}, "not listed before"},
		"negative limit": {[]Component{{Name: "a", Start: start, Restart: Policy{MaxRestarts: -1}}}, "negative"},
		"need disabled":  {[]Component{{Name: "a", Disabled: "bad mode"}, {Name: "b", Start: start, Needs: []string{"a"}}}, "which is disabled"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.comps)
			if !errors.Is(err, errInvalidGroup) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrInvalidGroup naming %q", err, tc.want)
			}
		})
	}
}
