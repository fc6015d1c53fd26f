// Package benchstore carries benchmark artefacts over JetStream: it publishes a body on FPM_BENCH
// inline, or, above the inline limit, in the object store bucket FPM_BENCH_OBJECTS with a manifest
// message naming it, and it fetches either kind back verified against its sha256. `fpmbus bench
// publish`, the merger and the sealer use it; the subjects, headers, message ids, the run id and
// artefact size limits and the bucket's name are streams/'s contract, which this package imports.
//
//	objectstore.go BenchStore: PublishRank, PublishProbe, PublishMerged, PublishSidecar, Fetch, FetchTo
//	publish.go     PublishBench: one `fpmbus bench publish` in the order the consumers rely on (profile,
//	               probe replies, ranks); PublishProfile
//
// Invariants: an object's name is content-addressed (<kind>/<run>/<rank>/<sha256>), so a conflicting
// re-publication never overwrites the object the first publication names; a body is never used before
// its sha256 matched (ErrDigestMismatch); a file is read within the artefact size limit and a rank
// file that changed since it was validated is refused.
package benchstore
