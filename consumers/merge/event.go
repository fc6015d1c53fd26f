package merge

// Event types of the merger's events on fpmevents.bench.<run>.* (header Fpm-Event, and Event.Event).
const (
	EventMerged     = "bench_merged"
	EventRejected   = "bench_rejected"
	eventIncomplete = "bench_incomplete"
	eventConflict   = "bench_conflict"
)
