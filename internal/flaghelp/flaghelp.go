// Package flaghelp is how a command presents its flags to a person: -h lists them in groups, one per
// component or concern, in the order the command registered them (Group marks where a group starts),
// with the deprecated aliases of `fpmbus up` left out of the list (they are still accepted, and warn
// once when used); a flag that does not exist is answered with the nearest one that does, not with the
// whole list (Unknown). Parse and ParseInterleaved read a command line that way: only -h prints the
// usage, a bad flag is one invalid.FlagError. It owns the groups of every FlagSet; the flags
// themselves are their components'.
package flaghelp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/invalid"
)

// groupMark is where a group of a FlagSet's flags starts: the flags defined after it, up to the next
// mark, are the group's.
type groupMark struct {
	title   string
	defined map[string]bool // the flags defined before the mark
}

// groups holds each FlagSet's marks, in registration order.
var groups = map[*flag.FlagSet][]groupMark{}

// Group starts a group titled title on fs: the flags registered from now on (until the next mark)
// are listed under it. Marking a title again continues that group.
func Group(fs *flag.FlagSet, title string) {
	defined := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { defined[f.Name] = true })
	groups[fs] = append(groups[fs], groupMark{title: title, defined: defined})
}

// InGroup registers, through register, flags that belong to group title (the connection flags, the
// stream flags) and then goes on with the group that was current before.
func InGroup(fs *flag.FlagSet, title string, register func()) {
	prev := "flags"
	if ms := groups[fs]; len(ms) > 0 {
		prev = ms[len(ms)-1].title
	}
	Group(fs, title)
	register()
	Group(fs, prev)
}

// IsDeprecatedAlias reports whether f is a deprecated name: an old name kept for `fpmbus up`
// (internal/flagprefix), or a flag whose usage says it is deprecated.
func IsDeprecatedAlias(f *flag.Flag) bool {
	_, ok := f.Value.(*flagprefix.Alias)
	return ok || strings.HasPrefix(f.Usage, "deprecated")
}

// Print writes fs's flags to w, grouped (Group) and without deprecated aliases, each as the
// flag package prints one.
func Print(w io.Writer, fs *flag.FlagSet) {
	marks := groups[fs]
	groupOf := map[string]string{}
	var titles []string
	fs.VisitAll(func(f *flag.Flag) {
		title := "flags"
		for _, m := range marks { // the last mark before the flag was defined
			if m.defined[f.Name] {
				break
			}
			title = m.title
		}
		groupOf[f.Name] = title
		if !slices.Contains(titles, title) {
			titles = append(titles, title)
		}
	})
	// Groups in the order of their first mark; the command's own flags ("flags", registered before any
	// mark or marked so) first.
	order := func(t string) int {
		for i, m := range marks {
			if m.title == t && t != "flags" {
				return i + 1
			}
		}
		return 0
	}
	slices.SortStableFunc(titles, func(a, b string) int { return order(a) - order(b) })
	aliases := 0
	for i, t := range titles {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s:\n", t)
		// The group's flags on a FlagSet of their own, printed by the flag package itself.
		group := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		group.SetOutput(w)
		fs.VisitAll(func(f *flag.Flag) {
			if groupOf[f.Name] != t {
				return
			}
			if IsDeprecatedAlias(f) {
				aliases++
				return
			}
			group.Var(f.Value, f.Name, f.Usage)
			group.Lookup(f.Name).DefValue = f.DefValue
		})
		group.PrintDefaults()
	}
	if aliases > 0 {
		fmt.Fprintf(w, "\n%d deprecated flag names are still accepted (each warns once and names its replacement).\n", aliases)
	}
}

// unknownFlag answers a flag that fs does not define: the error names it and, when one is close, the
// flag meant; the whole list is left to -h.
func unknownFlag(fs *flag.FlagSet, err error) error {
	const prefix = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	given := strings.TrimPrefix(msg[len(prefix):], "-")
	text := fmt.Sprintf("unknown flag --%s", given)
	if s := suggestFlag(fs, given); s != "" {
		text += fmt.Sprintf("; did you mean --%s?", s)
	}
	return errors.New(text + " (`" + fs.Name() + " -h` lists the flags)")
}

// suggestFlag returns the flag of fs nearest to given (edit distance, at most a third of its length
// and at least 2; or one whose name contains given or is contained in it), "" when none is close.
func suggestFlag(fs *flag.FlagSet, given string) string {
	best, bestD := "", 0
	fs.VisitAll(func(f *flag.Flag) {
		if IsDeprecatedAlias(f) {
			return
		}
		d := EditDistance(given, f.Name)
		if len(given) >= 4 && (strings.Contains(f.Name, given) || strings.Contains(given, f.Name)) {
			d = min(d, 1)
		}
		if best == "" || d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" || bestD > max(2, len(given)/3) {
		return ""
	}
	return best
}

// EditDistance is the Levenshtein distance between a and b, in bytes.
func EditDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// parseQuiet parses args into fs. The flag package prints an error and the whole usage on a bad flag;
// here only -h prints the usage (and flag.ErrHelp comes back), and a bad flag comes back as an
// invalid.FlagError (naming the nearest flag for an unknown one) for the command to print once.
func parseQuiet(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	}
	return invalid.Flagf("%v", unknownFlag(fs, err))
}

// Parse parses args, which must leave no positional argument, as parseQuiet does.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := parseQuiet(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return invalid.Flagf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// ParseInterleaved parses args where flags and positional arguments may come in any order (the
// standard flag package stops at the first positional one) and returns the positional ones.
func ParseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var paths []string
	for {
		if err := parseQuiet(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return paths, nil
		}
		if rest[0] == "--" { // everything after is positional
			return append(paths, rest[1:]...), nil
		}
		paths = append(paths, rest[0])
		args = rest[1:]
	}
}
