// Package invalid formats the errors of configuration checks. A check in fpmbus reports the first
// problem it finds as one error that names the setting and what is wrong with it, and wraps its
// package's sentinel (ErrInvalidConfig, ErrInvalidPlan, …), so that callers tell a bad configuration
// from a failure with errors.Is. A value refused on the command line (a flag, its variable, an argument
// file) is a FlagError instead, whose text is only what names the value: the command reports it as a
// usage error (exit status 2).
package invalid

import "fmt"

// Reporter returns the function a check reports a problem with: the error reads
// "<sentinel>: <format applied to args>" and wraps sentinel (and any %w operand of args).
func Reporter(sentinel error) func(format string, args ...any) error {
	return func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
	}
}

// FlagError is a command-line setting refused before anything runs. Its text names the flag, variable
// or file the value came from, and no sentinel: the command reports it as one of its usage errors.
type FlagError struct{ err error }

func (e *FlagError) Error() string { return e.err.Error() }

func (e *FlagError) Unwrap() error { return e.err }

// Flagf returns the FlagError "<format applied to args>" (wrapping any %w operand of args).
func Flagf(format string, args ...any) error { return &FlagError{fmt.Errorf(format, args...)} }
