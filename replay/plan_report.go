package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteDamage lists, one line each, the damaged segments the recording was read around, and how many
// invalid records were skipped (with the first), as `trace replay` prints them.
func (rec *Recording) WriteDamage(w io.Writer) error {
	for _, d := range rec.Damaged {
		if _, err := fmt.Fprintf(w, "damaged: %s\n", d); err != nil {
			return err
		}
	}
	if rec.Invalid > 0 {
		_, err := fmt.Fprintf(w, "invalid records skipped: %d (first: %s)\n", rec.Invalid, rec.InvalidExamples[0])
		return err
	}
	return nil
}

// planView is the --dry-run --json document.
type planView struct {
	Plan     Shape             `json:"plan"`
	Speed    float64           `json:"speed"`
	MaxRate  float64           `json:"max_rate,omitempty"`
	Passes   int               `json:"passes"`
	PeriodS  float64           `json:"period_s"`
	Sockets  []planSocket      `json:"sockets"`
	Skipped  map[string]int    `json:"skipped"`
	Examples []string          `json:"skipped_examples,omitempty"`
	Damaged  []Damage          `json:"damaged,omitempty"`
	Workers  map[string]string `json:"map_worker,omitempty"`
}

type planSocket struct {
	Rank       string `json:"rank"`
	To         string `json:"to"`
	Records    int    `json:"records"`
	Heartbeats bool   `json:"heartbeats"`
}

// WritePlan writes what a dry run of r would do with p (`trace replay --dry-run`): the plan's shape,
// pace and passes, each socket's endpoint and records, what was skipped and damaged; as an indented
// JSON document (planView) with asJSON.
func WritePlan(w io.Writer, p *Plan, r *replayer, asJSON bool) error {
	v := planView{Plan: p.Shape(), Speed: p.Config.Speed, MaxRate: p.Config.MaxRate, Passes: p.Config.Loops, PeriodS: p.Period.Seconds(),
		Skipped: p.Skipped, Examples: p.Examples, Damaged: p.Recording.Damaged, Workers: p.Config.MapWorker}
	for i := range p.Sockets {
		s := &p.Sockets[i]
		to := r.Endpoint(i)
		if !s.Active() {
			to = "(nothing in the window)"
		}
		v.Sockets = append(v.Sockets, planSocket{Rank: s.Label(), To: to, Records: s.Records, Heartbeats: s.Heartbeats})
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	passes := fmt.Sprint(v.Passes)
	if v.Passes < 0 {
		passes = "until interrupted"
	}
	title := fmt.Sprintf("plan at speed %g (passes: %s, each %.3fs)", v.Speed, passes, v.PeriodS)
	if v.MaxRate > 0 {
		title += fmt.Sprintf(", at most %g/s", v.MaxRate)
	}
	if err := v.Plan.WriteText(w, title); err != nil {
		return err
	}
	var b strings.Builder
	for _, s := range v.Sockets {
		hb := ""
		if s.Heartbeats {
			hb = ", heartbeats"
		}
		fmt.Fprintf(&b, "  %s -> %s (%d records%s)\n", s.Rank, s.To, s.Records, hb)
	}
	for k, n := range v.Skipped {
		fmt.Fprintf(&b, "skipped %s: %d\n", k, n)
	}
	for _, e := range v.Examples {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	for _, d := range v.Damaged {
		fmt.Fprintf(&b, "damaged: %s\n", d)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
