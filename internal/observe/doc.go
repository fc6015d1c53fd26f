// Package observe serves what one fpmbus process knows about itself, on the address of its
// --metrics-addr: /metrics (Prometheus), /healthz (the health report), /status.json (the status, a
// documented JSON document) and / (the status page, HTML). Every long-running command serves the same
// four endpoints through one Server; what differs is what the process measures.
//
// The status is built from what the process already has, never from a second bookkeeping:
//
//   - its Prometheus registry (Options.Gatherer): the bridge's, the consumers', the merger's, the
//     sealer's, the predict service's and the store's collectors, whichever are registered. A
//     sampler gathers it every SampleInterval, and every request that reads it gathers it when the
//     last gathering is a second old; Window of samples are kept, from which rates, latency
//     quantiles and the limit checks below are computed;
//   - its health (Options.Components): `fpmbus up`'s run group, or a standalone command's process;
//   - JetStream's own view of the durable consumers and the streams' policy (Options.JetStream), read
//     at most every few seconds;
//   - the gap detector's per-publisher state (Options.Publishers), read only while someone looks.
//
// Health is honest: a component that is ready but behind one of its limits is reported degraded with
// the reason (the bridge dropping FPMs for a full buffer or losing dead letters, a consumer whose stream
// removed messages before it read them, or one holding as many unacknowledged messages as its
// max_ack_pending allows), besides what the component reports itself. It is reported in /healthz, in
// the status, and in /metrics as fpmbus_component_*, under the same names for `up`'s run group and a
// standalone command's one component.
//
// Ownership: the sampler goroutine owns the sample history; handlers read it under a mutex. Nothing the
// handlers do blocks the component they observe: sources are read with timeouts and cached.
//
// A command serves it with Serve (the --metrics-addr flag: RegisterAddrFlag); a standalone command's
// one component reports its health through Standalone, and each incarnation of a restarted component
// registers its metrics through a ComponentRegistry, which drops the previous incarnation's.
//
// The page needs nothing from outside the binary (it must work on an air-gapped node): its style and
// script are embedded, and it is rendered on the server, so it is useful with scripts disabled; the
// script polls /status.json with the page's own query (filter, sort, state, page) and re-renders it.
package observe
