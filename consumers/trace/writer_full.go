package trace

// Full mode (DYN_FPM_MODE=full): every valid message, idle heartbeats included, becomes one line in its
// producer's segments, in stream order. The message is done once that line is durable.

// handleFull writes r's line and queues its Done behind that line.
func (w *writer) handleFull(r *record) error {
	p, err := w.producerFor(r.Producer)
	if err != nil {
		return err
	}
	if err := w.write(p, r); err != nil {
		return err
	}
	p.pending = append(p.pending, pendingDone{d: r.d, line: p.sw.Appended()})
	return w.account(p, 1)
}
