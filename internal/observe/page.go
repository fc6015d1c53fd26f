package observe

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// The page at /: the status rendered on the server (useful with scripts disabled), with its style and
// script embedded in the binary. The script (status.js) polls /status.json with the page's query and
// renders the same markup; the ids, classes and data attributes below are the contract the two share
// (and the tests read).

var (
	//go:embed page.html
	pageHTML string
	//go:embed page.css
	pageCSS []byte
	//go:embed page.js
	pageJS []byte
)

var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"num":     formatNum,
	"rate":    formatRate,
	"secs":    formatSeconds,
	"bytes":   formatBytes,
	"age":     formatAge,
	"ago":     formatAgo,
	"causeOf": func(m map[string]uint64, c string) uint64 { return m[c] },
	"sortURL": sortURL,
	"pageURL": pageURL,
	"sorted":  sortedKeys,
	"open":    groupOpen,
	"sortMark": func(q query, col string) string {
		if q.Sort != col {
			return ""
		}
		if q.Desc {
			return " ▾"
		}
		return " ▴"
	},
	"plus": func(a, b int) int { return a + b },
	"key":  func(p Publisher) string { return p.key() },
}).Parse(pageHTML))

// pageData is what the template renders.
type pageData struct {
	*Status
	Now         time.Time
	StateFilter []string
}

func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	st := s.Status(r.Context(), parseQuery(r.URL.Query()))
	var buf bytes.Buffer
	if err := pageTmpl.Execute(&buf, pageData{Status: st, Now: st.Time, StateFilter: stateFilters}); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

func formatNum(v any) string {
	var f float64
	switch x := v.(type) {
	case uint64:
		f = float64(x)
	case int:
		f = float64(x)
	case float64:
		f = x
	default:
		return fmt.Sprint(v)
	}
	switch {
	case f >= 1e9:
		return strconv.FormatFloat(f/1e9, 'f', 2, 64) + "G"
	case f >= 1e6:
		return strconv.FormatFloat(f/1e6, 'f', 2, 64) + "M"
	case f >= 1e4:
		return strconv.FormatFloat(f/1e3, 'f', 1, 64) + "k"
	case f == math.Trunc(f):
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

func formatRate(f float64) string {
	if f == 0 {
		return "0/s"
	}
	if f < 10 {
		return strconv.FormatFloat(f, 'f', 1, 64) + "/s"
	}
	return formatNum(math.Round(f)) + "/s"
}

func formatSeconds(f float64) string {
	switch {
	case f == 0:
		return "–"
	case f < 0.001:
		return strconv.FormatFloat(f*1e6, 'f', 0, 64) + " µs"
	case f < 1:
		return strconv.FormatFloat(f*1e3, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(f, 'f', 2, 64) + " s"
}

func formatBytes(v any) string {
	var f float64
	switch x := v.(type) {
	case int64:
		f = float64(x)
	case uint64:
		f = float64(x)
	case float64:
		f = x
	}
	if f < 0 {
		return "unlimited"
	}
	for _, unit := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if f < 1024 || unit == "TiB" {
			if unit == "B" {
				return strconv.FormatFloat(f, 'f', 0, 64) + " B"
			}
			return strconv.FormatFloat(f, 'f', 1, 64) + " " + unit
		}
		f /= 1024
	}
	return ""
}

// formatAge renders a stream's max age or window (0: unlimited).
func formatAge(sec float64) string {
	if sec <= 0 {
		return "unlimited"
	}
	return time.Duration(sec * float64(time.Second)).String()
}

func formatAgo(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s ago"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m ago"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h ago"
	}
	return t.UTC().Format("2006-01-02 15:04")
}

// sortURL is the page's URL sorting by col: the same column again flips the order; a new column
// starts descending for amounts, ascending for the key.
func sortURL(q query, col string) string {
	n := q
	n.Offset = 0
	if q.Sort == col {
		n.Desc = !q.Desc
	} else {
		n.Sort, n.Desc = col, col != "key"
	}
	return "?" + n.Values().Encode()
}

// pageURL is the page's URL at group offset off.
func pageURL(q query, off int) string {
	n := q
	n.Offset = max(off, 0)
	return "?" + n.Values().Encode()
}

func sortedKeys(m map[string]uint64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// groupOpen says whether a worker's group is shown open: when it has a gap, a stale or silent rank, or
// when few groups are shown.
func groupOpen(g publisherGroup, shown int) bool {
	return shown <= 4 || g.WithGaps > 0 || g.Stale > 0 || g.Flowing < g.Ranks
}
