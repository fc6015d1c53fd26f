package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/internal/rungroup"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// bridgeMetrics registers collectors named as the bridge's (bridge/metrics.go) on reg.
type bridgeMetrics struct {
	received, published, dropped *prometheus.CounterVec
	latency                      prometheus.Histogram
}

func newBridgeMetrics(reg *prometheus.Registry) *bridgeMetrics {
	m := &bridgeMetrics{
		received:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_bridge_received_total"}, []string{"rank"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_bridge_published_total"}, []string{"rank"}),
		dropped:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fpmbus_bridge_dropped_total"}, []string{"rank", "reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fpmbus_bridge_receive_to_ack_seconds",
			Buckets: []float64{.001, .01, .1, 1}}),
	}
	reg.MustRegister(m.received, m.published, m.dropped, m.latency)
	for _, r := range []string{"0", "1"} {
		m.dropped.WithLabelValues(r, "buffer_full")
	}
	return m
}

func getJSON(t *testing.T, h http.Handler, path string, v any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("%s: %v: %s", path, err, rec.Body.String())
	}
	return rec.Code
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// The bridge's rates and latency come from the registry over the window; a drop for a full buffer
// makes the bridge degraded in /healthz and the status, with the reason, until a window without one.
func TestBridgeBehindItsBufferIsDegradedForAWindow(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := newBridgeMetrics(reg)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	s := New(Options{Process: "bridge", Gatherer: reg, now: clk.now, Window: 10 * time.Second, SampleInterval: time.Second,
		Bridge: &BridgeRef{Component: "bridge", MaxBuffer: 100}})
	h := s.Handler()
	for i := 0; i < 5; i++ {
		clk.add(time.Second)
		m.received.WithLabelValues("0").Add(100)
		m.published.WithLabelValues("0").Add(100)
		m.latency.Observe(0.005)
		s.sampleNow()
	}
	var st Status
	if code := getJSON(t, h, "/status.json", &st); code != 200 || st.Health != "ok" || st.Bridge == nil {
		t.Fatalf("healthy: %d %+v", code, st)
	}
	if b := st.Bridge; b.Received != 500 || b.ReceivedRate != 100 || b.PublishLatency.P50 != 0.01 || b.MaxBuffer != 100 || len(b.LossyRanks) != 0 {
		t.Fatalf("bridge %+v", b)
	}

	m.dropped.WithLabelValues("1", "buffer_full").Add(7)
	clk.add(time.Second)
	s.sampleNow()
	var rep rungroup.HealthReport
	if code := getJSON(t, h, "/healthz", &rep); code != http.StatusServiceUnavailable || rep.Status != "degraded" ||
		rep.Components[0].State != rungroup.StateDegraded || !strings.Contains(rep.Components[0].Reason, "dropped 7 FPMs") ||
		!strings.Contains(rep.Components[0].Reason, "--max-buffer") {
		t.Fatalf("after drops: %d %+v", code, rep)
	}
	getJSON(t, h, "/status.json", &st)
	if st.Health != "degraded" || len(st.Bridge.LossyRanks) != 1 || st.Bridge.LossyRanks[0].Rank != "1" || st.Bridge.Dropped["buffer_full"] != 7 {
		t.Fatalf("status after drops: %s %+v", st.Health, st.Bridge)
	}

	for i := 0; i < 12; i++ { // a window without a drop
		clk.add(time.Second)
		s.sampleNow()
	}
	if code := getJSON(t, h, "/healthz", &rep); code != 200 || rep.Status != "ok" {
		t.Fatalf("a window later: %d %+v", code, rep)
	}
}

