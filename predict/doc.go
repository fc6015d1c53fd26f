// Package predict is fpmbus's whole-forward latency estimator: it predicts the wall time of one
// forward pass (one scheduler iteration) of an exact deployment identity from the cells sealed in the
// KV bucket FPM_DATASETS, and refuses, with a structured reason and never a number, whatever those
// cells do not cover.
//
// The package is pure: it reads the sealed values through schemas (schemas.SealedCell,
// schemas.Campaign) and does no I/O. A Snapshot holds the loaded bucket at one point of its history;
// it is immutable and safe for concurrent use. Whoever watches the bucket (predict/service, `fpmbus
// datasets predict`) feeds its entries to Snapshot.Apply, which loads each cell once per KV revision.
//
// # Invariants
//
//   - Only validated cells answer. A sealed value that does not decode, whose key is not its
//     identity's key, whose dataset digest is not the digest of its identity and rows, or that fails
//     any other rule of schemas.ValidateCell is corrupt: every query for it is refused (corrupt_cell).
//   - Exact coordinates return the measured row's latency unchanged (status measured).
//   - Between measured points the value is interpolated (status interpolated), with the grid points
//     used and their weights: nested linear interpolation (see surface.go), which on a full tensor
//     grid is exactly multilinear interpolation.
//   - Nothing is extrapolated: a coordinate outside the enclosing grid points is refused
//     (out_of_domain), naming the coordinate, the bound and the grid slice it belongs to.
//   - A mixed step is composed (status composed) from the two pure surfaces:
//     prefill(P) + max(0, decode(Bd, KVd) − decode(Bd, floor(Bd))), where floor(Bd) is the smallest
//     KV read the decode surface covers at Bd requests (composition.go). Both parts are named.
//   - There is no fallback: a refusal carries no latency, and no other model is ever consulted.
//   - Every answer carries its source (fpmbus cells in FPM_DATASETS), the cell's key, KV revision and
//     dataset digest, its status, and the query it answers.
package predict
