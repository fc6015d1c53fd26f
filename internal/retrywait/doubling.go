package retrywait

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Doubling returns waits of first, 2×first, 4×first, … up to limit, then limit for good. NextBackOff
// gives the next wait and Reset starts again at first.
func Doubling(first, limit time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(first),
		backoff.WithMaxInterval(limit),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0),
		backoff.WithMaxElapsedTime(0),
	)
}
