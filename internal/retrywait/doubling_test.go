package retrywait_test

import (
	"slices"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// The waits double from the first up to the limit, exactly, and never stop; Reset starts over; a first
// wait above the limit is waited once.
func TestDoubling(t *testing.T) {
	next := func(b interface{ NextBackOff() time.Duration }, n int) []time.Duration {
		var out []time.Duration
		for range n {
			out = append(out, b.NextBackOff())
		}
		return out
	}
	ms := time.Millisecond
	b := retrywait.Doubling(100*ms, 2*time.Second)
	if got, want := next(b, 7), []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	b.Reset()
	if got := b.NextBackOff(); got != 100*ms {
		t.Fatalf("after Reset: %v, want 100ms", got)
	}
	if got, want := next(retrywait.Doubling(5*time.Second, 2*time.Second), 3), []time.Duration{5 * time.Second, 2 * time.Second, 2 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("first above the limit: %v, want %v", got, want)
	}
	if got, want := next(retrywait.Doubling(1500*ms, 2*time.Second), 3), []time.Duration{1500 * ms, 2 * time.Second, 2 * time.Second}; !slices.Equal(got, want) {
		t.Fatalf("first above half the limit: %v, want %v", got, want)
	}
}
