package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/observe"
	"github.com/fpmbus/fpmbus/producer/producertest"
)

// httpGet fetches http://addr+path: the status code and the body.
func httpGet(addr, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// getStatus reads /status.json with query q.
func getStatus(addr, q string) (*observe.Status, error) {
	code, body, err := httpGet(addr, "/status.json"+q)
	if err != nil {
		return nil, err
	}
	var st observe.Status
	if err := json.Unmarshal(body, &st); err != nil || code != http.StatusOK {
		return nil, fmt.Errorf("/status.json: %d %v: %.300s", code, err, body)
	}
	return &st, nil
}

// publisherRow is the attributes of the page's row of one publisher key, as Chromium has them.
var publisherRow = regexp.MustCompile(`<tr class="pub" data-key="([^"]+)" data-state="([^"]+)" data-flowing="([^"]+)" data-gaps="(\d+)" data-missing="(\d+)">(.*?)</tr>`)

var causeCell = regexp.MustCompile(`<td class="n" data-cause="([a-z_]+)">([^<]*)</td>`)

type pageRow struct {
	key, state, flowing, gaps, missing string
	byCause                            map[string]string
}

func pageRows(dom string) []pageRow {
	var out []pageRow
	for _, m := range publisherRow.FindAllStringSubmatch(dom, -1) {
		r := pageRow{key: m[1], state: m[2], flowing: m[3], gaps: m[4], missing: m[5], byCause: map[string]string{}}
		for _, c := range causeCell.FindAllStringSubmatch(m[6], -1) {
			r.byCause[c[1]] = c[2]
		}
		out = append(out, r)
	}
	return out
}

func attr(dom, element, name string) string {
	m := regexp.MustCompile(`<` + element + `[^>]* ` + name + `="([^"]*)"`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return m[1]
}

func textOf(dom, id string) string {
	m := regexp.MustCompile(`id="` + id + `"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return m[1]
}

// The status page of a running `fpmbus up`, in a real headless Chromium: a steady publisher and one
// that drops sequence numbers (5 numbers never sent: a zmq_drop gap). With its script, the page polls
// /status.json and renders the rows itself (sorted as its URL says); with JavaScript disabled the
// server's render shows the same rows. A screenshot is kept as the test's artefact.
func TestStatusPageInChromiumShowsAPublisherThatDropsSequences(t *testing.T) {
	t.Parallel()
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// Not stale while the browser looks (the publishers send nothing more after the test's FPMs).
	up := startUp(t, 2, "--metrics-addr", metrics, "--gaps-marker-grace", "200ms", "--gaps-stale-after", "1h")
	steady := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", up.basePort), 0, false, "w-steady", 0)
	skip := producertest.NewScripted(t, fmt.Sprintf("tcp://127.0.0.1:%d", up.basePort+1), 0, false, "w-skip", 1)
	steady.WaitSubscribed()
	skip.WaitSubscribed()
	steady.SendN(60, 0)
	skip.SendN(20, 0)
	for range 5 {
		skip.Skip()
	}
	skip.SendN(20, 0)

	eventually(t, 30*time.Second, func() error {
		st, err := getStatus(metrics, "")
		if err != nil {
			return err
		}
		p := st.Publishers
		if p == nil || p.Summary.Total != 2 || p.Summary.WithGaps != 1 || p.Totals["zmq_drop"] != 5 || p.Matched != 2 {
			return fmt.Errorf("publishers %+v", p)
		}
		if st.Bridge == nil || st.Bridge.Received < 40 {
			return fmt.Errorf("bridge %+v", st.Bridge)
		}
		return nil
	})

	base := "http://" + metrics + "/"
	for name, tc := range map[string]struct {
		scriptMillis int
		render       string
	}{
		"with its script":     {scriptMillis: 3000, render: "script"},
		"javascript disabled": {scriptMillis: 0, render: "server"},
	} {
		t.Run(name, func(t *testing.T) {
			dom := pageDOM(t, base+"?sort=missing&desc=1", tc.scriptMillis)
			if got := attr(dom, "body", "data-render"); got != tc.render {
				t.Fatalf("body data-render %q, want %q (updates %q)", got, tc.render, attr(dom, "body", "data-updates"))
			}
			if tc.render == "script" && attr(dom, "body", "data-updates") < "1" {
				t.Fatalf("the script rendered no update of /status.json")
			}
			if h := attr(dom, "body", "data-health"); h != "ok" {
				t.Fatalf("health %q", h)
			}
			rows := pageRows(dom)
			if len(rows) != 2 {
				t.Fatalf("%d publisher rows, want 2:\n%s", len(rows), dom)
			}
			first, second := rows[0], rows[1] // sorted by missing, most first
			if first.key != "dynamo/backend/w-skip/1" || first.gaps != "1" || first.missing != "5" || first.byCause["zmq_drop"] != "5" ||
				first.byCause["bridge_drop"] != "0" || first.state != "live" {
				t.Fatalf("the publisher that dropped: %+v", first)
			}
			if second.key != "dynamo/backend/w-steady/0" || second.gaps != "0" || second.missing != "0" {
				t.Fatalf("the steady publisher: %+v", second)
			}
			if got := textOf(dom, "sum-gaps"); got != "1 with gaps" {
				t.Fatalf("summary %q", got)
			}
			for _, id := range []string{`id="bridge-received"`, `id="components"`, `data-component="trace writer" data-state="ready"`,
				`data-consumer="gaps"`, `id="durability"`, `<b id="sync">always`} {
				if !strings.Contains(dom, id) {
					t.Fatalf("the page lacks %s", id)
				}
			}
			if tc.render == "server" && !strings.Contains(dom, `id="noscript"`) {
				t.Fatal("no note that the page does not update without scripts")
			}
		})
	}

	screenshot(t, base+"?sort=missing&desc=1", "status-page.png", 1400, 1500)
}

// thousandRanks is a fleet of 125 workers × 8 ranks for the page: two ranks with gaps, one stale.
type thousandRanks struct{ now time.Time }

func (thousandRanks) Group() string { return "fpm-gaps" }

func (f thousandRanks) Publishers(context.Context) ([]observe.Publisher, error) {
	var out []observe.Publisher
	for w := range 125 {
		for r := range 8 {
			p := observe.Publisher{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprintf("worker-%03d", w), DPRank: r,
				State: "live", Flowing: true, Rate: 100, LastSeen: f.now, Messages: 90_000, Gaps: map[string]uint64{}, Missing: map[string]uint64{}}
			switch {
			case w == 42 && r == 5:
				p.Gaps["zmq_drop"], p.Missing["zmq_drop"], p.GapsTotal, p.MissingTotal = 3, 120, 3, 120
			case w == 77 && r == 1:
				p.Gaps["bridge_drop"], p.Missing["bridge_drop"], p.GapsTotal, p.MissingTotal = 1, 9, 1, 9
			case w == 100 && r == 7:
				p.State, p.Flowing, p.Rate = "stale", false, 0
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// 1,000 ranks stay readable in a real browser: the summary says how many flow and how many have
// gaps; sorted by missing FPMs the two workers with gaps come first and open, the others closed; 50
// workers a page with a link to the next; a filter in the URL narrows it to one worker.
func TestStatusPageInChromiumAtAThousandRanks(t *testing.T) {
	t.Parallel()
	srv := observe.New(observe.Options{Process: "up", Gatherer: prometheus.NewRegistry(), Publishers: thousandRanks{time.Now()}})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	dom := pageDOM(t, ts.URL+"/?sort=missing&desc=1", 3000)
	rows := pageRows(dom)
	if attr(dom, "body", "data-render") != "script" || len(rows) != 50*8 {
		t.Fatalf("render %q, %d rows: want the script's, 50 workers of 8", attr(dom, "body", "data-render"), len(rows))
	}
	if rows[0].key != "dynamo/backend/worker-042/5" || rows[0].byCause["zmq_drop"] != "120" || rows[8].key != "dynamo/backend/worker-077/1" {
		t.Fatalf("sorted by missing: first %+v, ninth %+v", rows[0], rows[8])
	}
	open := regexp.MustCompile(`<details class="group" data-worker="([^"]+)" open="">`).FindAllStringSubmatch(dom, -1)
	if len(open) != 2 || open[0][1] != "dynamo/backend/worker-042" || strings.Count(dom, `<details class="group"`) != 50 {
		t.Fatalf("open groups %v of %d: want the two with gaps", open, strings.Count(dom, `<details class="group"`))
	}
	for id, want := range map[string]string{"sum-total": "1000", "sum-flowing": "999 flowing", "sum-gaps": "2 with gaps", "sum-stale": "1 stale"} {
		if got := textOf(dom, id); got != want {
			t.Fatalf("summary %s: %q, want %q", id, got, want)
		}
	}
	if !strings.Contains(dom, `id="next"`) || !strings.Contains(dom, "showing 1–50") {
		t.Fatal("no next page")
	}
	dom = pageDOM(t, ts.URL+"/?q=worker-100&state=notflowing", 3000)
	if rows := pageRows(dom); len(rows) != 1 || rows[0].key != "dynamo/backend/worker-100/7" || rows[0].state != "stale" {
		t.Fatalf("filtered to the silent rank: %+v", rows)
	}
	screenshot(t, ts.URL+"/?sort=missing&desc=1", "status-page-1000-ranks.png", 1400, 1000)
}
