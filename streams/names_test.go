package streams

import "testing"

// A valid name is exactly what EncodeToken leaves alone, within the length asked for.
func TestValidNameIsWhatEncodeTokenKeeps(t *testing.T) {
	for name, tc := range map[string]struct {
		s      string
		maxLen int
		valid  bool
	}{
		"letters digits dash underscore": {"fpm-Trace_01", 64, true},
		"empty":                          {"", 64, false},
		"exactly the limit":              {"abcd", 4, true},
		"over the limit":                 {"abcde", 4, false},
		"dot splits a subject":           {"a.b", 64, false},
		"wildcard":                       {"a*", 64, false},
		"space":                          {"a b", 64, false},
		"non-ASCII":                      {"é", 64, false},
	} {
		if got := ValidName(tc.s, tc.maxLen); got != tc.valid {
			t.Errorf("%s: ValidName(%q, %d) = %v, want %v", name, tc.s, tc.maxLen, got, tc.valid)
		}
		if tc.s != "" && (EncodeToken(tc.s) == tc.s) != ValidName(tc.s, len(tc.s)) {
			t.Errorf("%s: EncodeToken(%q) = %q disagrees with ValidName", name, tc.s, EncodeToken(tc.s))
		}
	}
}
