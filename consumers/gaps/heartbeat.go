package gaps

import (
	"bytes"
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

var wallTimeField = []byte(`"wall_time":`)

// isHeartbeat reports whether the canonical FPM JSON body is an idle heartbeat (schemas.FPM.IsHeartbeat).
// A busy forward pass has a non-zero wall_time, which is read without parsing the whole body; only a
// zero wall_time costs a full parse.
func isHeartbeat(body []byte) bool {
	if i := bytes.Index(body, wallTimeField); i >= 0 {
		rest := body[i+len(wallTimeField):]
		j := 0
		for j < len(rest) && rest[j] != ',' && rest[j] != '}' {
			j++
		}
		if v, err := strconv.ParseFloat(string(bytes.TrimSpace(rest[:j])), 64); err == nil && v != 0 {
			return false
		}
	}
	f, err := schemas.ParseFPMJSON(body)
	return err == nil && f.IsHeartbeat()
}
