// Package flagprefix is the one rule for the names of a component's flags. Every component's flags are
// defined once, next to its Config. A standalone command (`fpmbus trace`, `fpmbus gaps`, …) registers
// them under their own names; `fpmbus up` registers every component on one FlagSet, with one rule:
//
//   - the bridge's, the stream flags and up's own (--fpm-port, --replicas, --listen, --metrics-addr) are
//     unprefixed;
//   - every flag of a consumer carries its component prefix: --trace-…, --gaps-…, --merge-…, --seal-…
//     (a name that has it already keeps it: --trace-mode, --gaps-group, --merge-durable).
//
// The names `fpmbus up` accepted before the rule (--roll-bytes, --group, --rank-timeout, …) stay as
// deprecated aliases that set the prefixed flag and warn once. An old name now owned by an unprefixed
// flag (--producer-id and --stop-timeout are the bridge's) is not an alias, so `up` registers the bridge
// before the consumers.
//
// The pattern a component follows: its flags are defined next to its Config, as
//
//	func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags // c's values as defaults
//	func (f *Flags) Config() (Config, error)                              // validated; errors name the flag, with its prefix
//
// (bridge/flags.go, producer/flags.go, consumers/*/flags.go). cmd calls RegisterFlags with "" in the
// standalone command and with the component prefix in `up`. A consumer names its flags through a
// Component, which applies the rule and, once its flags are registered (Done), adds the deprecated
// aliases.
package flagprefix

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Component prefixes of the consumers' flags in `fpmbus up`.
const (
	Trace = "trace-"
	Gaps  = "gaps-"
	Merge = "merge-"
	Seal  = "seal-"
)

// Name is the name of a component's flag standalone-named name in a FlagSet where the component's
// flags carry prefix ("" for none).
func Name(prefix, name string) string {
	if prefix == "" || strings.HasPrefix(name, prefix) {
		return name
	}
	return prefix + name
}

// Component registers one consumer's flags under their standalone names (prefix "") or, in `up`,
// under their prefixed names; Done adds the deprecated aliases.
type Component struct {
	fs      *flag.FlagSet
	prefix  string
	renamed []string // standalone names the prefix changed
}

// On returns the Component whose flags are registered on fs under prefix.
func On(fs *flag.FlagSet, prefix string) *Component {
	return &Component{fs: fs, prefix: prefix}
}

// Name returns the name to register the flag standalone-named n under.
func (c *Component) Name(n string) string {
	p := Name(c.prefix, n)
	if p != n {
		c.renamed = append(c.renamed, n)
	}
	return p
}

// Flag is the flag standalone-named n as the user writes it, for messages: "--" and its name.
func (c *Component) Flag(n string) string { return dashedName(c.prefix, n) }

// Done registers the standalone names the prefix changed as deprecated aliases.
func (c *Component) Done() { deprecateUnprefixed(c.fs, c.prefix, c.renamed...) }

// dashedName is "--" plus the registered name of the flag standalone-named n, for messages.
func dashedName(prefix, n string) string { return "--" + Name(prefix, n) }

// deprecateUnprefixed registers each of names, when fs does not define it already, as a deprecated
// alias of the prefixed flag: it sets that flag (which then counts as given) and warns once.
func deprecateUnprefixed(fs *flag.FlagSet, prefix string, names ...string) {
	for _, old := range names {
		target := Name(prefix, old)
		t := fs.Lookup(target)
		if target == old || t == nil || fs.Lookup(old) != nil {
			continue
		}
		b, isBool := t.Value.(interface{ IsBoolFlag() bool })
		a := &Alias{fs: fs, old: old, target: target, isBool: isBool && b.IsBoolFlag(), once: &sync.Once{}}
		fs.Var(a, old, "deprecated alias of --"+target)
		if a.isBool {
			fs.Lookup(old).DefValue = "" // -h shows no "(default false)" for a switch
		}
	}
}

// Alias is a deprecated flag name: setting it sets target and warns the first time. -h lists no Alias.
type Alias struct {
	fs          *flag.FlagSet
	old, target string
	isBool      bool
	once        *sync.Once
}

func (a *Alias) String() string {
	if a == nil || a.fs == nil {
		return ""
	}
	return a.fs.Lookup(a.target).Value.String()
}

func (a *Alias) Set(v string) error {
	a.once.Do(func() {
		slog.Warn("flag --" + a.old + " is deprecated in fpmbus up: use --" + a.target)
	})
	return a.fs.Set(a.target, v)
}

func (a *Alias) IsBoolFlag() bool { return a != nil && a.isBool }

// Invalid is a flag value a component's Flags.Config refuses: its message names the flag and the value
// (formatted from format and args) and nothing else, since the command reports it as a usage error,
// and it wraps the component's sentinel (its ErrInvalidConfig), so that errors.Is finds it.
func Invalid(sentinel error, format string, args ...any) error {
	return &invalidFlag{sentinel: sentinel, msg: fmt.Sprintf(format, args...)}
}

type invalidFlag struct {
	sentinel error
	msg      string
}

func (e *invalidFlag) Error() string { return e.msg }
func (e *invalidFlag) Unwrap() error { return e.sentinel }

// Given reports whether the flag name was set on the command line of fs (directly or through a
// deprecated alias, which sets its flag).
func Given(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}
