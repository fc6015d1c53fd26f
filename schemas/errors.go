package schemas

import (
	"errors"
	"strconv"
)

// Sentinel errors. Every error returned by this package wraps exactly one of them; match with errors.Is,
// and use errors.As with *decodeError, *validationError or *traceLineError to learn the field.
var (
	// errMalformed: the bytes are not a well-formed document of the expected format (msgpack for
	// DecodeFPM, JSON for ParseFPMJSON and ParseTraceLine): truncated, trailing bytes, reserved marker,
	// invalid UTF-8, too deep, a non-string map key, a duplicate key, or a top-level value that is not a
	// map. Returned as a *decodeError.
	errMalformed = errors.New("schemas: malformed msgpack")
	// ErrInvalid: the document is well-formed but breaks the FPM rules of Dynamo's trace validator
	// (lib/llm/src/fpm_trace/sink.rs). Returned as a *validationError.
	ErrInvalid = errors.New("schemas: invalid FPM")
	// ErrInvalidTraceLine: a dynamo.fpm.trace.v1 line is not acceptable. Returned as a *traceLineError,
	// which also wraps the *decodeError or *validationError behind it, if any.
	ErrInvalidTraceLine = errors.New("schemas: invalid trace line")
)

// Format names used in decodeError.Format.
const (
	formatMsgpack = "msgpack"
	formatJSON    = "json"
)

// decodeError reports a document that could not be decoded. It matches errMalformed with errors.Is.
type decodeError struct {
	// Format is formatMsgpack or formatJSON.
	Format string
	// Offset is the byte offset in the document of the value (or marker) at fault.
	Offset int
	// Field is the dotted path of the value being decoded ("scheduled_requests.num_prefill_requests",
	// array elements as "[i]"), or "" at the top level.
	Field string
	// Err describes the problem (for example "truncated str8").
	Err error
}

func (e *decodeError) Error() string {
	b := make([]byte, 0, 64)
	b = append(b, "schemas: "...)
	if e.Format == "" {
		b = append(b, formatMsgpack...)
	} else {
		b = append(b, e.Format...)
	}
	b = append(b, " at byte "...)
	b = strconv.AppendInt(b, int64(e.Offset), 10)
	if e.Field != "" {
		b = append(b, " (field "...)
		b = strconv.AppendQuote(b, e.Field)
		b = append(b, ')')
	}
	b = append(b, ": "...)
	if e.Err != nil {
		b = append(b, e.Err.Error()...)
	} else {
		b = append(b, "malformed"...)
	}
	return string(b)
}

// Unwrap returns the detailed cause.
func (e *decodeError) Unwrap() error { return e.Err }

// Is reports whether target is errMalformed.
func (e *decodeError) Is(target error) bool { return target == errMalformed }

// validationError reports a well-formed FPM that breaks a rule. It matches ErrInvalid with errors.Is.
type validationError struct {
	// Field is the dotted path of the offending field, for example "scheduled_requests.num_prefill_requests".
	Field string
	// Reason says what is wrong: "missing", "negative integer -1", "not finite (NaN)",
	// "unsupported version 2, want 1", "not a string (got integer)", ...
	Reason string
}

func (e *validationError) Error() string {
	return "schemas: invalid FPM: " + e.Field + ": " + e.Reason
}

// Unwrap returns ErrInvalid.
func (e *validationError) Unwrap() error { return ErrInvalid }

// Is reports whether target is ErrInvalid.
func (e *validationError) Is(target error) bool { return target == ErrInvalid }

// traceLineError reports an unacceptable dynamo.fpm.trace.v1 line. It matches ErrInvalidTraceLine with
// errors.Is, and unwraps to the *decodeError (errMalformed) or *validationError (ErrInvalid) behind it.
type traceLineError struct {
	// Field is the dotted path in the line, for example "event.capture_mode" or
	// "event.fpm.scheduled_requests.num_prefill_requests"; "" for the line as a whole.
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the underlying decode or validation error, or nil.
	Err error
}

func (e *traceLineError) Error() string {
	s := "schemas: invalid trace line: "
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Reason
}

// Unwrap returns the underlying error, or nil.
func (e *traceLineError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalidTraceLine.
func (e *traceLineError) Is(target error) bool { return target == ErrInvalidTraceLine }
