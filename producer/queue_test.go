package producer

import (
	"reflect"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

// TestQueueFullDropsSilently runs a rank's generator with nobody draining its queue: the queue keeps the
// oldest FPMs and every later one is counted as a queue drop, as Dynamo's queue.Full branch does.
func TestQueueFullDropsSilently(t *testing.T) {
	r := &rank{engine: NewEngine(1, "w", 0), queue: make(chan schemas.FPM, 5)}
	quit := make(chan struct{})
	r.generate(quit, Config{Count: 50})
	if g, d := r.generated.Load(), r.queueDrops.Load(); g != 50 || d != 45 {
		t.Fatalf("generated %d, queue drops %d; want 50 and 45", g, d)
	}
	want := NewEngine(1, "w", 0)
	for i := range 5 {
		got := <-r.queue
		w, ok := want.Step()
		for !ok { // skip empty batches, as generate does
			w, ok = want.Step()
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("queued FPM %d = %+v, want %+v", i, got, w)
		}
	}
}
