// Package envflag is the one path by which fpmbus reads its environment. A program declares every
// variable it reads once, in a Set: its name, the commands that read it and its meaning (the README's
// Environment table is rendered from the Set, so the table and the code cannot drift) and how a value is
// checked. A variable is read only through its Set, mostly as the default of a flag (Defaults): a flag
// given on the command line overrides its variable, so a malformed value is reported only when its flag
// was not given; until then the flag shows its built-in default.
//
// A value a check refuses is an invalid.FlagError naming the variable and the value, which the command
// reports as a usage error (exit status 2). A variable set to the empty string is unset, except where a
// Var says otherwise (EmptyIsSet: Dynamo parses every DYN_FPM_* trace variable that is set, and the
// empty string parses as nothing valid).
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/invalid"
)

// Var declares one environment variable.
type Var struct {
	Name    string
	UsedBy  string // commands that read it, for the README
	Meaning string // for the README
	// Check validates a set value and returns it normalized, or says what is wrong with it (the Set
	// names the variable and the value). Nil: any text, trimmed; blank is unset.
	Check func(raw string) (string, error)
	// EmptyIsSet makes an empty value a value (checked), not an unset variable.
	EmptyIsSet bool
}

// Set is every variable a program reads, in the order its README lists them.
type Set []Var

// Table renders s as a Markdown table: variable, used by, meaning.
func (s Set) Table() string {
	var b strings.Builder
	b.WriteString("| variable | used by | meaning |\n|---|---|---|\n")
	for _, v := range s {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, v.UsedBy, v.Meaning)
	}
	return b.String()
}

// Lookup returns the declaration of name. Reading an undeclared variable is a programming error: it
// panics, so that no variable escapes the README.
func (s Set) Lookup(name string) Var {
	for _, v := range s {
		if v.Name == name {
			return v
		}
	}
	panic("envflag: environment variable " + name + " is read but not declared in its Set")
}

// Value returns the checked value of variable name and whether it is set (not empty, unless
// EmptyIsSet). A value its check refuses is an invalid.FlagError naming the variable and the value.
func (s Set) Value(name string) (string, bool, error) {
	v := s.Lookup(name)
	raw, set := os.LookupEnv(name)
	if !set || raw == "" && !v.EmptyIsSet {
		return "", false, nil
	}
	if v.Check == nil {
		t := strings.TrimSpace(raw)
		return t, t != "", nil
	}
	t, err := v.Check(raw)
	if err != nil {
		return "", true, invalid.Flagf("%s=%q: %v", name, raw, err)
	}
	return t, true, nil
}

// Or returns the value of the text variable name, or def when it is unset or blank. Only for variables
// without a check: a checked one is read with Value or Defaults, which report a bad value instead of
// ignoring it.
func (s Set) Or(name, def string) string {
	if s.Lookup(name).Check != nil {
		panic("envflag: Or(" + name + "): a checked variable must be read with Value or Defaults")
	}
	if v, ok, _ := s.Value(name); ok {
		return v
	}
	return def
}

// Defaults gives the flags of fs their defaults from the variables of s.
func (s Set) Defaults(fs *flag.FlagSet) *Defaults { return &Defaults{set: s, fs: fs} }

// Defaults gives flags their defaults from the environment and remembers the malformed values, to be
// reported by Err once the command line is parsed.
type Defaults struct {
	set Set
	fs  *flag.FlagSet
	bad []badDefault
}

type badDefault struct {
	flag string
	err  error
}

// Text returns the value of variable name as the default of flag flagName, else def.
func (d *Defaults) Text(flagName, name, def string) string {
	v, ok, err := d.set.Value(name)
	if err != nil {
		d.bad = append(d.bad, badDefault{flagName, err})
		return def
	}
	if !ok {
		return def
	}
	return v
}

// Int returns the integer value of variable name as the default of flag flagName, else def.
func (d *Defaults) Int(flagName, name string, def int) int {
	s := d.Text(flagName, name, "")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil { // the variable's check admits only integers
		d.bad = append(d.bad, badDefault{flagName, invalid.Flagf("%s=%q: not an integer", name, s)})
		return def
	}
	return n
}

// Err reports the first malformed variable whose flag was not given; call it after parsing.
func (d *Defaults) Err() error {
	for _, b := range d.bad {
		if !flagprefix.Given(d.fs, b.flag) {
			return b.err
		}
	}
	return nil
}
