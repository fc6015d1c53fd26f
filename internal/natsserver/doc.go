// Package natsserver is the embedded JetStream server of `fpmbus up` and of an edge node: a
// nats-server configuration file, a token, TLS, the fsync policy, the listen addresses checked before
// anything starts, in-process client connections, and the store watch that handles a full or lost disk
// under it. Tests start it, alone or as a three-node cluster, through natsservertest.
//
//	server.go     ServerConfig, StartServer, Server; LoadServerConfig, Authenticates, ListensOnLoopback
//	inprocess.go  Server.InProcessConn: in-process connections whose writes never block the writer
//	flags.go      Flags and Plan: the embedded server's flags (--server-config, --auth-token-file, TLS,
//	              --insecure) checked into the server to run, never beyond loopback unauthenticated
//	listen.go     CheckListen: an address the server cannot bind is refused before it starts (ErrListen);
//	              Bindable: the system's reason an address cannot be bound, and who holds it
//	sync.go       SyncPolicy: when the server fsyncs what it stores (DefaultSync: always)
//	storewatch.go WatchStore and StoreStatus: whether the store takes writes; JetStream restarted after
//	              a full disk has room again, shut down when its directory is deleted (ErrStoreLost)
//	storemetrics.go RegisterStoreMetrics: the store's state as the fpmbus_store_* metrics
//	storetoosmall.go StoreTooSmall: a stream refused for lack of disk, named with the disk and its space
//
// Invariants: the JetStream store is always ServerConfig.StoreDir and the client address is Listen
// when set, whatever a configuration file says; a server without authentication is never started
// beyond loopback by fpmbus (Authenticates, ListensOnLoopback let `fpmbus up` refuse it first); the
// store watch never restarts a healthy JetStream nor one whose directory is lost. The package knows no
// subject or stream: what the server stores is streams/'s contract, and clients connect through
// internal/natsconn.
package natsserver
