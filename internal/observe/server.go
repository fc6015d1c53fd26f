package observe

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

// Defaults of Options fields left zero.
const (
	// defaultSampleInterval: a gathering costs about 2 µs of CPU per series, some 30 ms for the 14,000
	// of a bridge of 1,000 ranks (BenchmarkThousandRanks), so the background one is rare; requests
	// gather for themselves.
	defaultSampleInterval = 10 * time.Second
	defaultWindow         = 30 * time.Second
	// defaultHealthWindow is how far back the limit checks look: a component stays degraded this long
	// after it was last behind a limit.
	defaultHealthWindow = 10 * time.Second
	// jetStreamEvery bounds how often the server is asked for consumer and stream infos.
	jetStreamEvery = 3 * time.Second
	// sourceTimeout bounds one read of a source (JetStream, the publishers' state).
	sourceTimeout = 3 * time.Second
)

// Options say what a process serves. Every field but Process and Gatherer is optional: a section
// without its source is left out of the status.
type Options struct {
	// Process names the command ("up", "bridge", "trace", …) on the page and in the status.
	Process string
	// Gatherer is the process's registry: /metrics serves it, and the status reads it.
	Gatherer prometheus.Gatherer
	// Components reports the health of the process's components: up's run group (Group.Status), a
	// standalone command's Process. Nil: one component named Process, always ready.
	Components func() []rungroup.Status
	// JetStream returns the connection's JetStream (nil while there is none, as while `up`'s
	// connection restarts): consumer infos and the streams' policy are read from it.
	JetStream func() jetstream.JetStream
	// ListJetStream lists every stream and durable consumer of fpmbus (`up`, whose components may do
	// anything). Without it only what a least-privileged user of the component may read is read: the
	// infos of FPM, FPM_EVENTS and FPM_BENCH and of the component's own consumers (ConsumerRef.Durables),
	// so that no status request is a permissions violation on the server.
	ListJetStream bool
	// Publishers is the gap detector's per-publisher state.
	Publishers publisherSource
	// Sync is the embedded server's fsync policy (fpmbus up), "" elsewhere.
	Sync string
	// Bridge names the component that runs the bridge (its row in /healthz) and its limits, when the
	// process runs one.
	Bridge *BridgeRef
	// Consumers are the durable consumers the process runs.
	Consumers []ConsumerRef
	// SampleInterval is how often the registry is gathered; Window how much history rates and limit
	// checks look at. Defaults defaultSampleInterval and defaultWindow.
	SampleInterval time.Duration
	Window         time.Duration
	// HealthWindow is how far back the limit checks look (default defaultHealthWindow, at most Window).
	HealthWindow time.Duration
	Logger       *slog.Logger
	// now is the clock (tests).
	now func() time.Time
}

// BridgeRef is the bridge a process runs.
type BridgeRef struct {
	Component   string
	Ranks       int
	MaxBuffer   int
	MaxInFlight int
}

// ConsumerRef is a durable consumer a process runs.
type ConsumerRef struct {
	// Label is the runner's name in fpmbus_consumer_*{consumer=Label}: trace, gaps, merge, seal.
	Label string
	// Component is the component that runs it (its row in /healthz).
	Component string
	// Group names its JetStream consumers: Group, or Group-<p> for partition p.
	Group string
	// Durables are its JetStream consumers, read by name without ListJetStream.
	Durables []Durable
}

// Durable is one JetStream consumer by stream and name.
type Durable struct{ Stream, Name string }

// publisherSource is the gap detector's per-publisher state.
type publisherSource interface {
	// Group names the detector group.
	Group() string
	// Publishers returns every publisher the group tracks (any order).
	Publishers(ctx context.Context) ([]Publisher, error)
}

// Server serves one process's /metrics, /healthz, /status.json and /. Create it with New, then Start.
type Server struct {
	o       Options
	mux     *http.ServeMux
	started time.Time

	mu  sync.Mutex // guards win and js
	win window
	js  *JetStream

	jsMu sync.Mutex // one JetStream read at a time

	srv  *http.Server
	quit chan struct{}
	done sync.WaitGroup
}

// New returns a server for o.
func New(o Options) *Server {
	if o.SampleInterval <= 0 {
		o.SampleInterval = defaultSampleInterval
	}
	if o.Window <= 0 {
		o.Window = defaultWindow
	}
	if o.HealthWindow <= 0 {
		o.HealthWindow = min(defaultHealthWindow, o.Window)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.Components == nil {
		name, since := o.Process, o.now()
		o.Components = func() []rungroup.Status {
			return []rungroup.Status{{Name: name, State: rungroup.StateReady, Since: since}}
		}
	}
	s := &Server{o: o, mux: http.NewServeMux(), started: o.now(), quit: make(chan struct{})}
	// /metrics is the registry plus the components' health (components.go). The registry's gathering
	// for a scrape is kept as a sample, so a scrape costs one gathering and the health it exports is
	// judged on what it serves.
	health := prometheus.NewRegistry()
	health.MustRegister(componentCollector{s})
	s.mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{prometheus.GathererFunc(s.gatherSample), health}, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/healthz", s.serveHealth)
	s.mux.HandleFunc("/status.json", s.serveStatus)
	s.mux.HandleFunc("/status.js", serveAsset(pageJS, "text/javascript; charset=utf-8"))
	s.mux.HandleFunc("/status.css", serveAsset(pageCSS, "text/css; charset=utf-8"))
	s.mux.HandleFunc("/{$}", s.servePage)
	s.sampleNow()
	return s
}

// Handler is the server's mux (for tests and for a caller that serves it itself).
func (s *Server) Handler() http.Handler { return s.mux }

// Start serves on ln and starts the sampler, until Stop.
func (s *Server) Start(ln net.Listener) {
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.o.Logger.Error("metrics server", "error", err)
		}
	}()
	go func() {
		defer s.done.Done()
		t := time.NewTicker(s.o.SampleInterval)
		defer t.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-t.C:
				s.sampleNow()
			}
		}
	}()
}

