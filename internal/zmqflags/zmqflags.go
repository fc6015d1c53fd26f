package zmqflags

import (
	"flag"
	"fmt"
)

// Set is a command's FlagSet and the prefix of the flag names it defines (prefix "" in the commands
// that exist today).
type Set struct {
	fs     *flag.FlagSet
	prefix string
}

// On returns the Set of the flags named prefix+name on fs.
func On(fs *flag.FlagSet, prefix string) Set { return Set{fs: fs, prefix: prefix} }

// Name is flag n as the user writes it: --<prefix><n>.
func (s Set) Name(n string) string { return "--" + s.prefix + n }

// Given reports whether flag n (named without the prefix) was set on the command line.
func (s Set) Given(n string) bool {
	given := false
	s.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == s.prefix+n })
	return given
}

// RegisterPorts defines --fpm-port, written into *base, and --dp-size, written into *dp, with their
// current values as defaults. rankUse says what rank r does with port base+r: "publishes on" (seen
// from the bridge, which connects there) or "binds" (the publisher).
func (s Set) RegisterPorts(base, dp *int, rankUse string) {
	s.fs.IntVar(base, s.prefix+"fpm-port", *base, "base port: rank r "+rankUse+" port+r (Dynamo's DYN_FORWARDPASS_METRIC_PORT)")
	s.fs.IntVar(dp, s.prefix+"dp-size", *dp, "number of data-parallel ranks, one PUB socket each")
}

// CheckPorts checks that ranks 0..dp-1 on base..base+dp-1 fit in 1..65535, blaming what the user
// chose: --dp-size when given, else --fpm-port when given, else baseSource, where the base port's
// default came from (e.g. "DYN_FORWARDPASS_METRIC_PORT"; "" for the package default).
func (s Set) CheckPorts(base, dp int, baseSource string) error {
	portFlag, dpFlag := s.Name("fpm-port"), s.Name("dp-size")
	src, from := portFlag, "from "+portFlag
	if !s.Given("fpm-port") {
		src, from = "the default base port", "the default"
		if baseSource != "" {
			src, from = baseSource, "from "+baseSource
		}
	}
	switch {
	case dp < 1:
		return fmt.Errorf("%s %d: want at least 1", dpFlag, dp)
	case base < 1 || base > 65535:
		return fmt.Errorf("%s %d: want a port, 1 to 65535", src, base)
	case base+dp-1 > 65535 && s.Given("dp-size"):
		return fmt.Errorf("%s %d: the last rank's port %d exceeds 65535 (base port %d, %s)", dpFlag, dp, base+dp-1, base, from)
	case base+dp-1 > 65535:
		return fmt.Errorf("%s %d with %d ranks: the last rank's port %d exceeds 65535", src, base, dp, base+dp-1)
	}
	return nil
}
