package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
)

// WriteText writes the report as `fpmbus datasets publish` prints it: the run and campaign, a table of
// the cells (key, state, source, run, dataset digest, identity, reason) and the rejections.
func (rep *report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run %s  campaign %s (%s)\n", rep.RunID, rep.CampaignID, rep.Campaign)
	fmt.Fprintln(tw, "KEY\tSTATE\tSOURCE\tRUN\tDATASET DIGEST\tIDENTITY\tREASON")
	for _, c := range rep.Cells {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Key, c.State, c.Source, c.RunID, ShortDigest(c.DatasetDigest), identityText(c.Identity), c.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rep.Rejections {
		if _, err := fmt.Fprintf(w, "rejected: %v\n", r); err != nil {
			return err
		}
	}
	return nil
}

// ShortDigest is the first 16 characters of a digest (or key), as the listings show it.
func ShortDigest(d string) string {
	if len(d) > 16 {
		return d[:16]
	}
	return d
}

// identityText is a cell identity on one line: model, hardware, backend and version, quantization,
// parallelism, profile and settings digest.
func identityText(id *schemas.CellIdentity) string {
	if id == nil {
		return ""
	}
	p := id.Parallelism
	return fmt.Sprintf("%s %s %s %s %s tp%d pp%d dp%d ep%d profile %s@%s settings %s", id.Model, id.Hardware, id.Backend,
		id.BackendVersion, id.Quantization, p.TP, p.PP, p.DP, p.MoEEP, id.ProfileName, id.ProfileVersion, ShortDigest(id.SettingsDigest))
}

// WriteText writes the coverage as `fpmbus datasets coverage` prints it: the campaign's state and
// counts, the estimated (and budgeted) GPU-hours, unsupported settings and a table of the cells.
func (rep *coverageReport) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "campaign %s: %s — %d covered, %d partial, %d missing; estimated %.2f GPU-hours to collect",
		rep.CampaignID, rep.State, rep.Covered, rep.Partial, rep.Missing, rep.EstimatedGPUHours)
	if rep.BudgetGPUHours > 0 {
		fmt.Fprintf(w, " (budget %.2f%s)", rep.BudgetGPUHours, map[bool]string{true: ", OVER BUDGET: confirm before collecting"}[rep.OverBudget])
	}
	fmt.Fprintln(w)
	if len(rep.UnsupportedSettings) > 0 {
		fmt.Fprintf(w, "unsupported settings: %s\n", strings.Join(rep.UnsupportedSettings, ", "))
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tROWS\tGPU-H\tSOURCE\tRUN\tDATASET DIGEST\tIDENTITY")
	for _, c := range rep.Cells {
		id := c.Identity
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%.2f\t%s\t%s\t%s\t%s\n", c.Key, c.State, c.Rows, c.ExpectedRows, c.EstimatedGPUHours,
			c.Source, c.RunID, ShortDigest(c.DatasetDigest), identityText(&id))
	}
	return tw.Flush()
}

// WriteListing writes the entries of a bucket (List, ListProgress) as `fpmbus datasets ls` prints them:
// a table (key, state, revision, source, run, dataset digest, rows, identity, ignored revisions), or
// with asJSON one JSON object per key and line.
func WriteListing(w io.Writer, listing []entry, asJSON bool) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	if !asJSON {
		fmt.Fprintln(tw, "KEY\tSTATE\tREV\tSOURCE\tRUN\tDATASET DIGEST\tROWS\tIDENTITY\tIGNORED")
	}
	for _, e := range listing {
		ignored := ""
		if len(e.Ignored) > 0 {
			ignored = fmt.Sprintf("%d revision(s) ignored: tampering", len(e.Ignored))
		}
		switch {
		case e.Problem != "":
			if asJSON {
				_ = json.NewEncoder(w).Encode(map[string]any{"key": e.Key, "state": "no_record", "revision": e.Revision, "problem": e.Problem, "ignored_revisions": e.Ignored})
				continue
			}
			fmt.Fprintf(tw, "%s\tno record\t%d\t\t\t\t\t%s\t%s\n", e.Key, e.Revision, e.Problem, ignored)
		case e.Campaign != nil:
			c := e.Campaign
			if asJSON {
				_ = json.NewEncoder(w).Encode(map[string]any{"key": e.Key, "revision": e.Revision, "campaign": c, "ignored_revisions": e.Ignored})
				continue
			}
			fmt.Fprintf(tw, "%s\tcampaign %s\t%d\t\t\t\t%d cells\tplan %s\t%s\n", e.Key, c.State, e.Revision, len(c.Cells), ShortDigest(c.PlanDigest), ignored)
		default:
			v := e.Cell
			if asJSON {
				_ = json.NewEncoder(w).Encode(map[string]any{"key": e.Key, "state": "sealed", "revision": e.Revision, "source": v.Source,
					"run_id": v.Provenance.RunID, "dataset_digest": v.Provenance.DatasetDigest, "row_count": v.Provenance.RowCount, "identity": v.Identity,
					"ignored_revisions": e.Ignored})
				continue
			}
			fmt.Fprintf(tw, "%s\tsealed\t%d\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Key, e.Revision, v.Source, v.Provenance.RunID, ShortDigest(v.Provenance.DatasetDigest),
				v.Provenance.RowCount, identityText(&v.Identity), ignored)
		}
	}
	return tw.Flush()
}

// WriteHistory writes every revision of key, one line each (`fpmbus datasets history`); STATE says
// which revisions readers take (a cell's seal; a campaign's plan and legitimate successors) and which
// they ignore as tampering.
func WriteHistory(ctx context.Context, kv jetstream.KeyValue, key string, w io.Writer) error {
	hist, err := kv.History(ctx, key)
	if err != nil {
		return err
	}
	e, err := readEntry(ctx, kv, key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	ignored := map[uint64]string{}
	if e != nil {
		for _, t := range e.Ignored {
			ignored[t.Revision] = t.Reason
		}
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REV\tCREATED\tOP\tSTATE\tSOURCE\tRUN\tDATASET DIGEST\tATTEMPT")
	for _, h := range hist {
		var v struct {
			State      string             `json:"state"`
			Source     string             `json:"source"`
			AttemptID  string             `json:"attempt_id"`
			Provenance schemas.Provenance `json:"provenance"`
		}
		_ = json.Unmarshal(h.Value(), &v)
		if v.State == "" && v.AttemptID != "" {
			v.State = "sealed"
		}
		if why, ok := ignored[h.Revision()]; ok {
			v.State = "ignored (tampering: " + why + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Revision(), h.Created().UTC().Format("2006-01-02T15:04:05.000Z"),
			h.Operation(), v.State, v.Source, v.Provenance.RunID, ShortDigest(v.Provenance.DatasetDigest), v.AttemptID)
	}
	return tw.Flush()
}
