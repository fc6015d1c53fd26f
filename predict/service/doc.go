// Package service serves the whole-forward estimator (package predict) on NATS, as a micro service
// (github.com/nats-io/nats.go/micro): `nats micro ls` and `nats micro info fpm-predict` discover it,
// `nats req fpmpredict.predict '{…}'` asks it, `nats micro stats fpm-predict` shows each endpoint's
// requests, errors, processing time and answers by status and refusal reason.
//
// # Subjects
//
//	fpmpredict.predict   one query (JSON object) -> one answer; a JSON array of queries -> an array of answers
//	fpmpredict.cells     anything -> {"revision", "cells"}: every loaded cell, valid or corrupt
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
// (Catalog): it answers once it has loaded every cell, then applies each seal, deletion or campaign
// update as it is stored, so a new seal is served without a restart. Loaded cells are cached by KV
// revision (predict.Snapshot.Apply): a re-watch re-parses nothing that did not change.
package service
