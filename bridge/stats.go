package bridge

import "sync/atomic"

// stats is a snapshot of a bridge's counters. Once the bridge has stopped, for every rank
// Received == Published + Dropped + Invalid and Invalid == DeadLettered + DeadLettersLost.
type stats struct {
	// Ranks holds the counters of each endpoint, keyed by Endpoint.DPRank.
	Ranks map[int]RankStats
	// Buffered is the number of messages in the buffer now; BufferedHigh the most it ever held (never
	// above Config.MaxBuffer).
	Buffered     int
	BufferedHigh int
	// InFlight is the number of publishes awaiting an ack now (never above Config.MaxInFlight).
	InFlight int
	// MarkersPublished counts drop markers acknowledged on FPM_EVENTS.
	MarkersPublished uint64
}

// RankStats are the counters of one endpoint (one DP rank).
type RankStats struct {
	Received        uint64 // multiparts received, valid or not
	Published       uint64 // FPMs acknowledged by JetStream (duplicates included)
	Invalid         uint64 // multiparts that are not a valid FPM (each becomes a dead letter)
	DeadLettered    uint64 // dead letters acknowledged on FPM_EVENTS
	DeadLettersLost uint64 // dead letters dropped (buffer full, shutdown or rejected)
	Dropped         uint64 // valid FPMs dropped; each is covered by a drop marker
	Duplicates      uint64 // acks that reported a duplicate (a retry of a stored message)
	SeqMismatches   uint64 // FPMs whose counter_id differs from the sequence frame
	// OversizedFrames counts frames libzmq refused unread for being larger than Config.MaxPayload; each
	// is also counted in Received and Invalid (stage size) and has a dead letter.
	OversizedFrames uint64
}

// Total sums the counters of every rank.
func (s stats) Total() RankStats {
	var t RankStats
	for _, r := range s.Ranks {
		t.Received += r.Received
		t.Published += r.Published
		t.Invalid += r.Invalid
		t.DeadLettered += r.DeadLettered
		t.DeadLettersLost += r.DeadLettersLost
		t.Dropped += r.Dropped
		t.Duplicates += r.Duplicates
		t.SeqMismatches += r.SeqMismatches
		t.OversizedFrames += r.OversizedFrames
	}
	return t
}

// rankCounters are the live counters of one endpoint: atomics for Stats, Prometheus children for
// metrics. Any goroutine may update them.
type rankCounters struct {
	received, published, invalid, deadLettered, deadLettersLost atomic.Uint64
	dropped, duplicates, seqMismatches, oversized               atomic.Uint64
	m                                                           rankMetrics
}

func (c *rankCounters) countReceived() { c.received.Add(1); c.m.received.Inc() }

func (c *rankCounters) countInvalid(stage string) { c.invalid.Add(1); c.m.invalid[stage].Inc() }

func (c *rankCounters) countOversized() { c.oversized.Add(1); c.m.oversized.Inc() }

func (c *rankCounters) countSeqMismatch() { c.seqMismatches.Add(1); c.m.seqMismatch.Inc() }

func (c *rankCounters) countDropped(reason string) { c.dropped.Add(1); c.m.dropped[reason].Inc() }

func (c *rankCounters) countDeadLetterLost(reason string) {
	c.deadLettersLost.Add(1)
	c.m.dlLost[reason].Inc()
}

func (c *rankCounters) countDeadLettered() { c.deadLettered.Add(1); c.m.deadLetters.Inc() }

func (c *rankCounters) countPublished(duplicate bool) {
	c.published.Add(1)
	c.m.published.Inc()
	if duplicate {
		c.duplicates.Add(1)
		c.m.duplicates.Inc()
	}
}

func (c *rankCounters) snapshot() RankStats {
	return RankStats{
		Received:        c.received.Load(),
		Published:       c.published.Load(),
		Invalid:         c.invalid.Load(),
		DeadLettered:    c.deadLettered.Load(),
		DeadLettersLost: c.deadLettersLost.Load(),
		Dropped:         c.dropped.Load(),
		Duplicates:      c.duplicates.Load(),
		SeqMismatches:   c.seqMismatches.Load(),
		OversizedFrames: c.oversized.Load(),
	}
}