// Stop stops serving (requests in progress get 5 s) and the sampler.
func (s *Server) Stop() {
	close(s.quit)
	if s.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
	}
	s.done.Wait()
}

// sampleNow gathers the registry into the window.
func (s *Server) sampleNow() {
	if mfs, err := s.gatherSample(); err != nil && len(mfs) == 0 {
		s.o.Logger.Warn("status: gathering the metrics failed", "error", err)
	}
}

// gatherSample gathers the registry, adds what it gathered to the window, and returns it.
func (s *Server) gatherSample() ([]*dto.MetricFamily, error) {
	mfs, err := s.o.Gatherer.Gather()
	if err != nil && len(mfs) == 0 {
		return nil, err
	}
	smp := newSample(s.o.now(), mfs)
	s.mu.Lock()
	s.win.add(smp, s.o.Window)
	s.mu.Unlock()
	return mfs, err
}

// fresh bounds how old the newest sample may be when a request reads the window: an older one is
// replaced by a new gathering, so a request sees what was registered or counted since.
const fresh = time.Second

// rater is the window as it stands, with a sample at most fresh old.
func (s *Server) rater() rater {
	s.mu.Lock()
	newest, _ := s.win.span()
	s.mu.Unlock()
	if newest == nil || s.o.now().Sub(newest.t) >= fresh {
		s.sampleNow()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, old := s.win.span()
	return rater{now: now, old: old}
}

// healthRater is the last HealthWindow of the window.
func (s *Server) healthRater() rater {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, old := s.win.within(s.o.HealthWindow)
	return rater{now: now, old: old}
}

// jetStream returns JetStream's view, read at most every jetStreamEvery (nil without a source).
func (s *Server) jetStream(ctx context.Context) *JetStream {
	if s.o.JetStream == nil {
		return nil
	}
	s.jsMu.Lock()
	defer s.jsMu.Unlock()
	s.mu.Lock()
	cached := s.js
	s.mu.Unlock()
	if cached != nil && s.o.now().Sub(cached.Read) < jetStreamEvery {
		return cached
	}
	js := s.o.JetStream()
	var view *JetStream
	if js == nil {
		view = &JetStream{Error: "no connection to the server now", Read: s.o.now()}
	} else {
		rctx, cancel := context.WithTimeout(ctx, sourceTimeout)
		if s.o.ListJetStream {
			view = listJetStream(rctx, js, s.o.Consumers)
		} else {
			view = ownJetStream(rctx, js, s.o.Consumers)
		}
		cancel()
		view.Read = s.o.now()
	}
	s.mu.Lock()
	s.js = view
	s.mu.Unlock()
	return view
}

// health is every component's status with the limit checks applied: a ready component behind one of
// its limits is degraded, with the reasons.
func (s *Server) health(js *JetStream) []rungroup.Status {
	cs := s.o.Components()
	faults := s.limitFaults(s.healthRater(), js)
	for i := range cs {
		if reasons := faults[cs[i].Name]; len(reasons) > 0 && cs[i].State == rungroup.StateReady {
			cs[i].State = rungroup.StateDegraded
			cs[i].Reason = joinReasons(reasons)
		}
	}
	return cs
}

func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	s.rater() // a sample at most fresh old
	rep, code := rungroup.Report(s.health(s.jetStreamCached()))
	rungroup.WriteReport(w, rep, code)
}

// jetStreamCached is the last JetStream view without reading the server (health must answer at once);
// it refreshes it in the background when it is old.
func (s *Server) jetStreamCached() *JetStream {
	if s.o.JetStream == nil {
		return nil
	}
	s.mu.Lock()
	cached := s.js
	s.mu.Unlock()
	if cached == nil || s.o.now().Sub(cached.Read) >= jetStreamEvery {
		if s.jsMu.TryLock() {
			s.jsMu.Unlock()
			s.done.Add(1)
			go func() {
				defer s.done.Done()
				s.jetStream(context.Background())
			}()
		}
	}
	return cached
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	st := s.Status(r.Context(), parseQuery(r.URL.Query()))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(st)
}

func serveAsset(body []byte, contentType string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.Header().Set("Cache-Control", "max-age=300")
		_, _ = w.Write(body)
	}
}

// Status builds the status for query q, from a gathering at most a second old (made for it when the
// last one is older): a page polling every 2 s, or several open at once, do not gather the registry
// more than once a second between them.
func (s *Server) Status(ctx context.Context, q query) *Status {
	r := s.rater()
	js := s.jetStream(ctx)
	st := &Status{Schema: schema, Process: s.o.Process, Time: s.o.now().UTC(), Started: s.started.UTC(),
		WindowSeconds: r.seconds()}
	st.Components = s.health(js)
	rep, _ := rungroup.Report(st.Components)
	st.Health = rep.Status
	st.JetStream = js
	st.Durability = s.durability(ctx, js)
	st.Store = storeOf(r)
	st.Bridge = bridgeOf(r, s.o.Bridge)
	st.Consumers = consumersOf(r, s.o.Consumers, st.Components)
	st.Merge = mergeOf(r)
	st.Seal = sealOf(r)
	st.Predict = predictOf(r)
	if s.o.Publishers != nil {
		pctx, cancel := context.WithTimeout(ctx, sourceTimeout)
		rows, err := s.o.Publishers.Publishers(pctx)
		cancel()
		st.Publishers = arrange(s.o.Publishers.Group(), rows, err, q)
	}
	return st
}