// A consumer whose stream removed messages before it read them is behind the stream's limits: its
// component is degraded, named by its reason. Consumer rows come from fpmbus_consumer_*.
func TestConsumerBehindTheStreamsLimitsIsDegraded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	l := prometheus.Labels{"consumer": "trace"}
	delivered := prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_consumer_delivered_total", ConstLabels: l})
	acked := prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_consumer_acked_total", ConstLabels: l})
	lost := prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_consumer_retention_lost_total", ConstLabels: l})
	reg.MustRegister(delivered, acked, lost)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	comps := []rungroup.Status{{Name: "trace writer", State: rungroup.StateReady, Restarts: 2}, {Name: "bridge", State: rungroup.StateReady}}
	s := New(Options{Process: "up", Gatherer: reg, now: clk.now, Components: func() []rungroup.Status { return append([]rungroup.Status(nil), comps...) },
		Consumers: []ConsumerRef{{Label: "trace", Component: "trace writer", Group: "fpm-trace"}}})
	delivered.Add(10)
	acked.Add(10)
	clk.add(2 * time.Second)
	s.sampleNow()
	var st Status
	getJSON(t, s.Handler(), "/status.json", &st)
	if st.Health != "ok" || len(st.Consumers) != 1 || st.Consumers[0].Acked != 10 || st.Consumers[0].AckRate != 5 ||
		st.Consumers[0].Component != "trace writer" || st.Consumers[0].Restarts != 2 {
		t.Fatalf("consumers %+v (%s)", st.Consumers, st.Health)
	}
	lost.Add(3)
	clk.add(2 * time.Second)
	s.sampleNow()
	getJSON(t, s.Handler(), "/status.json", &st)
	if st.Health != "degraded" || st.Components[0].State != rungroup.StateDegraded || !strings.Contains(st.Components[0].Reason, "removed 3 messages") ||
		st.Components[1].State != rungroup.StateReady {
		t.Fatalf("after a retention loss: %s %+v", st.Health, st.Components)
	}
	if ownerOf(s.o.Consumers, "fpm-trace-3") != "trace writer" || ownerOf(s.o.Consumers, "fpm-tracer") != "" {
		t.Fatal("partition consumer names")
	}
}

// fakePublishers is a fleet: workers × ranks, some with gaps, one stale.
type fakePublishers struct{ rows []Publisher }

func (f fakePublishers) Group() string { return "fpm-gaps" }
func (f fakePublishers) Publishers(context.Context) ([]Publisher, error) {
	return append([]Publisher(nil), f.rows...), nil
}

func fleet(workers, ranks int, now time.Time) fakePublishers {
	var f fakePublishers
	for w := range workers {
		for r := range ranks {
			p := Publisher{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprintf("w-%03d", w), DPRank: r, State: "live", Flowing: true,
				Rate: 100, LastSeen: now.Add(-time.Second), Messages: 5000, Gaps: map[string]uint64{}, Missing: map[string]uint64{}}
			if w == 17 && r == 3 {
				p.Gaps["zmq_drop"], p.Missing["zmq_drop"], p.GapsTotal, p.MissingTotal = 2, 40, 2, 40
			}
			if w == 90 && r == 0 {
				p.Gaps["bridge_drop"], p.Missing["bridge_drop"], p.GapsTotal, p.MissingTotal = 1, 7, 1, 7
			}
			if w == 120 && r == 7 {
				p.State, p.Flowing, p.Rate = "stale", false, 0
			}
			f.rows = append(f.rows, p)
		}
	}
	return f
}

var dataKey = regexp.MustCompile(`<tr class="pub" data-key="([^"]+)"`)

