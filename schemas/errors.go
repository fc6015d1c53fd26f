package schemas

import (
	"errors"
	"strconv"
)

// Sentinel errors. Every error returned by this package wraps exactly one of them; match with errors.Is,
// and use errors.As with *DecodeError, *ValidationError or *TraceLineError to learn the field.
var (
	// ErrMalformed: the bytes are not a well-formed document of the expected format (msgpack for
	// DecodeFPM, JSON for ParseFPMJSON and ParseTraceLine): truncated, trailing bytes, reserved marker,
	// invalid UTF-8, too deep, a non-string map key, a duplicate key, or a top-level value that is not a
	// map. Returned as a *DecodeError.
	ErrMalformed = errors.New("schemas: malformed msgpack")
	// ErrInvalid: the document is well-formed but breaks the FPM rules of Dynamo's trace validator
	// (lib/llm/src/fpm_trace/sink.rs). Returned as a *ValidationError.
	ErrInvalid = errors.New("schemas: invalid FPM")
	// ErrInvalidTraceLine: a dynamo.fpm.trace.v1 line is not acceptable. Returned as a *TraceLineError,
	// which also wraps the *DecodeError or *ValidationError behind it, if any.
	ErrInvalidTraceLine = errors.New("schemas: invalid trace line")
)

// Format names used in DecodeError.Format.
const (
	FormatMsgpack = "msgpack"
	FormatJSON    = "json"
)

// DecodeError reports a document that could not be decoded. It matches ErrMalformed with errors.Is.
type DecodeError struct {
	// Format is FormatMsgpack or FormatJSON.
	Format string
	// Offset is the byte offset in the document of the value (or marker) at fault.
	Offset int
	// Field is the dotted path of the value being decoded ("scheduled_requests.num_prefill_requests",
	// array elements as "[i]"), or "" at the top level.
	Field string
	// Err describes the problem (for example "truncated str8").
	Err error
}

func (e *DecodeError) Error() string {
	b := make([]byte, 0, 64)
	b = append(b, "schemas: "...)
	if e.Format == "" {
		b = append(b, FormatMsgpack...)
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
func (e *DecodeError) Unwrap() error { return e.Err }

// Is reports whether target is ErrMalformed.
func (e *DecodeError) Is(target error) bool { return target == ErrMalformed }

// ValidationError reports a well-formed FPM that breaks a rule. It matches ErrInvalid with errors.Is.
type ValidationError struct {
	// Field is the dotted path of the offending field, for example "scheduled_requests.num_prefill_requests".
	Field string
	// Reason says what is wrong: "missing", "negative integer -1", "not finite (NaN)",
	// "unsupported version 2, want 1", "not a string (got integer)", ...
	Reason string
}

func (e *ValidationError) Error() string {
	return "schemas: invalid FPM: " + e.Field + ": " + e.Reason
}

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// TraceLineError reports an unacceptable dynamo.fpm.trace.v1 line. It matches ErrInvalidTraceLine with
// errors.Is, and unwraps to the *DecodeError (ErrMalformed) or *ValidationError (ErrInvalid) behind it.
type TraceLineError struct {
	// Field is the dotted path in the line, for example "event.capture_mode" or
	// "event.fpm.scheduled_requests.num_prefill_requests"; "" for the line as a whole.
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the underlying decode or validation error, or nil.
	Err error
}

func (e *TraceLineError) Error() string {
	s := "schemas: invalid trace line: "
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Reason
}

// Unwrap returns the underlying error, or nil.
func (e *TraceLineError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalidTraceLine.
func (e *TraceLineError) Is(target error) bool { return target == ErrInvalidTraceLine }
