package seal

import (
	"flag"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/streams"
)

// Flags are the sealer consumer's command-line flags, defined once here next to Config: `fpmbus seal`
// registers them with prefix "", `fpmbus up` with flagprefix.Seal (the prefix rule of
// internal/flagprefix names them and adds the deprecated aliases). After parsing, Flags.Config makes a
// Config of them and Flags.Options the runner's options. The flags write into the Config they were
// registered on.
type Flags struct {
	cfg   *Config
	cf    *flagprefix.Component
	group *durable.HoldingFlags
}

// RegisterFlags defines the sealer's flags on fs with c's values as defaults (a zero field shows the
// package default). Streams, Sealer, OutcomeHook, Logger and Registerer have no flag.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) *Flags {
	f := &Flags{cfg: c, cf: flagprefix.On(fs, prefix)}
	cf := f.cf
	if c.ProfileWait == 0 {
		c.ProfileWait = defaultProfileWait
	}
	if c.MaxArtefactSize == 0 {
		c.MaxArtefactSize = streams.DefaultBenchMaxArtefact
	}
	fs.BoolVar(&c.AllowPartial, cf.Name("allow-partial"), c.AllowPartial, "seal the valid cells of a run even when some of its cells are rejected (the campaign stays partial)")
	f.group = c.HoldingConfig.RegisterFlags(fs, cf, "seal", DefaultDurable, durable.HoldingRoles{Role: "sealer", Held: "artefacts"})
	fs.DurationVar(&c.ProfileWait, cf.Name("profile-wait"), c.ProfileWait, "how long a merged artefact waits for its run's collection profile (fpmbench.profile.<run>) before it is refused")
	fs.Int64Var(&c.MaxArtefactSize, cf.Name("seal-max-artefact-size"), c.MaxArtefactSize,
		"largest merged artefact read, in bytes; one whose "+streams.HeaderBenchSize+" is larger is dead-lettered unread")
	cf.Done()
	return f
}

// Options are the runner's options the flags give (--seal-member-id).
func (f *Flags) Options() []durable.Option { return f.group.Options() }

// Config returns the Config the parsed flags describe, with the streams scfg. An error wraps
// ErrInvalidConfig and names the flag (with its prefix) and the value at fault.
func (f *Flags) Config(scfg streams.Config) (Config, error) {
	c := *f.cfg
	if err := f.group.Check(c.HoldingConfig, ErrInvalidConfig); err != nil {
		return Config{}, err
	}
	if c.MaxArtefactSize < 1 {
		return Config{}, flagprefix.Invalid(ErrInvalidConfig, "%s %d must be positive", f.cf.Flag("seal-max-artefact-size"), c.MaxArtefactSize)
	}
	c.Streams = scfg
	return c, nil
}
