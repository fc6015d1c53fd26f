package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// dashboardPanel is one panel of ops/grafana/fpmbus-dashboard.json and its queries.
type dashboardPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr    string `json:"expr"`
		Instant bool   `json:"instant"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) []dashboardPanel {
	t.Helper()
	raw, err := os.ReadFile("../ops/grafana/fpmbus-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []dashboardPanel
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Fatalf("panel %q has no query", p.Title)
		}
		out = append(out, p)
	}
	return out
}

// grafanaVars are the values a Grafana run gives the dashboard's variables, at the test's scale: a
// one-second scrape, so rates over 15 s have several samples.
var grafanaVars = strings.NewReplacer("$__rate_interval", "15s", "$__range", "1m", "$__interval", "2s", `"$rank"`, `".*"`, "$rank", ".*")

var metricName = regexp.MustCompile(`\b(fpmbus_[a-z0-9_]+|process_[a-z0-9_]+)\b`)

// The shipped Grafana dashboard covers everything and is tested: a real Prometheus scrapes a real
// `fpmbus up --demo` (traffic on two ranks), and every query of every panel returns data; every
// fpmbus metric `up` exposes is in some panel, and no query hides a missing metric behind a
// constant (`or vector(0)`).
func TestDashboardPanelsHaveDataFromARealPrometheus(t *testing.T) {
	t.Parallel()
	prom := requireTool(t, "FPMBUS_PROMETHEUS_BIN", "prometheus")
	panels := loadDashboard(t)
	used := map[string]bool{}
	for _, p := range panels {
		for _, q := range p.Targets {
			if strings.Contains(q.Expr, "vector(") {
				t.Errorf("panel %q: %q falls back to a constant: a missing metric would look like data", p.Title, q.Expr)
			}
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				used[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}

	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startUp(t, 2, "--demo", "--metrics-addr", metrics)

	// Every fpmbus family of the whole process is on the dashboard.
	_, body, err := httpGet(metrics, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (fpmbus_[a-z0-9_]+) `).FindAllStringSubmatch(string(body), -1) {
		if !used[m[1]] {
			missing = append(missing, m[1])
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("metrics of fpmbus up on no panel of the dashboard: %v", missing)
	}

	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: fpmbus\n    static_configs:\n      - targets: ['%s']\n", metrics)), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	start(t, "prometheus", prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	eventually(t, 30*time.Second, func() error {
		code, _, err := httpGet(promAddr, "/-/ready")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/-/ready: %d", code)
		}
		return err
	})

	query := func(expr string) (int, error) {
		code, body, err := httpGet(promAddr, "/api/v1/query?query="+url.QueryEscape(expr))
		if err != nil {
			return 0, err
		}
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &r); err != nil || code != http.StatusOK || r.Status != "success" {
			return 0, fmt.Errorf("%d %s %v: %.300s", code, r.Error, err, body)
		}
		return len(r.Data.Result), nil
	}
	// Traffic reached Prometheus: the bridge's rate is above zero.
	eventually(t, 60*time.Second, func() error {
		n, err := query(`sum(rate(fpmbus_bridge_published_total[15s])) > 0`)
		if err == nil && n == 0 {
			err = fmt.Errorf("no FPM published yet in Prometheus")
		}
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, p := range panels {
		for _, q := range p.Targets {
			expr := grafanaVars.Replace(q.Expr)
			var n int
			var err error
			for {
				if n, err = query(expr); err == nil && n > 0 {
					break
				}
				if ctx.Err() != nil {
					t.Errorf("panel %q: %s returns no data (%v)", p.Title, expr, err)
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	t.Logf("%d panels, every query with data", len(panels))
}
