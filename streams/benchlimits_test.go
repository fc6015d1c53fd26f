package streams

import (
	"errors"
	"strings"
	"testing"
)

// A run_id is refused exactly when some place fpmbus carries it could not hold it: empty, a control
// character (the Fpm-Bench-Run header), or a subject token over MaxRunIDToken bytes, escapes counted.
func TestCheckRunIDRefusesWhatARunCannotBeNamedBy(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		runID string
		ok    bool
		says  string
	}{
		"hex":                                 {"9e1d3c5b7a9f1e3d5c7b9a1f3e5d7c9b", true, ""},
		"uuid":                                {"0b7e4f6a-3c2d-4e1f-9a8b-7c6d5e4f3a2b", true, ""},
		"dots and spaces are escaped":         {"run 1.2", true, ""},
		"exactly the limit":                   {strings.Repeat("r", MaxRunIDToken), true, ""},
		"one byte over":                       {strings.Repeat("r", MaxRunIDToken+1), false, "129 bytes (129 as a subject token)"},
		"300 characters":                      {strings.Repeat("r", 300), false, "the limit is 128 token bytes"},
		"escapes count three":                 {strings.Repeat(".", 43), false, "43 bytes (129 as a subject token)"},
		"escapes within the limit":            {strings.Repeat(".", 42), true, ""},
		"empty":                               {"", false, "empty"},
		"a newline would split the header":    {"run\n1", false, "control character"},
		"a carriage return":                   {"run\r", false, "control character"},
		"DEL":                                 {"run\x7f", false, "control character"},
		"non-ASCII is escaped, not forbidden": {"läuft", true, ""},
	} {
		err := CheckRunID(tc.runID)
		if (err == nil) != tc.ok {
			t.Errorf("%s: CheckRunID = %v, want ok %v", name, err, tc.ok)
			continue
		}
		if err != nil && (!errors.Is(err, ErrRunID) || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("%s: %v does not wrap ErrRunID or say %q", name, err, tc.says)
		}
	}
}

func TestCheckArtefactSizeNamesTheArtefactItsSizeAndTheLimit(t *testing.T) {
	t.Parallel()
	if err := CheckArtefactSize("a.json", DefaultBenchMaxArtefact, DefaultBenchMaxArtefact); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if err := CheckArtefactSize("a.json", 1<<40, -1); err != nil {
		t.Fatalf("no limit: %v", err)
	}
	err := CheckArtefactSize("/data/rank_dp3.json", 1<<30, DefaultBenchMaxArtefact)
	if !errors.Is(err, errArtefactTooLarge) {
		t.Fatalf("%v does not wrap ErrArtefactTooLarge", err)
	}
	for _, want := range []string{"/data/rank_dp3.json", "1073741824 bytes (1024.0 MiB)", "268435456 bytes (256.0 MiB)", "before reading"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
