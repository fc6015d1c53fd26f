package schemas

// fpmFieldKind is what one field of an FPM holds, by the FPM rules.
type fpmFieldKind uint8

// Field kinds of FPMLayout.
const (
	// FPMVersionField is the integer FPMVersion.
	FPMVersionField fpmFieldKind = iota + 1
	// FPMStringField is a string (worker_id).
	FPMStringField
	// FPMCountField is an integer >= 0 that fits an int64 (dp_rank, counter_id, request counts).
	FPMCountField
	// FPMNumberField is a finite number >= 0 (wall_time, the variances).
	FPMNumberField
	// FPMRequestsField is a request map (scheduled_requests, queued_requests); FPMField.Fields lists it.
	FPMRequestsField
)

// FPMField is one field of an FPM in FPMLayout.
type FPMField struct {
	Name   string
	Kind   fpmFieldKind
	Fields []FPMField // the request map's fields, for FPMRequestsField
}

// FPMLayout returns the fields of Dynamo's ForwardPassMetrics in their canonical order: msgspec's
// encoding order, which the canonical JSON of a payload keeps. This order is defined once, here
// (topFields, scheduledFields, queuedFields); a consumer that recognises the bridge's canonical JSON
// by its shape builds its expectation from FPMLayout rather than spelling the fields again. The
// result is a fresh copy the caller may keep.
func FPMLayout() []FPMField {
	top := make([]FPMField, len(topFields))
	for i, name := range topFields {
		f := FPMField{Name: name}
		switch i {
		case topVersion:
			f.Kind = FPMVersionField
		case topWorkerID:
			f.Kind = FPMStringField
		case topDPRank, topCounterID:
			f.Kind = FPMCountField
		case topWallTime:
			f.Kind = FPMNumberField
		case topScheduled:
			f.Kind, f.Fields = FPMRequestsField, requestLayout(scheduledFields[:], scheduledFloats)
		case topQueued:
			f.Kind, f.Fields = FPMRequestsField, requestLayout(queuedFields[:], queuedFloats)
		}
		top[i] = f
	}
	return top
}

// requestLayout describes a request map's fields; floats is the mask of its number fields.
func requestLayout(names []string, floats uint) []FPMField {
	out := make([]FPMField, len(names))
	for i, name := range names {
		out[i] = FPMField{Name: name, Kind: FPMCountField}
		if floats&(1<<i) != 0 {
			out[i].Kind = FPMNumberField
		}
	}
	return out
}
