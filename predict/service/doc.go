// Package service serves the whole-forward estimator (package predict) on NATS, as a micro service
// (github.com/nats-io/nats.go/micro): `nats micro ls` and `nats micro info fpm-predict` discover it,
// `nats req fpmpredict.predict '{…}'` asks it, `nats micro stats fpm-predict` shows each endpoint's
// requests, errors, processing time and answers by status and refusal reason.
//
// # Subjects
//
//	fpmpredict.predict   one query (JSON object) -> one answer; a JSON array of queries -> an array of answers
//	fpmpredict.cells     empty or {"after": KEY} -> {"revision", "cells", "next"}: the loaded cells, valid
//	                     or corrupt, in key order, as many as one reply holds
//
// Files: service.go (Service, Config, Run, the endpoints' answers), pool.go (admission: the size check
// and the bounded queue of the worker pool), reply.go (replies that fit the max payload, error
// replies), stats.go (the endpoint data of `nats micro stats`), catalog.go (the watched bucket).
//
// # Limits
//
//   - Every request gets one reply, and it fits the connection's max payload: an answer (or array of
//     answers) that would not is replaced by a 413 error naming how to split the request; every error
//     text is bounded (predict.Bounded), whatever the input it quotes.
//   - A request over Config.MaxRequestBytes is refused before it is parsed or queued.
//   - Requests are answered by Config.Workers goroutines from a queue of Config.QueueSize; a request
//     finding the queue full is told at once that the service is busy (503). Nothing grows with the
//     number of requests: not goroutines, not memory (at most QueueSize requests wait).
//
// The service's subjects are under their own root, fpmpredict.>, outside every stream's subjects. A
// request on a subject a stream captures is stored by JetStream like any publish: under fpm.> the
// FPM stream would keep each request for its max age, the trace writer and the gap detector would read
// it as a (malformed) forward-pass metric and dead-letter it, and the requester would race the
// stream's publish acknowledgement ({"stream":"FPM","seq":…}) against the prediction for the first
// reply. A root of its own keeps requests core NATS request-reply, stored nowhere; the tests check it
// against every stream fpmbus defines.
//
// # Scale-out and freshness
//
// Every instance subscribes in one queue group (default "fpm-predict"): NATS hands each request to one
// member, so instances are added or removed without coordination. Each instance watches FPM_DATASETS
// (catalog): it answers once it has loaded every cell, then applies each seal, deletion or campaign
// update as it is stored, so a new seal is served without a restart. Loaded cells are cached by KV
// revision (predict.Snapshot.Apply): a re-watch re-parses nothing that did not change.
package service
