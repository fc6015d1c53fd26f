package replay

import (
	"encoding/json"
	"io"

	"github.com/fpmbus/fpmbus/internal/fsutil"
)

// WriteInfo writes the recording's shape (DescribeRecording) and its damage, as a table or as indented
// JSON (`fpmbus trace replay --info`).
func (rec *Recording) WriteInfo(w io.Writer, asJSON bool) error {
	shape := DescribeRecording(rec)
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
