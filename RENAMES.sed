# One stage shape: every consumer stage is New(cfg, js, opts ...durable.Option).
# Order matters: seal's Sealer constructor moves out of the way before NewConsumer takes its name.
s/\bseal\.New(/seal.NewSealer(/g
s/\bseal\.NewConsumer\b/seal.New/g
s/\bseal\.ConsumerConfig\b/seal.Config/g
s/\bseal\.ErrInvalidConsumerConfig\b/seal.ErrInvalidConfig/g
s/\bseal\.ConsumerOption\b/durable.Option/g
s/\bmerge\.Option\b/durable.Option/g
s/\bgaps\.Option\b/durable.Option/g
s/\btrace\.Option\b/durable.Option/g
s/\b\(seal\|merge\|gaps\|trace\)\.WithMemberID\b/durable.WithMemberID/g
s/\b\(seal\|merge\|gaps\|trace\)\.WithClock\b/durable.WithClock/g
# Not expressible as sed (option -> Config field; edit by hand):
#   trace.WithLogger(l)            -> trace.Config.Logger = l   (also VerifyConfig.Logger for trace.Verify)
#   trace.WithCompressionLevel(n)  -> trace.Config.CompressionLevel = n (VerifyConfig.CompressionLevel)
#   trace.WithWriteRetry(a, b)     -> trace.Config.RetryInitial, RetryMax = a, b
#   trace.WithProcessSegments(ps)  -> trace.Config.Segments = ps
#   gaps.WithLogger(l)             -> gaps.Config.Logger = l
#   merge.WithLogger(l)            -> merge.Config.Logger = l
#   merge.WithRegisterer(r)        -> merge.Config.Registerer = r
#   merge.WithEventHook(fn)        -> merge.Config.EventHook = fn
#   seal.WithLogger(l)             -> seal.Config.Logger = l
#   seal.WithRegisterer(r)         -> seal.Config.Registerer = r
#   seal.WithSealer(s)             -> seal.Config.Sealer = s
#   seal.WithOutcomeHook(fn)       -> seal.Config.OutcomeHook = fn
#   durable.WithLogger(l)          -> durable.Config.Logger = l
#   durable.WithRegisterer(r)      -> durable.Config.Registerer = r
# Removed: durable.Stage, durable.NewStage, durable.NewStageRunner, durable.Inherit, durable.DeleteGroup;
#   a stage holds its *durable.Runner and shows Ready/Owned/Run itself.
# Changed shape: durable.GroupConfig and durable.Filter are durable's own structs (same field names),
#   no longer aliases of partition.Config / partition.Filter; durable.FPMGroup defaults to Partitions 0
#   (one per FPM shard, resolved by durable.New), durable.BenchGroup to 1.
#   durable.ApplyOptions(sentinel, opts) (Settings, error); durable.CheckStage(check, js, sentinel, opts) (Settings, error).
# Flags next to their configs (cmd/fpmbus, package main): the prefix rule moved to internal/flagprefix.
s/\bprefixedName(/flagprefix.Name(/g
s/\([^.A-Za-z_]\)flagName(/\1flagprefix.Flag(/g
s/\bdeprecateUnprefixed(/flagprefix.DeprecateUnprefixed(/g
s/\bnewComponentFlags(/flagprefix.On(/g
s/\*componentFlags\b/*flagprefix.Component/g
s/\bcf\.name(/cf.Name(/g
s/\bcf\.done()/cf.Done()/g
s/\baliasFlag\b/flagprefix.Alias/g
s/\btracePrefix\b/flagprefix.Trace/g
s/\bgapsPrefix\b/flagprefix.Gaps/g
s/\bmergePrefix\b/flagprefix.Merge/g
s/\bsealPrefix\b/flagprefix.Seal/g
# cmd/fpmbus: traceOutputFlags(fs, p) now returns only *traceOptions (call .flags.Done() after adding flags);
#   traceGroupFlags/traceGroupOptions are gone (trace.Flags.RegisterGroupFlags, .Options());
#   memberOptions is gone (merge/seal/trace Flags.Options()); the consumers' flags are
#   gaps/merge/seal/trace Config.RegisterFlags + Flags.Config; durable.HoldingConfig.RegisterFlags for
#   the holding stages' group flags; usageError(err, pkg.ErrInvalidConfig) maps a refused flag value to errUsage.
# New import paths: github.com/fpmbus/fpmbus/internal/flagprefix
# cmd/fpmbus trace replay: the dry-run printing moved to the replay package.
s/\bwritePlan(/replay.WritePlan(/g
s/\bwriteDamage(\([^,]*\), \([^)]*\))/\2.WriteDamage(\1)/g
# cmd/fpmbus datasets: the printing of the sealer's reports moved to the seal package.
s/\bprintReport(\([^,]*\), \([^)]*\))/_ = \2.WriteText(\1)/g
s/\bdatasetsHistory(/seal.WriteHistory(/g
s/\([^.A-Za-z_]\)short(/\1seal.ShortDigest(/g
