package natsconn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
)

// ErrRefused is the cause of a context RefusalContext cancelled: the server refused a subject this
// user's permissions do not allow. A refused request gets no answer at all, so without it an operation
// would wait for its whole timeout to fail.
var ErrRefused = errors.New("streams: the server refused a subject this user may not use")

// refusals are the watchers of permission refusals, per connection made by Connect (its error handler
// calls notifyRefusal).
var refusals = struct {
	sync.Mutex
	by map[*nats.Conn]map[*refusalWatch]struct{}
}{by: map[*nats.Conn]map[*refusalWatch]struct{}{}}

type refusalWatch struct{ cancel context.CancelCauseFunc }

// RefusalContext returns a context that is cancelled, with a cause wrapping ErrRefused and naming the
// refusal, as soon as the server refuses nc a subject while the context lives: an operation run with
// it fails at once instead of at its timeout. The refusal need not be the operation's own (another
// goroutine's on the same connection ends it too); use it where a refusal means the operation cannot
// succeed either. Call cancel when done.
func RefusalContext(ctx context.Context, nc *nats.Conn) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	w := &refusalWatch{cancel: cancel}
	refusals.Lock()
	if refusals.by[nc] == nil {
		refusals.by[nc] = map[*refusalWatch]struct{}{}
	}
	refusals.by[nc][w] = struct{}{}
	refusals.Unlock()
	return cctx, func() {
		refusals.Lock()
		delete(refusals.by[nc], w)
		if len(refusals.by[nc]) == 0 {
			delete(refusals.by, nc)
		}
		refusals.Unlock()
		cancel(nil)
	}
}

// notifyRefusal cancels every RefusalContext of nc with err.
func notifyRefusal(nc *nats.Conn, err error) {
	refusals.Lock()
	defer refusals.Unlock()
	for w := range refusals.by[nc] {
		w.cancel(fmt.Errorf("%w: %v", ErrRefused, err))
	}
}
