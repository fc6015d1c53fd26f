// Package invalid formats the errors of configuration checks. A check in fpmbus reports the first
// problem it finds as one error that names the setting and what is wrong with it, and wraps its
// package's sentinel (ErrInvalidConfig, ErrInvalidPlan, …), so that callers tell a bad configuration
// from a failure with errors.Is.
package invalid

import "fmt"

// Reporter returns the function a check reports a problem with: the error reads
// "<sentinel>: <format applied to args>" and wraps sentinel (and any %w operand of args).
func Reporter(sentinel error) func(format string, args ...any) error {
	return func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
	}
}
