package observe

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// query selects and orders the publishers of the status: the page's URL parameters and /status.json's
// (the page's script asks for what its URL says, so a shared link shows the same view).
type query struct {
	// Filter keeps publishers whose "namespace/component/worker_id/dp_rank" contains it (case-insensitive).
	Filter string `json:"q,omitempty"`
	// State keeps: "gaps" publishers with a gap, "stale", "restarted", "live", "notflowing"; "" all.
	State string `json:"state,omitempty"`
	// Sort is the column: key (default), state, rate, last_seen, messages, gaps, missing or a cause
	// (missing FPMs of that cause). Groups are ordered by the same column over their ranks.
	Sort string `json:"sort"`
	Desc bool   `json:"desc,omitempty"`
	// Offset and Limit page the worker groups (Limit default 50, at most 1000).
	Offset int `json:"offset,omitempty"`
	Limit  int `json:"limit"`
}

// Query parameter defaults and bounds.
const (
	defaultGroupLimit = 50
	maxGroupLimit     = 1000
)

var causes = []string{"bridge_drop", "zmq_drop", "publisher_restart", "stale", "late_start"}

var sortColumns = append([]string{"key", "state", "rate", "last_seen", "messages", "gaps", "missing"}, causes...)

var stateFilters = []string{"", "gaps", "stale", "restarted", "live", "notflowing"}

// parseQuery reads q, sort, desc, state, offset and limit; a value it does not know is its default.
func parseQuery(v url.Values) query {
	q := query{Filter: strings.TrimSpace(v.Get("q")), Sort: v.Get("sort"), State: v.Get("state"), Limit: defaultGroupLimit}
	if !slices.Contains(sortColumns, q.Sort) {
		q.Sort = "key"
	}
	if !slices.Contains(stateFilters, q.State) {
		q.State = ""
	}
	q.Desc = v.Get("desc") == "1" || v.Get("desc") == "true"
	if n, err := strconv.Atoi(v.Get("offset")); err == nil && n > 0 {
		q.Offset = n
	}
	if n, err := strconv.Atoi(v.Get("limit")); err == nil && n > 0 {
		q.Limit = min(n, maxGroupLimit)
	}
	return q
}

// Values is q as URL parameters (defaults left out).
func (q query) Values() url.Values {
	v := url.Values{}
	if q.Filter != "" {
		v.Set("q", q.Filter)
	}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.Sort != "" && q.Sort != "key" {
		v.Set("sort", q.Sort)
	}
	if q.Desc {
		v.Set("desc", "1")
	}
	if q.Offset > 0 {
		v.Set("offset", strconv.Itoa(q.Offset))
	}
	if q.Limit != 0 && q.Limit != defaultGroupLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

func (p *Publisher) key() string {
	return p.Namespace + "/" + p.Component + "/" + p.WorkerID + "/" + strconv.Itoa(p.DPRank)
}

func (p *Publisher) keep(q query) bool {
	if q.Filter != "" && !strings.Contains(strings.ToLower(p.key()), strings.ToLower(q.Filter)) {
		return false
	}
	switch q.State {
	case "gaps":
		return p.GapsTotal > 0
	case "stale", "restarted", "live":
		return p.State == q.State
	case "notflowing":
		return !p.Flowing
	}
	return true
}

// severity orders states: the worst first when sorting by state descending.
func severity(state string) int {
	switch state {
	case "stale":
		return 2
	case "restarted":
		return 1
	}
	return 0
}

// compare orders two publishers (or two groups' aggregates) by column col.
func compare(a, b *Publisher, col string) int {
	switch col {
	case "state":
		return cmp.Compare(severity(a.State), severity(b.State))
	case "rate":
		return cmp.Compare(a.Rate, b.Rate)
	case "last_seen":
		return a.LastSeen.Compare(b.LastSeen)
	case "messages":
		return cmp.Compare(a.Messages, b.Messages)
	case "gaps":
		return cmp.Compare(a.GapsTotal, b.GapsTotal)
	case "missing":
		return cmp.Compare(a.MissingTotal, b.MissingTotal)
	case "key":
		return 0
	}
	return cmp.Compare(a.Missing[col], b.Missing[col])
}

func byKey(a, b *Publisher) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Component, b.Component),
		cmp.Compare(a.WorkerID, b.WorkerID), cmp.Compare(a.DPRank, b.DPRank))
}

// arrange summarizes rows, keeps what q filters, groups them by worker, sorts and pages the groups.
func arrange(group string, rows []Publisher, err error, q query) *publishers {
	out := &publishers{Group: group, Query: q, Groups: []publisherGroup{}, Causes: causes, Totals: map[string]uint64{}}
	if err != nil {
		out.Error = err.Error()
	}
	for i := range rows {
		p := &rows[i]
		out.Summary.Total++
		out.Summary.Missing += p.MissingTotal
		out.Summary.Rate += p.Rate
		if p.Flowing {
			out.Summary.Flowing++
		}
		if p.GapsTotal > 0 {
			out.Summary.WithGaps++
		}
		switch p.State {
		case "stale":
			out.Summary.Stale++
		case "restarted":
			out.Summary.Restarted++
		}
		for c, n := range p.Missing {
			out.Totals[c] += n
		}
	}
	type agg struct {
		g   publisherGroup
		sum Publisher // the group as one row, for sorting
	}
	groups := map[[3]string]*agg{}
	for i := range rows {
		p := rows[i]
		if !p.keep(q) {
			continue
		}
		out.Matched++
		k := [3]string{p.Namespace, p.Component, p.WorkerID}
		a := groups[k]
		if a == nil {
			a = &agg{g: publisherGroup{Namespace: p.Namespace, Component: p.Component, WorkerID: p.WorkerID},
				sum: Publisher{Namespace: p.Namespace, Component: p.Component, WorkerID: p.WorkerID, LastSeen: p.LastSeen, Missing: map[string]uint64{}}}
			groups[k] = a
		}
		a.g.Rows = append(a.g.Rows, p)
		a.g.Ranks++
		a.g.Missing += p.MissingTotal
		a.g.Rate += p.Rate
		if p.Flowing {
			a.g.Flowing++
		}
		if p.GapsTotal > 0 {
			a.g.WithGaps++
		}
		if p.State == "stale" {
			a.g.Stale++
		}
		s := &a.sum
		s.Rate += p.Rate
		s.Messages += p.Messages
		s.GapsTotal += p.GapsTotal
		s.MissingTotal += p.MissingTotal
		for c, n := range p.Missing {
			s.Missing[c] += n
		}
		if severity(p.State) > severity(s.State) || s.State == "" {
			s.State = p.State
		}
		if p.LastSeen.Before(s.LastSeen) {
			s.LastSeen = p.LastSeen // the group's oldest: the one to look at
		}
	}
	order := func(a, b *Publisher) int {
		c := compare(a, b, q.Sort)
		if q.Desc {
			c = -c
		}
		return cmp.Or(c, byKey(a, b))
	}
	all := make([]*agg, 0, len(groups))
	for _, a := range groups {
		slices.SortFunc(a.g.Rows, func(x, y Publisher) int { return order(&x, &y) })
		all = append(all, a)
	}
	slices.SortFunc(all, func(x, y *agg) int { return order(&x.sum, &y.sum) })
	out.GroupCount = len(all)
	from := min(q.Offset, len(all))
	to := min(from+q.Limit, len(all))
	for _, a := range all[from:to] {
		out.Groups = append(out.Groups, a.g)
	}
	out.Shown = len(out.Groups)
	return out
}
