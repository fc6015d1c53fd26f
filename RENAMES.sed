# `fpmbus up`'s composition moved from cmd/fpmbus (package main) to internal/upstack.
# New import path: github.com/fpmbus/fpmbus/internal/upstack
# These names were unexported in package main; inside cmd/fpmbus they become:
s/\*upRun\b/*upstack.Run/g
s/&upRun{/\&upstack.Run{/g
s/\bupStages\b/upstack.Stages/g
s/\bupStage\b/upstack.Stage/g
s/\bupOrderTable()/upstack.OrderTable()/g
s/\bupDemoTrace\b/upstack.DemoTrace/g
s/\bupServer\b/upstack.Server/g
s/\bupCredentialFlags\b/upstack.CredentialFlags/g
s/\bownDataDir(/upstack.OwnDataDir(/g
# methods of the run (receiver r *upstack.Run)
s/\br\.components()/r.Components()/g
s/\br\.statusOptions(/r.StatusOptions(/g
s/\br\.link()/r.Link()/g
s/\br\.checkPorts(/r.CheckPorts(/g
s/\br\.checkSockets()/r.CheckSockets()/g
# fields of the run (receiver r *upstack.Run); sealOpts is now the []durable.Option itself (SealOptions)
s/\br\.server\.server\b/r.Server.Config/g
s/\br\.server\.conn\b/r.Server.Conn/g
s/\br\.server\.auth\b/r.Server.Auth/g
s/\br\.server\.from\b/r.Server.From/g
s/\br\.server\.writeToken()/writeUpToken(r.Server)/g
s/\br\.memberID\b/r.MemberID/g
s/\br\.storeDir\b/r.StoreDir/g
s/\br\.scfg\b/r.Streams/g
s/\br\.reg\b/r.Registry/g
s/\br\.policy\b/r.Policy/g
s/\br\.traceDisabled\b/r.TraceDisabled/g
s/\br\.mergeOpts\b/r.MergeOptions/g
s/\br\.sealOpts\b/r.SealOptions/g
s/\br\.demoTrace\b/r.DemoTrace/g
s/\br\.abort\b/r.Abort/g
# (r.listen, r.server, r.trace, r.gaps, r.merge, r.seal, r.predict, r.bridge, r.demo: the same names capitalised; apply only where r is the up run)
# the bridge's endpoint list for its ready log line
s/\bendpointURLs(\([a-z]*\))/\1.EndpointURLs()/g
# runUp's checks before anything starts (data directory lock, descriptors, addresses) are now one call
# that returns the lock's release: release, err := r.Prepare(dataDir, metricsAddr); defer release()
