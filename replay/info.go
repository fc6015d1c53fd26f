package replay

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/tracefile"
)

// WriteInfo writes the recording's shape (DescribeRecording) and its damage, as a table or as indented
// JSON (`fpmbus trace replay --info`).
func (rec *Recording) WriteInfo(w io.Writer, asJSON bool) error {
	shape := describeRecording(rec)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Recorded Shape    `json:"recorded"`
			Damaged  []Damage `json:"damaged,omitempty"`
			Invalid  int      `json:"invalid"`
		}{shape, rec.Damaged, rec.Invalid})
	}
	if err := shape.WriteText(w, "recorded"); err != nil {
		return err
	}
	return rec.WriteDamage(w)
}

// WriteJSONFile writes the report as JSON (WriteJSON) to a new regular file at path.
func (rep *Report) WriteJSONFile(path string) error {
	f, err := fsutil.CreateRegular(path, 0o644)
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteTraceInfo is `fpmbus trace info`: it writes tracefile.Info's report of the segments paths name
// followed by the recording's shape (DescribeRecording), as a table or as indented JSON, and returns the
// report (its damaged segments decide the exit status).
func WriteTraceInfo(w io.Writer, paths []string, asJSON bool) (*tracefile.InfoReport, error) {
	rep, err := tracefile.Info(paths)
	if err != nil {
		return nil, err
	}
	rec, err := readTrace(paths)
	if err != nil {
		return nil, err
	}
	shape := describeRecording(rec)
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return rep, enc.Encode(struct {
			*tracefile.InfoReport
			Recorded Shape `json:"recorded"`
		}{rep, shape})
	}
	if err = rep.WriteText(w); err == nil {
		fmt.Fprintln(w)
		err = shape.WriteText(w, "recorded")
	}
	return rep, err
}
