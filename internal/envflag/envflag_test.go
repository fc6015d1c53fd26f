package envflag

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/invalid"
)

func TestDefaults(t *testing.T) {
	digits := func(raw string) (string, error) {
		if strings.Trim(raw, "0123456789") != "" || raw == "" {
			return "", errors.New("want digits")
		}
		return raw, nil
	}
	set := Set{
		{Name: "ENVFLAG_TEST_TEXT"},
		{Name: "ENVFLAG_TEST_N", Check: digits},
		{Name: "ENVFLAG_TEST_STRICT", Check: digits, EmptyIsSet: true},
	}
	for name, tc := range map[string]struct {
		env     map[string]string
		args    []string
		text    string
		n       int
		wantErr string // "" for none; else what the error names
	}{
		"unset: the built-in defaults":         {text: "def", n: 7},
		"text is trimmed":                      {env: map[string]string{"ENVFLAG_TEST_TEXT": "  v  "}, text: "v", n: 7},
		"a checked value":                      {env: map[string]string{"ENVFLAG_TEST_N": "42"}, text: "def", n: 42},
		"a refused value names the variable":   {env: map[string]string{"ENVFLAG_TEST_N": "4x"}, text: "def", n: 7, wantErr: `ENVFLAG_TEST_N="4x": want digits`},
		"a given flag overrides a bad value":   {env: map[string]string{"ENVFLAG_TEST_N": "4x"}, args: []string{"-n", "3"}, text: "def", n: 3},
		"empty is unset by default":            {env: map[string]string{"ENVFLAG_TEST_N": ""}, text: "def", n: 7},
		"empty is a value where Dynamo's is":   {env: map[string]string{"ENVFLAG_TEST_STRICT": ""}, text: "def", n: 7, wantErr: `ENVFLAG_TEST_STRICT="": want digits`},
		"a flag given elsewhere does not hide": {env: map[string]string{"ENVFLAG_TEST_N": "x"}, args: []string{"-text", "t"}, text: "t", n: 7, wantErr: `ENVFLAG_TEST_N="x"`},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			d := set.Defaults(fs)
			text := fs.String("text", d.Text("text", "ENVFLAG_TEST_TEXT", "def"), "")
			n := fs.Int("n", d.Int("n", "ENVFLAG_TEST_N", 7), "")
			fs.Int("strict", d.Int("strict", "ENVFLAG_TEST_STRICT", 0), "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if *text != tc.text || *n != tc.n {
				t.Fatalf("text %q n %d, want %q %d", *text, *n, tc.text, tc.n)
			}
			err := d.Err()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			var fe *invalid.FlagError
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &fe) {
				t.Fatalf("error %v, want a FlagError naming %s", err, tc.wantErr)
			}
		})
	}
}

func TestReadingAnUndeclaredVariablePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Set{{Name: "ENVFLAG_TEST_A"}}.Or("ENVFLAG_TEST_B", "")
}
