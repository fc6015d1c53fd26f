// Package streams declares fpmbus's JetStream resources as code: the subject scheme, the Fpm-* header
// names, the stream definitions (FPM, FPM_EVENTS, FPM_BENCH) and the embedded server used by
// `fpmbus up`. Every component calls Ensure at start, so streams exist before anything publishes or
// consumes: Ensure creates a missing stream from the component's flags and uses an existing one as it
// is (warning about each setting that differs). Stream settings belong to the operator: only Plan
// (`fpmbus streams apply`) changes an existing stream, and it refuses a change that can delete stored
// messages unless forced.
//
// Subjects (every <token> is percent-encoded with EncodeToken):
//
//	fpm.<namespace>.<component>.<worker_id>.<dp_rank>                  stream FPM: one FPM, canonical JSON
//	fpmevents.deadletter.<namespace>.<component>.<dp_rank>              stream FPM_EVENTS: undecodable/invalid input
//	fpmevents.drop.<namespace>.<component>.<worker_id>.<dp_rank>        stream FPM_EVENTS: bridge drop markers
//	fpmevents.gap.<namespace>.<component>.<worker_id>.<dp_rank>         stream FPM_EVENTS: gap events
//	fpmbench.>                                                          stream FPM_BENCH: benchmark artefacts
//
// The FPM and event roots differ ("fpm" vs "fpmevents") so that `nats sub 'fpm.>'` shows FPMs only.
package streams