// 1,000 ranks stay readable: a summary line, 50 worker groups a page (the ones with a gap or a stale
// rank open, the others closed), sorted by a column, filtered by text or state, paged with a link.
func TestPageAtAThousandRanks(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	s := New(Options{Process: "up", Gatherer: prometheus.NewRegistry(), now: func() time.Time { return now }, Publishers: fleet(125, 8, now)})
	h := s.Handler()

	code, page := get(t, h, "/?sort=missing&desc=1")
	if code != 200 {
		t.Fatalf("page: %d", code)
	}
	for _, want := range []string{`<span id="sum-total">1000</span>`, `999 flowing`, `2 with gaps`, `1 stale`, `47 FPMs missing`,
		`1000 match, in 125 workers; showing 1–50`, `id="next" href="?desc=1&amp;offset=50&amp;sort=missing"`,
		`<noscript>`, `<script src="/status.js">`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	rows := dataKey.FindAllStringSubmatch(page, -1)
	if len(rows) != 50*8 || rows[0][1] != "dynamo/backend/w-017/3" || rows[8][1] != "dynamo/backend/w-090/0" {
		t.Fatalf("%d rows, first %v", len(rows), rows[:2])
	}
	if open := strings.Count(page, `<details class="group" data-worker="dynamo/backend/w-017" open>`); open != 1 {
		t.Fatalf("the group with gaps is not open")
	}
	if n := strings.Count(page, `<details class="group"`); n != 50 || strings.Count(page, "\" open>") != 2 {
		t.Fatalf("%d groups, %d open; want 50 and 2 (the two with gaps)", n, strings.Count(page, "\" open>"))
	}
	if len(page) > 600_000 {
		t.Fatalf("page of 50 workers is %d bytes", len(page))
	}

	var st Status
	getJSON(t, h, "/status.json?state=gaps", &st)
	if p := st.Publishers; p.Matched != 2 || p.GroupCount != 2 || len(p.Groups) != 2 || p.Summary.Total != 1000 {
		t.Fatalf("state=gaps: matched %d in %d groups of %d", p.Matched, p.GroupCount, p.Summary.Total)
	}
	getJSON(t, h, "/status.json?q=W-120/7", &st)
	if p := st.Publishers; p.Matched != 1 || p.Groups[0].Rows[0].State != "stale" || p.Groups[0].Stale != 1 {
		t.Fatalf("q=W-120/7: %+v", p.Groups)
	}
	getJSON(t, h, "/status.json?sort=key&offset=120&limit=10", &st)
	if p := st.Publishers; p.Shown != 5 || p.Groups[0].WorkerID != "w-120" || p.Query.Limit != 10 {
		t.Fatalf("last page: shown %d from %s", p.Shown, p.Groups[0].WorkerID)
	}
	getJSON(t, h, "/status.json?sort=state&desc=1", &st)
	if g := st.Publishers.Groups[0]; g.WorkerID != "w-120" || g.Rows[0].DPRank != 7 {
		t.Fatalf("sort=state desc: first %s rank %d", g.WorkerID, g.Rows[0].DPRank)
	}
}

func TestParseQueryKeepsOnlyWhatItKnows(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in   string
		want query
	}{
		"empty":            {"", query{Sort: "key", Limit: defaultGroupLimit}},
		"every field":      {"q=+w-1+&state=gaps&sort=zmq_drop&desc=1&offset=50&limit=20", query{Filter: "w-1", State: "gaps", Sort: "zmq_drop", Desc: true, Offset: 50, Limit: 20}},
		"unknown values":   {"state=odd&sort=nope&desc=maybe&offset=-3&limit=x", query{Sort: "key", Limit: defaultGroupLimit}},
		"limit over bound": {"limit=100000", query{Sort: "key", Limit: maxGroupLimit}},
	} {
		t.Run(name, func(t *testing.T) {
			v, _ := url.ParseQuery(tc.in)
			if got := parseQuery(v); got != tc.want {
				t.Fatalf("ParseQuery(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

// The page needs nothing from outside the binary: no outside URL in its markup, style or script, and
// its assets are served from it.
func TestPageUsesNoOutsideAssets(t *testing.T) {
	t.Parallel()
	outside := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9-]+\.[a-z0-9.-]*[a-z]{2,}[/"' ]`)
	for name, body := range map[string]string{"page.html": pageHTML, "page.css": string(pageCSS), "page.js": string(pageJS)} {
		if m := outside.FindString(body); m != "" {
			t.Errorf("%s refers to %q", name, m)
		}
	}
	if m := regexp.MustCompile(`@import|url\(|@font-face`).FindString(string(pageCSS)); m != "" {
		t.Errorf("page.css loads %q", m)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_test_total"}))
	s := New(Options{Process: "trace", Gatherer: reg})
	for path, ctype := range map[string]string{"/status.js": "text/javascript", "/status.css": "text/css", "/": "text/html", "/metrics": "text/plain"} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), ctype) || len(body) == 0 {
			t.Errorf("%s: %d %q, %d bytes", path, rec.Code, rec.Header().Get("Content-Type"), len(body))
		}
	}
	if code, _ := get(t, s.Handler(), "/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing: %d", code)
	}
}

// metricLines is /metrics as one line per series ("name{labels} value").
func metricLines(t *testing.T, h http.Handler) map[string]bool {
	t.Helper()
	code, body := get(t, h, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	out := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			out[l] = true
		}
	}
	return out
}

// A standalone command's one component is exported as `up`'s are, under the same names, with the
// health /healthz serves: a bridge dropping FPMs for a full buffer is degraded in
// fpmbus_component_state (it still runs: fpmbus_component_ready stays 1), and ready again a window later.
func TestStandaloneComponentStateIsExportedWithItsLimits(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := newBridgeMetrics(reg)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	p := newProcess("bridge")
	p.Ready()
	s := New(Options{Process: "bridge", Gatherer: reg, now: clk.now, Window: 10 * time.Second, SampleInterval: time.Second,
		Components: p.Components, Bridge: &BridgeRef{Component: "bridge", MaxBuffer: 100}})
	h := s.Handler()
	clk.add(time.Second)
	m.received.WithLabelValues("0").Add(100)
	s.sampleNow()
	want := func(when string, lines ...string) {
		t.Helper()
		got := metricLines(t, h)
		for _, l := range lines {
			if !got[l] {
				t.Errorf("%s: /metrics lacks %q", when, l)
			}
		}
	}
	want("ready", `fpmbus_component_state{component="bridge",state="ready"} 1`, `fpmbus_component_state{component="bridge",state="degraded"} 0`,
		`fpmbus_component_ready{component="bridge"} 1`, `fpmbus_component_restarts_total{component="bridge"} 0`,
		`fpmbus_bridge_received_total{rank="0"} 100`)

	m.dropped.WithLabelValues("1", "buffer_full").Add(7)
	clk.add(time.Second) // the scrape's own gathering is the sample that shows the drops
	want("behind its buffer", `fpmbus_component_state{component="bridge",state="degraded"} 1`, `fpmbus_component_state{component="bridge",state="ready"} 0`,
		`fpmbus_component_ready{component="bridge"} 1`)

	for i := 0; i < 12; i++ { // a window without a drop
		clk.add(time.Second)
		s.sampleNow()
	}
	want("a window later", `fpmbus_component_state{component="bridge",state="ready"} 1`, `fpmbus_component_state{component="bridge",state="degraded"} 0`)

	// A fault the component reports itself (the edge bridge's full store disk) degrades it the same way.
	full := errors.New("disk full: the filesystem at /edge holding the JetStream store /edge/jetstream has 0 bytes available")
	p.Check(func() error { return full })
	want("its store full", `fpmbus_component_state{component="bridge",state="degraded"} 1`)
	var rep rungroup.HealthReport
	if code := getJSON(t, h, "/healthz", &rep); code != http.StatusServiceUnavailable || rep.Components[0].Reason != full.Error() {
		t.Fatalf("/healthz with the store full: %d %+v", code, rep)
	}
}

// `up`'s run group is exported from the same health: a disabled component, restarts, and a consumer
// behind its stream's limits.
func TestRunGroupComponentStateIsExportedWithItsLimits(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lost := prometheus.NewCounter(prometheus.CounterOpts{Name: "fpmbus_consumer_retention_lost_total", ConstLabels: prometheus.Labels{"consumer": "gaps"}})
	reg.MustRegister(lost)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	comps := []rungroup.Status{{Name: "gap detector", State: rungroup.StateReady, Restarts: 2},
		{Name: "trace writer", State: rungroup.StateDisabled, Reason: "bad setting"}}
	s := New(Options{Process: "up", Gatherer: reg, now: clk.now, Components: func() []rungroup.Status { return append([]rungroup.Status(nil), comps...) },
		Consumers: []ConsumerRef{{Label: "gaps", Component: "gap detector", Group: "fpm-gaps"}}})
	lost.Add(3)
	clk.add(2 * time.Second)
	got := metricLines(t, s.Handler())
	for _, l := range []string{`fpmbus_component_state{component="gap detector",state="degraded"} 1`, `fpmbus_component_ready{component="gap detector"} 1`,
		`fpmbus_component_restarts_total{component="gap detector"} 2`, `fpmbus_component_state{component="trace writer",state="disabled"} 1`,
		`fpmbus_component_ready{component="trace writer"} 0`, `fpmbus_component_state{component="trace writer",state="ready"} 0`} {
		if !got[l] {
			t.Errorf("/metrics lacks %q", l)
		}
	}
}

// countingGatherer counts the gatherings of a registry.
type countingGatherer struct {
	prometheus.Gatherer
	mu sync.Mutex
	n  int
}

func (c *countingGatherer) Gather() ([]*dto.MetricFamily, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Gatherer.Gather()
}

func (c *countingGatherer) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// A status request reuses a reading younger than a second: pages polling together gather once.
func TestStatusReusesAReadingYoungerThanASecond(t *testing.T) {
	t.Parallel()
	g := &countingGatherer{Gatherer: prometheus.NewRegistry()}
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	s := New(Options{Process: "trace", Gatherer: g, now: clk.now})
	base := g.count() // New's first reading
	for range 3 {
		s.Status(context.Background(), query{})
		get(t, s.Handler(), "/status.json")
	}
	if n := g.count() - base; n != 0 {
		t.Fatalf("%d gatherings for 6 requests within a second of the last reading, want 0", n)
	}
	clk.add(time.Second)
	s.Status(context.Background(), query{})
	s.Status(context.Background(), query{})
	if n := g.count() - base; n != 1 {
		t.Fatalf("%d gatherings for 2 requests a second after the last reading, want 1", n)
	}
}
