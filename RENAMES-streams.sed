# Renames of the wire-contract split: streams/ keeps the contract; the NATS client plumbing, the embedded
# server, the bench object-store transport and the edge topology moved out. Apply with
#   sed -i -f RENAMES.sed $(git ls-files '*.go' '*.md')
# then fix imports (gofmt; add the new import paths below where a file now names the package, drop
# "github.com/fpmbus/fpmbus/streams" where it no longer does).
#
# New import paths:
#   github.com/fpmbus/fpmbus/internal/natsconn                   (package natsconn)
#   github.com/fpmbus/fpmbus/internal/natsserver                 (package natsserver)
#   github.com/fpmbus/fpmbus/internal/natsserver/natsservertest  (package natsservertest, was streams/streamstest)
#   github.com/fpmbus/fpmbus/internal/benchstore                 (package benchstore)
#   github.com/fpmbus/fpmbus/internal/edgenode                   (package edgenode)
#   github.com/fpmbus/fpmbus/internal/retrywait                  (package retrywait, new: retrywait.Doubling)
#
# Not a rename: natsconn.ConnConfig.InProcess is a *natsserver.Server (was *streams.Server), and the
# server hands nats.go its in-process connections itself (natsserver.Server.InProcessConn).
# Tests that read ../ops/nats/ from streams/ read ../../ops/nats/ from internal/natsserver and internal/edgenode.
s/\bstreams\.DefaultConnectTimeout\b/natsconn.DefaultConnectTimeout/g
s/\bstreams\.ErrAuth\b/natsconn.ErrAuth/g
s/\bstreams\.ErrTLS\b/natsconn.ErrTLS/g
s/\bstreams\.ErrUnreachable\b/natsconn.ErrUnreachable/g
s/\bstreams\.ErrInvalidConnConfig\b/natsconn.ErrInvalidConnConfig/g
s/\bstreams\.ConnConfig\b/natsconn.ConnConfig/g
s/\bstreams\.ConnConfigError\b/natsconn.ConnConfigError/g
s/\bstreams\.ConnectError\b/natsconn.ConnectError/g
s/\bstreams\.Connect\b/natsconn.Connect/g
s/\bstreams\.ConnectContext\b/natsconn.ConnectContext/g
s/\bstreams\.OnClosed\b/natsconn.OnClosed/g
s/\bstreams\.LastMsgFromLeader\b/natsconn.LastMsgFromLeader/g
s/\bstreams\.NextMsgFromLeader\b/natsconn.NextMsgFromLeader/g
s/\bstreams\.NextMsgFromLeaderAt\b/natsconn.NextMsgFromLeaderAt/g
s/\bstreams\.ErrNATSContext\b/natsconn.ErrNATSContext/g
s/\bstreams\.NATSContext\b/natsconn.NATSContext/g
s/\bstreams\.NATSContextPath\b/natsconn.NATSContextPath/g
s/\bstreams\.LoadNATSContext\b/natsconn.LoadNATSContext/g
s/\bstreams\.Redacted\b/natsconn.Redacted/g
s/\bstreams\.RedactURL\b/natsconn.RedactURL/g
s/\bstreams\.ErrRefused\b/natsconn.ErrRefused/g
s/\bstreams\.RefusalContext\b/natsconn.RefusalContext/g
s/\bstreams\.ErrCodeJetStreamUnavailable\b/natsconn.ErrCodeJetStreamUnavailable/g
s/\bstreams\.ErrCodeInsufficientResources\b/natsconn.ErrCodeInsufficientResources/g
s/\bstreams\.Unavailable\b/natsconn.Unavailable/g
s/\bstreams\.ErrListen\b/natsserver.ErrListen/g
s/\bstreams\.ListenError\b/natsserver.ListenError/g
s/\bstreams\.CheckListen\b/natsserver.CheckListen/g
s/\bstreams\.PortHolder\b/natsserver.PortHolder/g
s/\bstreams\.DefaultListen\b/natsserver.DefaultListen/g
s/\bstreams\.DefaultMaxPayload\b/natsserver.DefaultMaxPayload/g
s/\bstreams\.DefaultPingInterval\b/natsserver.DefaultPingInterval/g
s/\bstreams\.DefaultMaxPingsOut\b/natsserver.DefaultMaxPingsOut/g
s/\bstreams\.ErrServerNotReady\b/natsserver.ErrServerNotReady/g
s/\bstreams\.ServerConfig\b/natsserver.ServerConfig/g
s/\bstreams\.Server\b/natsserver.Server/g
s/\bstreams\.LoadServerConfig\b/natsserver.LoadServerConfig/g
s/\bstreams\.Authenticates\b/natsserver.Authenticates/g
s/\bstreams\.ListensOnLoopback\b/natsserver.ListensOnLoopback/g
s/\bstreams\.IsLoopbackHost\b/natsserver.IsLoopbackHost/g
s/\bstreams\.StartServer\b/natsserver.StartServer/g
s/\bstreams\.StoreState\b/natsserver.StoreState/g
s/\bstreams\.StoreOK\b/natsserver.StoreOK/g
s/\bstreams\.StoreDiskFull\b/natsserver.StoreDiskFull/g
s/\bstreams\.StoreWriteError\b/natsserver.StoreWriteError/g
s/\bstreams\.StoreLost\b/natsserver.StoreLost/g
s/\bstreams\.StoreLowFree\b/natsserver.StoreLowFree/g
s/\bstreams\.ErrStoreLost\b/natsserver.ErrStoreLost/g
s/\bstreams\.StoreStatus\b/natsserver.StoreStatus/g
s/\bstreams\.StoreWatchConfig\b/natsserver.StoreWatchConfig/g
s/\bstreams\.SyncPolicy\b/natsserver.SyncPolicy/g
s/\bstreams\.ServerDefaultSyncInterval\b/natsserver.ServerDefaultSyncInterval/g
s/\bstreams\.SyncAlways\b/natsserver.SyncAlways/g
s/\bstreams\.DefaultSync\b/natsserver.DefaultSync/g
s/\bstreams\.ErrBadSync\b/natsserver.ErrBadSync/g
s/\bstreams\.ParseSyncPolicy\b/natsserver.ParseSyncPolicy/g
s/\bstreams\.DefaultCentralDomain\b/edgenode.DefaultCentralDomain/g
s/\bstreams\.EdgeDomainPrefix\b/edgenode.EdgeDomainPrefix/g
s/\bstreams\.DefaultEdgeListen\b/edgenode.DefaultEdgeListen/g
s/\bstreams\.EdgeSourcedStreams\b/edgenode.EdgeSourcedStreams/g
s/\bstreams\.EdgeDeniedSubjects\b/edgenode.EdgeDeniedSubjects/g
s/\bstreams\.ErrBadEdge\b/edgenode.ErrBadEdge/g
s/\bstreams\.EdgeConfig\b/edgenode.EdgeConfig/g
s/\bstreams\.EdgeSourceConsumer\b/edgenode.EdgeSourceConsumer/g
s/\bstreams\.EdgeDeliverRoot\b/edgenode.EdgeDeliverRoot/g
s/\bstreams\.EdgeDeliverSubject\b/edgenode.EdgeDeliverSubject/g
s/\bstreams\.EdgeSourceConsumerConfig\b/edgenode.EdgeSourceConsumerConfig/g
s/\bstreams\.EnsureEdgeSourceConsumers\b/edgenode.EnsureEdgeSourceConsumers/g
s/\bstreams\.EdgeSource\b/edgenode.EdgeSource/g
s/\bstreams\.EdgeSourcing\b/edgenode.EdgeSourcing/g
s/\bstreams\.AddEdgeSources\b/edgenode.AddEdgeSources/g
s/\bstreams\.DefaultBenchInlineMax\b/benchstore.DefaultBenchInlineMax/g
s/\bstreams\.ErrDigestMismatch\b/benchstore.ErrDigestMismatch/g
s/\bstreams\.BenchStore\b/benchstore.BenchStore/g
s/\bstreams\.NewBenchStore\b/benchstore.NewBenchStore/g
s/\bstreams\.BenchRankArtefact\b/benchstore.BenchRankArtefact/g
s/\bstreams\.BenchMerged\b/benchstore.BenchMerged/g
s/\bstreams\.PublishProfile\b/benchstore.PublishProfile/g
s/\bstreams\.BenchRank\b/benchstore.BenchRank/g
s/\bstreams\.BenchProbe\b/benchstore.BenchProbe/g
s/\bstreams\.BenchPublication\b/benchstore.BenchPublication/g
s/\bstreams\.BenchPublished\b/benchstore.BenchPublished/g
s/\bstreamstest\.Cluster\b/natsservertest.Cluster/g
s/\bstreamstest\.StartCluster\b/natsservertest.StartCluster/g
s/\bstreamstest\.StartClusterWith\b/natsservertest.StartClusterWith/g
s/\bstreamstest\.OnNode\b/natsservertest.OnNode/g
s/\bstreamstest\.FreePorts\b/natsservertest.FreePorts/g
s/\bstreamstest\.FreePort\b/natsservertest.FreePort/g
s/\bstreamstest\.Env\b/natsservertest.Env/g
s/\bstreamstest\.Start\b/natsservertest.Start/g
s/\bstreamstest\.StartAt\b/natsservertest.StartAt/g
s/\bstreamstest\.StartShards\b/natsservertest.StartShards/g
s/\bstreamstest\.Messages\b/natsservertest.Messages/g
s/\bstreamstest\.PKI\b/natsservertest.PKI/g
s/\bstreamstest\.NewPKI\b/natsservertest.NewPKI/g
s/\bstreamstest\.WaitSourceSetups\b/natsservertest.WaitSourceSetups/g
s#"github.com/fpmbus/fpmbus/streams/streamstest"#"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"#g
s#\bstreams/streamstest\b#internal/natsserver/natsservertest#g
