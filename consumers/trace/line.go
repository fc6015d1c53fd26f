package trace

import "github.com/fpmbus/fpmbus/tracefile"

// delivery is one message as the writer sees it: what it reads, and how it says the message is done
// (its line, or the line that replaces it, is durable) or can never be written. *durable.Msg is one;
// a backfill's replayed messages have nothing to settle.
type delivery interface {
	tracefile.Message
	Done()
	Reject(reason error)
}

// record is one message of the FPM stream, checked and ready to become a trace line
// (tracefile.Record), and the delivery that settles it.
type record struct {
	tracefile.Record
	d delivery
}

// parseRecord checks d as tracefile.ParseRecord does (the rule by which `fpmbus trace verify` files
// stream messages too) and keeps d to settle it. An error means the message can never be written (bad
// subject or body): the caller rejects it.
func parseRecord(d delivery, md tracefile.MsgMeta, producerOverride string, keys tracefile.SubjectKeys) (record, error) {
	r, err := tracefile.ParseRecord(d, md, producerOverride, keys)
	return record{Record: r, d: d}, err
}
