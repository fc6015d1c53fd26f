package main

import (
	"flag"
	"log/slog"
	"strings"
	"sync"
)

// Flag names. Every component's flags are defined once. A standalone command (`fpmbus trace`,
// `fpmbus gaps`, …) registers them under their own names; `fpmbus up` registers every component on one
// FlagSet, with one rule:
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
//	func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags // each flag named prefix+name, c's values as defaults
//	func (f *Flags) Config() (Config, error)                              // validated; errors name the flag, with its prefix
//
// (bridge/flags.go, producer/flags.go). cmd calls RegisterFlags with "" in the standalone command and
// with the component prefix in `up`, then deprecateUnprefixed for the names `up` used to accept. The
// consumers' flags are still registered here in cmd, through componentFlags, which applies the same
// rule; moving them next to their Configs changes no flag name.

// Component prefixes of the consumers' flags in `fpmbus up`.
const (
	tracePrefix = "trace-"
	gapsPrefix  = "gaps-"
	mergePrefix = "merge-"
	sealPrefix  = "seal-"
)

// prefixedName is the name of a component's flag standalone-named name in a FlagSet where the
// component's flags carry prefix ("" for none).
func prefixedName(prefix, name string) string {
	if prefix == "" || strings.HasPrefix(name, prefix) {
		return name
	}
	return prefix + name
}

// componentFlags registers one consumer's flags under their standalone names (prefix "") or, in `up`,
// under their prefixed names; done adds the deprecated aliases.
type componentFlags struct {
	fs      *flag.FlagSet
	prefix  string
	renamed []string // standalone names the prefix changed
}

func newComponentFlags(fs *flag.FlagSet, prefix string) *componentFlags {
	return &componentFlags{fs: fs, prefix: prefix}
}

// name returns the name to register the flag standalone-named n under.
func (c *componentFlags) name(n string) string {
	p := prefixedName(c.prefix, n)
	if p != n {
		c.renamed = append(c.renamed, n)
	}
	return p
}

// done registers the standalone names the prefix changed as deprecated aliases.
func (c *componentFlags) done() { deprecateUnprefixed(c.fs, c.prefix, c.renamed...) }

// flagName is "--" plus the registered name of the flag standalone-named n, for messages.
func flagName(prefix, n string) string { return "--" + prefixedName(prefix, n) }

// deprecateUnprefixed registers each of names, when fs does not define it already, as a deprecated
// alias of the prefixed flag: it sets that flag (which then counts as given) and warns once.
func deprecateUnprefixed(fs *flag.FlagSet, prefix string, names ...string) {
	for _, old := range names {
		target := prefixedName(prefix, old)
		t := fs.Lookup(target)
		if target == old || t == nil || fs.Lookup(old) != nil {
			continue
		}
		b, isBool := t.Value.(interface{ IsBoolFlag() bool })
		a := &aliasFlag{fs: fs, old: old, target: target, isBool: isBool && b.IsBoolFlag(), once: &sync.Once{}}
		fs.Var(a, old, "deprecated alias of --"+target)
		if a.isBool {
			fs.Lookup(old).DefValue = "" // -h shows no "(default false)" for a switch
		}
	}
}

// aliasFlag is a deprecated flag name: setting it sets target and warns the first time.
type aliasFlag struct {
	fs          *flag.FlagSet
	old, target string
	isBool      bool
	once        *sync.Once
}

func (a *aliasFlag) String() string {
	if a == nil || a.fs == nil {
		return ""
	}
	return a.fs.Lookup(a.target).Value.String()
}

func (a *aliasFlag) Set(v string) error {
	a.once.Do(func() {
		slog.Warn("flag --" + a.old + " is deprecated in fpmbus up: use --" + a.target)
	})
	return a.fs.Set(a.target, v)
}

func (a *aliasFlag) IsBoolFlag() bool { return a != nil && a.isBool }
