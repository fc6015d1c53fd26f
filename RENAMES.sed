# cmd/fpmbus names whose code moved to a package (apply to cmd/fpmbus code of other branches).
# New import paths: github.com/fpmbus/fpmbus/internal/flaghelp (with Parse, ParseInterleaved), internal/progress, internal/buildinfo,
# predict/queries. New exported names in existing packages: natsconn.{Flags,RegisterFlags,
# RegisterCredentialFlags,ReadOnlyConnectTimeout,ConnectAndEnsure,ConnectHint,CredentialFlags,Watch,
# ErrConnClosed,CloseOnSIGUSR1}, natsserver.{Flags,RegisterFlags,Plan,RegisterStoreMetrics,Bindable,StoreTooSmall},
# benchstore.BenchPublication.Describe,
# invalid.{FlagError,Flagf}, flagprefix.Given, observe.{RegisterAddrFlag,NewProcessRegistry,Serve,
# Standalone,ComponentRegistry,NewComponentRegistry}, partition.StableMemberID,
# merge.{ReadArtefact,StatArtefact,ReadRank,RankError,ReadProbeReplies,OpenRankFiles,RankFiles,
# NewPublication,Result.WriteSummary}, streams.{ParseTimeBound,Config.RegisterFlags}, trace.{BackfillResult.WriteText,
# BackfillResume.Hint}, gaps.ParseSince, seal.{KeyArg,WriteRecord}, streams.PrintAndApply,
# producer.{OpenSentLog,SentLog,WriteStats}, replay.{LoopPlan,SourceFlags,RegisterSourceFlags,Recording.WriteInfo,
# Report.WriteJSONFile,WriteTraceInfo}.
s/\bwatchConn(/natsconn.Watch(/g
s/\bconnectConfigAndApply(/natsconn.ConnectAndEnsure(/g
s/\berrConnClosed\b/natsconn.ErrConnClosed/g
s/\bconnectHint(/natsconn.ConnectHint(/g
s/\bconnectCredentialFlags\b/natsconn.CredentialFlags/g
s/\bflagGiven(/flagprefix.Given(/g
s/\binFlagGroup(/flaghelp.InGroup(/g
s/\bflagGroup(/flaghelp.Group(/g
s/\bprintFlags(/flaghelp.Print(/g
s/\bunknownFlag(/flaghelp.Unknown(/g
s/\beditDistance(/flaghelp.EditDistance(/g
s/\bupServerFlags(/natsserver.RegisterFlags(/g
s/\bupServerOptions\b/natsserver.Flags/g
s/\bregisterStoreMetrics(/natsserver.RegisterStoreMetrics(/g
s/\bbindable(/natsserver.Bindable(/g
s/\bbyteSize(/progress.ByteSize(/g
s/\bnewProcessRegistry()/observe.NewProcessRegistry()/g
s/\bstandaloneStatus(/observe.Standalone(/g
s/&componentRegistry{reg: \([^}]*\)}/observe.NewComponentRegistry(\1)/g
s/\bcreg\.renew()/creg.Renew()/g
s/\bupMemberID(/partition.StableMemberID("up-", /g
s/\breadRank(/merge.ReadRank(/g
s/\breadArtefact(/merge.ReadArtefact(/g
s/\bstatArtefact(/merge.StatArtefact(/g
s/\brankError(/merge.RankError(/g
s/\bparseTime(/streams.ParseTimeBound(/g
s/\bparseSince(/gaps.ParseSince(/g
s/\bkeyArg(/seal.KeyArg(/g
s/\bdatasetsGet(/seal.WriteRecord(/g
s/\bbuildVersion()/buildinfo.Read()/g
s/\bapplyStreams(/streams.PrintAndApply(/g
s/\bopenSentLog(/producer.OpenSentLog(/g
s/\bprintPublishStats(/producer.WriteStats(/g
s/\breadQueries(/queries.Read(/g
s/\bregisterPredictQueryFlags(/queries.RegisterFlags(/g
s/\bprintAnswers(/queries.WriteTable(/g
s/\bpredictInput\b/queries.Input/g
# Not expressible as sed (rewrite by hand): printBackfill(res, cfg) -> res.WriteText(os.Stdout, cfg);
# resumeHint(r) -> r.Hint(); writeJSONFile(path, rep) -> rep.WriteJSONFile(path);
# progressMeter.update/finish -> Update/Finish; connOptions now wraps *natsconn.Flags (fields moved).
