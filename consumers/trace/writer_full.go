package trace

// Full mode (DYN_FPM_MODE=full): every valid message, idle heartbeats included, becomes one line in its
// producer's segments, in the order the consumer receives them. The message is acked once that line is
// durable.

// handleFull writes r's line and queues its ack behind that line.
func (w *Writer) handleFull(r *record) error {
	p, err := w.producerFor(r.producer)
	if err != nil {
		return err
	}
	if err := w.write(p, r); err != nil {
		return err
	}
	p.pending = append(p.pending, pendingAck{msg: r.msg, seq: p.sw.Appended(), sseq: r.seq})
	return w.account(p, 1)
}
