package merge

import (
	"flag"
	"log/slog"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/streams"
)

// EnvOutput names the default of --bench-output (the binary reads it).
const EnvOutput = "FPMBUS_BENCH_OUTPUT"

// Flags are the merger's command-line flags, defined once here next to Config: `fpmbus merge`
// registers them with prefix "", `fpmbus up` with flagprefix.Merge (the prefix rule of
// internal/flagprefix names them and adds the deprecated aliases). After parsing, Flags.Config makes
// a Config of them and Flags.Options the runner's options. The flags write into the Config they were
// registered on.
type Flags struct {
	cfg       *Config
	fs        *flag.FlagSet
	cf        *flagprefix.Component
	group     *durable.HoldingFlags
	partition string // deprecated I/N
}

// RegisterFlags defines the merger's flags on fs with c's values as defaults (a zero field shows the
// package default; the caller sets Output from EnvOutput when it is set). Streams, EventHook, Logger
// and Registerer have no flag.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := &Flags{cfg: c, fs: fs, cf: flagprefix.On(fs, prefix)}
	cf := f.cf
	if c.Output == "" {
		c.Output = DefaultOutputTemplate
	}
	if c.RankTimeout == 0 {
		c.RankTimeout = defaultRankTimeout
	}
	if c.InlineMax == 0 {
		c.InlineMax = benchstore.DefaultBenchInlineMax
	}
	if c.MaxArtefactSize == 0 {
		c.MaxArtefactSize = streams.DefaultBenchMaxArtefact
	}
	fs.StringVar(&c.Output, cf.Name("bench-output"), c.Output,
		"merged artefact path per run ("+RunIDPlaceholder+" = the run id); the sidecar is <stem>_worker_probe<ext> (env "+EnvOutput+")")
	fs.DurationVar(&c.RankTimeout, cf.Name("rank-timeout"), c.RankTimeout, "report a run incomplete when its ranks have not all arrived this long after the first")
	f.group = c.HoldingConfig.RegisterFlags(fs, cf, "merge", DefaultDurable, durable.HoldingRoles{Role: "merger", Keyed: " (keyed by run_id)", Held: "ranks"})
	fs.StringVar(&f.partition, cf.Name("merge-partition"), "", "deprecated: I/N sets "+cf.Flag("merge-partitions")+" N (I is ignored: the group assigns the runs)")
	fs.StringVar(&c.SpoolDir, cf.Name("spool-dir"), c.SpoolDir, "where rank bodies from the object store are staged while a run merges (default <tmp>/fpmbus-merge)")
	fs.IntVar(&c.InlineMax, cf.Name("inline-max"), c.InlineMax, "largest merged artefact or sidecar published inline; larger ones go to the object store")
	fs.Int64Var(&c.MaxArtefactSize, cf.Name("merge-max-artefact-size"), c.MaxArtefactSize,
		"largest rank artefact or probe replies body read, in bytes; a rank whose "+streams.HeaderBenchSize+" is larger rejects its run (rule artefact_size) unread")
	cf.Done()
	return f
}

// Options are the runner's options the flags give (--merge-member-id).
func (f *Flags) Options() []durable.Option { return f.group.Options() }

// Config returns the Config the parsed flags describe (Streams as registered: the caller sets them).
// An error wraps ErrInvalidConfig and names the flag (with its prefix) and the value at fault.
func (f *Flags) Config() (Config, error) {
	c := *f.cfg
	name := f.cf.Flag
	if f.partition != "" {
		i, n, ok := strings.Cut(f.partition, "/")
		pi, err1 := strconv.Atoi(i)
		pn, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || pn < 1 || pi < 0 || pi >= pn {
			return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %q: want I/N with 0 <= I < N", name("merge-partition"), f.partition)
		}
		if f.given(f.cf.Name("merge-partitions")) {
			slog.Warn(name("merge-partition") + " is deprecated and ignored: " + name("merge-partitions") + " is given")
		} else {
			slog.Warn(name("merge-partition")+" is deprecated: the instances of a group share the runs; using "+name("merge-partitions")+" N",
				"partitions", pn, "ignored_index", pi)
			c.Partitions = pn
		}
	}
	switch err := f.group.Check(c.HoldingConfig, ErrInvalidConfig); {
	case err != nil:
		return Config{}, err
	case c.RankTimeout <= 0:
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %v must be positive", name("rank-timeout"), c.RankTimeout)
	case !strings.Contains(c.Output, RunIDPlaceholder):
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %q must contain %s: the merger writes one artefact per run", name("bench-output"), c.Output, RunIDPlaceholder)
	case c.InlineMax < 1:
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %d must be positive", name("inline-max"), c.InlineMax)
	case c.MaxArtefactSize < 1:
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %d must be positive", name("merge-max-artefact-size"), c.MaxArtefactSize)
	}
	if err := checkOutputTemplate(c.Output); err != nil {
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s: %v", name("bench-output"), err)
	}
	return c, nil
}

// given reports whether flag name was set on the command line (directly or through a deprecated alias).
func (f *Flags) given(name string) bool {
	given := false
	f.fs.Visit(func(fl *flag.Flag) { given = given || fl.Name == name })
	return given
}
