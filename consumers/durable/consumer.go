package durable

import (
	"context"
	"time"
)

// Consumer is what a pipeline stage implements. The runner calls every method from its loop goroutine,
// never two at once.
type Consumer interface {
	// Handle processes messages of one owned partition, in stream order (a batch of those already
	// waiting). For each it calls Msg.Done once the effect is durable, or Msg.Reject when the message
	// can never succeed; it may do so later, from any goroutine. An error ends the runner: it is for
	// faults of the instance (its disk, its connection), never for one message.
	Handle(ctx context.Context, batch []*Msg) error
	// Tick runs every Config.TickInterval (flush, sweep, stale checks). An error ends the runner.
	Tick(ctx context.Context, now time.Time) error
	// Close is called once, after every partition was released or lost, with the stop deadline in
	// ctx: flush what is still buffered, call Done for what became durable, close files.
	Close(ctx context.Context) error
}

// PartitionObserver is implemented by stages that keep state per partition.
type PartitionObserver interface {
	// Assigned is called when the runner takes partition p, before its first message: load the
	// partition's state. An error ends the runner.
	Assigned(ctx context.Context, p int) error
	// Release is called when partition p is handed on gracefully (rebalance, stop): make everything of
	// p handled so far durable and call its Done before returning; then forget p. What is not done when
	// it returns stays unacked and goes to the next owner. ctx carries the release deadline.
	Release(ctx context.Context, p int) error
	// Lost is called when partition p was lost abruptly (connection cut, pin lost, release deadline
	// passed): forget p without writing anything more, another instance may own it already.
	Lost(p int)
}

// ForgetOnHandover is the PartitionObserver of a stage that has nothing to write when a partition
// goes: all it holds of one is messages not done yet, which stay unacked and go to the next owner,
// who handles them again. It keeps no state per partition (Assigned does nothing), and a graceful
// (Release) and an abrupt (Lost) handover alike call Forget with the partition. A stage embeds it
// with Forget set.
type ForgetOnHandover struct {
	Forget func(p int)
}

var _ PartitionObserver = ForgetOnHandover{}

// Assigned does nothing: the stage keeps no state per partition.
func (ForgetOnHandover) Assigned(context.Context, int) error { return nil }

// Release forgets p: what it held goes, unacked, to the next owner.
func (f ForgetOnHandover) Release(_ context.Context, p int) error {
	f.Forget(p)
	return nil
}

// Lost forgets p.
func (f ForgetOnHandover) Lost(p int) { f.Forget(p) }
