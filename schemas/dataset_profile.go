package schemas

import (
	"encoding/json"
	"fmt"
	"io"
)

// CollectionProfile is the user-supplied description of how a cell was collected: the hardware and every
// latency-affecting setting the engine block does not record (clocks, exclusive nodes, driver, CUDA,
// container image digest, ...). It travels with the run (`fpmbus bench publish --profile FILE`, on
// subject fpmbench.profile.<run>) and enters the cell identity twice: Hardware, Name and Version as
// explicit fields, the whole profile inside the settings digest. Bumping Version makes a new identity.
type CollectionProfile struct {
	SchemaVersion int            `json:"schema_version"`
	Name          string         `json:"name"`
	Version       string         `json:"version"`
	Hardware      string         `json:"hardware"`
	Settings      map[string]any `json:"settings,omitempty"`
}

// DecodeProfile parses a collection profile strictly.
func DecodeProfile(r io.Reader) (*CollectionProfile, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var p CollectionProfile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("profile: decode: %w", err)
	}
	switch {
	case p.SchemaVersion != DatasetSchemaVersion:
		return nil, fmt.Errorf("profile: schema_version %d, want %d", p.SchemaVersion, DatasetSchemaVersion)
	case p.Name == "" || p.Version == "" || p.Hardware == "":
		return nil, fmt.Errorf("profile: name, version and hardware are required")
	case looksLikeHostOrSecret(p.Hardware) || looksLikeHostOrSecret(p.Name):
		return nil, fmt.Errorf("profile: name or hardware looks like a host, URL or credential")
	}
	return &p, nil
}
